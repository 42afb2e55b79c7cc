"""TRL SFT step time of a normalized model against the same-size plain Llama, under the same ``SFTConfig``.

Contenders, in one process, trained round-robin (the order rotated each repetition) for ``--steps`` steps per turn by
``trl.SFTTrainer`` with one ``SFTConfig``, the same tokenizer and the same data:

* ``plain_llama``: transformers' ``LlamaForCausalLM``, tied embeddings;
* ``normalized``: hf_tiednorm's ``TiedNormForCausalLM`` of the same sizes (a Llama body) with the normalized head
  (``--head_mode``, a learned per-token ``vector`` logit scale and a logit bias), which TRL's fused LM head scores
  through the folded linear layer (hf_tiednorm/modeling/head/scoring_guard.py);
* ``normalized_unguarded``: the same normalized model with the scoring guard's pre-hook removed from its backbone,
  for the guard's own cost per step.

A step's time is the wall time from the Trainer's ``on_step_begin`` to ``on_step_end`` (forward, backward, optimizer);
the first ``--warmup`` steps of each turn are dropped. Ratios (contender median / plain median) are taken inside a
repetition; the JSON holds every step time, the per-repetition ratios and their median [min, max]. The guard's work
per forward is also timed alone: the own forward's count on the backbone around the backbone's pre-hook.

    python experiments/benchmark_trl_sft.py --output results/benchmark_trl_sft.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import transformers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, TrainerCallback

import hf_tiednorm
from hf_tiednorm.modeling.head.scoring_guard import own_scoring

MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
TINY_SENTENCES = ["a dog runs on the grass .", "two men play music in the street .", "a woman reads a book ."]


class StepTimer(TrainerCallback):
    """Wall time of every optimizer step."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def on_step_begin(self, args, state, control, **kwargs):
        self.start = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.perf_counter() - self.start)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", default="results/benchmark_trl_sft.json")
    parser.add_argument("--train_file", default=str(MULTI30K / "train.en.gz"), help="text lines to train on")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--hidden_size", type=int, default=256)
    parser.add_argument("--intermediate_size", type=int, default=768)
    parser.add_argument("--num_hidden_layers", type=int, default=4)
    parser.add_argument("--num_attention_heads", type=int, default=4)
    parser.add_argument("--head_mode", default="cosine")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=12, help="timed steps per turn (after --warmup)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiny", action="store_true", help="a smoke test: tiny sizes, built-in sentences")
    parser.add_argument("--guard_only", action="store_true",
                        help="time only the scoring guard's work per forward (--reps rounds of 100,000 calls), no "
                             "training: run it with PYTHONPATH at a checkout of another commit to compare two guards")
    return parser.parse_args(argv)


def read_lines(path: str, limit: int) -> list[str]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [line.strip() for _, line in zip(range(limit), lines, strict=False) if line.strip()]


def train_tokenizer(lines: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special))
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def build_models(args, vocab_size: int) -> dict[str, torch.nn.Module]:
    sizes = dict(vocab_size=vocab_size, hidden_size=args.hidden_size, intermediate_size=args.intermediate_size,
                 num_hidden_layers=args.num_hidden_layers, num_attention_heads=args.num_attention_heads,
                 num_key_value_heads=args.num_attention_heads, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                 tie_word_embeddings=True)  # fmt: skip
    torch.manual_seed(0)
    plain = LlamaForCausalLM(LlamaConfig(**sizes))
    normalized, unguarded = (
        hf_tiednorm.TiedNormForCausalLM(hf_tiednorm.TiedNormCausalConfig(
            **sizes, head_mode=args.head_mode, logit_scale_kind="vector", logit_bias=True))
        for _ in range(2)
    )  # fmt: skip
    unguarded.base_model._forward_pre_hooks.clear()  # the scoring guard is the backbone's one pre-hook
    for hooks in (unguarded._forward_pre_hooks, unguarded._forward_hooks):  # and two of the model's count its calls
        for key in [key for key, hook in hooks.items() if "scoring_guard" in hook.__module__]:
            del hooks[key]
    return {"plain_llama": plain, "normalized": normalized, "normalized_unguarded": unguarded}


