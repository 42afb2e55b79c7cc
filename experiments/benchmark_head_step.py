"""A whole training step's time with each head mode against the plain tied head, on the same loss path.

The model is what a user trains: a ``TiedNormForCausalLM`` (a Llama body, tied embeddings) saved once in fp32 and
loaded with ``from_pretrained(dtype=...)`` as users load it (bf16 weights with fp32 learned head terms, or fp32), one
per head mode; its body is small (``--layers``, one by default) so that the head, whose cost the mode changes, is
most of the step. A step is a forward with labels and a backward (no optimizer), in train mode, on ``--tokens``
tokens (sequences of ``--seq_len``), with ``config.loss_implementation`` set to each path of ``--loss_paths``
(``plain``: the materialized logits; ``fused``: what "fused" picks on this device, the chunked loop on a CPU).

Contenders ``<mode>:<path>``; the normalized modes carry ``--logit_scale_kind`` and ``--logit_bias``, ``baseline`` is
plain tying with neither. One process, round-robin: every repetition runs each contender once, the start rotated by
one each repetition, after ``--warmup`` untimed steps each. Ratios are per repetition, against ``baseline:<path>`` of
the same repetition (median, min–max): the normalized head's cost over the plain tied head's on the same loss path,
in wall time (``time_ratio``) and in the process's CPU time (``cpu_time_ratio``, ``time.process_time``: what other
processes on a busy machine change least).

    python experiments/benchmark_head_step.py --dtype float32,bfloat16 --tokens 256,1024 --reps 3 \\
        --output results/benchmark_head_step_cpu.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class Args:
    dtype: str = field(default="float32,bfloat16", metadata={"help": "comma-separated dtypes the model is loaded in"})
    tokens: str = field(default="256,1024", metadata={"help": "comma-separated tokens per step"})
    seq_len: int = field(default=256, metadata={"help": "tokens per sequence (batch = tokens / seq_len, at least 1)"})
    head_modes: str = field(default="baseline,cosine,distance", metadata={"help": "comma-separated head modes"})
    loss_paths: str = field(default="plain,fused", metadata={"help": "comma-separated loss_implementation values"})
    logit_scale_kind: str = field(default="vector", metadata={"help": "logit scale of the normalized modes"})
    logit_bias: bool = field(default=True, metadata={"help": "a learned logit bias on the normalized modes"})
    vocab: int = field(default=32000, metadata={"help": "vocabulary size V"})
    hidden: int = field(default=512, metadata={"help": "hidden size d"})
    layers: int = field(default=1, metadata={"help": "decoder layers of the body"})
    intermediate: int = field(default=1408, metadata={"help": "MLP width of the body"})
    heads: int = field(default=8, metadata={"help": "attention heads of the body"})
    reps: int = field(default=3, metadata={"help": "round-robin repetitions"})
    warmup: int = field(default=1, metadata={"help": "untimed steps per contender before the repetitions"})
    threads: int = field(default=0, metadata={"help": "torch threads; 0 = torch's default"})
    keep_freed_cpu_memory: bool = field(
        default=True, metadata={"help": "keep freed CPU memory in the process, as the training scripts do"}
    )
    output: str = field(default="results/benchmark_head_step_cpu.json", metadata={"help": "JSON written here"})


def save_models(args: Args, folder: Path) -> dict[str, Path]:
    """One fp32 model per head mode, the same seed for every mode, saved as a user's folder: {mode: folder}."""
    import torch

    from hf_tiednorm import TiedNormCausalConfig, TiedNormForCausalLM

    folders = {}
    for mode in args.head_modes.split(","):
        normalized = mode != "baseline"
        config = TiedNormCausalConfig(
            vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.intermediate,
            num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.heads,
            max_position_embeddings=max(args.seq_len, 16), tie_word_embeddings=True, head_mode=mode,
            logit_scale_kind=args.logit_scale_kind if normalized else "none", logit_bias=args.logit_bias and normalized,
        )  # fmt: skip
        torch.manual_seed(0)
        model = TiedNormForCausalLM(config)
        with torch.no_grad():  # learned terms away from their start, so that their gradients are not trivial
            head = model.get_output_embeddings()
            if head.logit_scale is not None:
                head.logit_scale.uniform_(0.5, 2.0)
            if head.logit_bias is not None:
                head.logit_bias.normal_(0, 0.3)
        folders[mode] = folder / mode
        model.save_pretrained(folders[mode])
    return folders