def guard_call_seconds(model, calls: int = 100_000) -> float:
    """Seconds per forward of the scoring guard's work: the model's hooks counting its call (before and after), the
    own forward's count on the backbone (``own_scoring``) around the backbone's pre-hook (which then reads one
    dictionary entry)."""
    backbone = model.base_model
    hooks = list(backbone._forward_pre_hooks.values())
    before = [hook for hook in model._forward_pre_hooks.values() if "scoring_guard" in hook.__module__]
    after = [hook for hook in model._forward_hooks.values() if "scoring_guard" in hook.__module__]

    def work(_model):
        for hook in before:
            hook(model, ())
        for hook in hooks:
            hook(backbone, ())
        for hook in after:
            hook(model, (), None)

    guarded = own_scoring(work)
    bare = lambda _model: [None for _ in [*before, *hooks, *after]]  # noqa: E731  the same loop without the guard
    seconds = {}
    for name, call in (("bare", bare), ("guarded", guarded)):
        start = time.perf_counter()
        for _ in range(calls):
            call(model)
        seconds[name] = (time.perf_counter() - start) / calls
    return seconds["guarded"] - seconds["bare"]


def guard_only(args) -> dict:
    """The scoring guard's work per forward alone, ``--reps`` rounds, with the commit of the hf_tiednorm imported."""
    from hf_tiednorm.training.precision import cpu_description

    model = build_models(args, args.vocab_size)["normalized"]
    rounds = [guard_call_seconds(model) for _ in range(args.reps)]
    result = {"benchmark": "the scoring guard's work per forward (guard_call_seconds)", "cpu": cpu_description(),
              "hf_tiednorm": str(Path(hf_tiednorm.__file__).parent), "seconds_per_call": rounds,
              "median_seconds_per_call": statistics.median(rounds)}  # fmt: skip
    print(f"scoring guard ({result['hf_tiednorm']}): {result['median_seconds_per_call'] * 1e6:.2f} us per call, "
          f"median of {args.reps}")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.guard_only:
        return guard_only(args)
    import trl
    from datasets import Dataset

    from hf_tiednorm.training.precision import cpu_description

    if args.tiny:
        args.vocab_size, args.hidden_size, args.intermediate_size, args.num_hidden_layers = 64, 16, 32, 1
        args.num_attention_heads, args.steps, args.warmup, args.reps, args.batch_size = 2, 2, 1, 1, 2
        lines = TINY_SENTENCES * 20
    else:
        lines = read_lines(args.train_file, 20_000)
    torch.set_num_threads(args.threads)
    tokenizer = train_tokenizer(lines, args.vocab_size)
    models = build_models(args, len(tokenizer))
    data = Dataset.from_dict({"text": lines[: args.batch_size * (args.steps + args.warmup) * 4]})
    timers, trainers = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for name, model in models.items():
            config = trl.SFTConfig(
                output_dir=f"{scratch}/{name}", max_steps=args.steps + args.warmup,
                per_device_train_batch_size=args.batch_size, max_length=args.max_length, learning_rate=1e-4,
                logging_steps=10_000, report_to="none", save_strategy="no", use_cpu=True, bf16=False, seed=0,
                dataloader_pin_memory=False, disable_tqdm=True,
            )  # fmt: skip
            timers[name] = []
            trainers[name] = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
        names = list(models)
        per_rep = []
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[: rep % len(names)]
            medians = {}
            for name in order:
                timer = StepTimer()
                trainers[name].add_callback(timer)
                trainers[name].train()
                trainers[name].remove_callback(timer)
                kept = timer.times[args.warmup:]
                timers[name].append(kept)
                medians[name] = statistics.median(kept)
            per_rep.append({name: medians[name] / medians["plain_llama"] for name in names})
    ratios = {
        name: {"median": statistics.median(r[name] for r in per_rep), "min": min(r[name] for r in per_rep),
               "max": max(r[name] for r in per_rep)}
        for name in names if name != "plain_llama"
    }  # fmt: skip
    guard_seconds = guard_call_seconds(models["normalized"])
    step_seconds = statistics.median(t for rep in timers["normalized"] for t in rep)
    result = {
        "benchmark": "TRL SFTTrainer step time, normalized head vs plain Llama, one process",
        "command": "python experiments/benchmark_trl_sft.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "cpu": cpu_description(), "threads": args.threads, "platform": platform.platform(),
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__, "trl": trl.__version__},
        "sizes": {"vocab_size": len(tokenizer), "hidden_size": args.hidden_size, "layers": args.num_hidden_layers,
                  "batch_size": args.batch_size, "max_length": args.max_length, "head_mode": args.head_mode},
        "step_seconds": timers, "ratio_to_plain_llama": ratios,
        "guard_check_seconds_per_call": guard_seconds,
        "guard_check_share_of_a_step": guard_seconds / step_seconds,
        "target": "normalized <= 1.10x plain_llama on CPU",
    }  # fmt: skip
    for name, ratio in ratios.items():
        print(f"{name}: {ratio['median']:.3f}x plain Llama [{ratio['min']:.3f}, {ratio['max']:.3f}]")
    print(f"scoring guard: {guard_seconds * 1e6:.2f} us per call, {guard_seconds / step_seconds:.1e} of a step")
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return result


if __name__ == "__main__":
    main()