def step(model, batch: dict, path: str) -> float:
    """One forward with labels + backward on ``path``; returns the loss."""
    model.config.loss_implementation = path
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    return float(loss.detach())


def main() -> None:
    import torch
    from transformers import HfArgumentParser

    from hf_tiednorm import TiedNormForCausalLM
    from hf_tiednorm.training.cpu_memory import keep_freed_memory
    from hf_tiednorm.training.precision import cpu_description

    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    if args.threads:
        torch.set_num_threads(args.threads)
    cpu_memory = keep_freed_memory() if args.keep_freed_cpu_memory else "allocator defaults"
    report = {
        "args": asdict(args),
        "device": cpu_description(),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "cpu_memory": cpu_memory},
        "method": "one process, round-robin over the contenders (start rotated each repetition); a step = forward "
        "with labels + backward of a model loaded by from_pretrained(dtype=...); ratios per repetition against "
        "baseline:<path> of the same repetition, in wall time and in the process's CPU time",
        "results": {},
    }  # fmt: skip
    paths = args.loss_paths.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        folders = save_models(args, Path(tmp))
        for dtype_name in args.dtype.split(","):
            dtype = getattr(torch, dtype_name)
            models = {mode: TiedNormForCausalLM.from_pretrained(folder, dtype=dtype).train()
                      for mode, folder in folders.items()}  # fmt: skip
            for tokens in (int(t) for t in args.tokens.split(",")):
                seq_len = min(args.seq_len, tokens)
                generator = torch.Generator().manual_seed(1)
                ids = torch.randint(1, args.vocab, (max(1, tokens // seq_len), seq_len), generator=generator)
                batch = {"input_ids": ids, "labels": ids.clone()}
                names = [f"{mode}:{path}" for mode in models for path in paths]
                for name in names:
                    for _ in range(args.warmup):
                        step(models[name.split(":")[0]], batch, name.split(":")[1])
                runs = {name: [] for name in names}
                for rep in range(args.reps):
                    order = names[rep % len(names):] + names[:rep % len(names)]
                    for name in order:
                        mode, path = name.split(":")
                        start, cpu_start = time.perf_counter(), time.process_time()
                        loss = step(models[mode], batch, path)
                        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
                        runs[name].append({"time_s": seconds, "cpu_time_s": cpu_seconds, "loss": loss})
                        print(f"{dtype_name} N={tokens} rep {rep} {name:18s} {seconds:.3f} s", flush=True)
                table = {}
                for name, got in runs.items():
                    base = runs[f"baseline:{name.split(':')[1]}"]
                    table[name] = {"loss": got[-1]["loss"]}
                    for key in ("time_s", "cpu_time_s"):
                        table[name][key] = _summary([g[key] for g in got])
                        table[name][f"{key[:-2]}_ratio"] = _summary([g[key] / b[key] for g, b in zip(got, base)])
                    r, c = table[name]["time_ratio"], table[name]["cpu_time_ratio"]
                    print(f"{dtype_name} N={tokens} {name:18s} x{r['median']:.3f} [{r['min']:.3f}-{r['max']:.3f}] "
                          f"of baseline (cpu x{c['median']:.3f} [{c['min']:.3f}-{c['max']:.3f}]), "
                          f"{table[name]['time_s']['median']:.3f} s", flush=True)  # fmt: skip
                report["results"][f"{dtype_name}:N={tokens}"] = table
            del models
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(f"wrote {output}")


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


if __name__ == "__main__":
    main()
