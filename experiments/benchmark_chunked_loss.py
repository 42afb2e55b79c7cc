"""Peak memory and time of the normalized head's loss + backward: plain path vs chunked
(hf_tiednorm/modeling/loss/chunked.py).

Memory method (CPU, no allocator statistics exist there): every repetition of every contender runs in a fresh
subprocess, interleaved (plain, chunked, plain, chunked, ...) so both see the same machine load. In the child the
inputs (hidden states, W, labels) are built, one warm-up iteration runs, then the kernel's peak-RSS mark is reset
(``echo 5 > /proc/self/clear_refs``), the resident set is read (``VmRSS``), one iteration of loss + backward runs,
and ``VmHWM − VmRSS_before`` is the peak memory that the loss + backward added on top of its inputs (gradients of
hidden and W included). The child runs with ``MALLOC_MMAP_THRESHOLD_=131072``, so glibc mmaps every large block
and unmaps it on free: the resident set tracks the live tensors.
Time: the same child times ``--iters`` further iterations (median). Ratios are chunked / plain per repetition,
reported as median and min–max over repetitions.

    python experiments/benchmark_chunked_loss.py --vocab 32000 --dim 512 --tokens 8192 --chunk_size 1024 \
        --output results/benchmark_chunked_loss.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from transformers import HfArgumentParser


@dataclass
class Args:
    vocab: int = field(default=32000, metadata={"help": "vocabulary size V"})
    dim: int = field(default=512, metadata={"help": "hidden size d"})
    tokens: int = field(default=8192, metadata={"help": "tokens N in the batch"})
    chunk_size: int = field(default=1024, metadata={"help": "loss_chunk_size of the chunked contender"})
    head_modes: str = field(default="cosine", metadata={"help": "comma-separated head modes"})
    logit_scale_kind: str = field(default="scalar", metadata={"help": "logit scale of the head"})
    label_smoothing: float = field(default=0.1, metadata={"help": "label smoothing of both losses"})
    strategies: str = field(default="fused", metadata={"help": "chunked contenders: fused (the chunked loss's one)"})
    reps: int = field(default=3, metadata={"help": "interleaved repetitions (one subprocess each)"})
    iters: int = field(default=1, metadata={"help": "timed iterations per subprocess (after the memory one)"})
    threads: int = field(default=0, metadata={"help": "torch threads in the child; 0 = torch's default"})
    output: str = field(default="results/benchmark_chunked_loss.json", metadata={"help": "JSON written here"})
    child: str = field(default="", metadata={"help": "internal: run one contender and print JSON"})


def status_kib(name: str) -> int:
    """A ``name:`` line of /proc/self/status (``VmRSS``, ``VmHWM``) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(name + ":"):
                return int(line.split()[1])
    raise KeyError(name)


def run_child(args: Args) -> dict:
    import torch

    from hf_tiednorm import HeadSettings, TiedNormHead
    from hf_tiednorm.modeling.loss.head_loss import chunked_head_cross_entropy
    from hf_tiednorm.modeling.loss.token import token_cross_entropy

    if args.threads:
        torch.set_num_threads(args.threads)
    mode, contender = args.child.split(":")
    torch.manual_seed(0)
    settings = HeadSettings(head_mode=mode, logit_scale_kind=args.logit_scale_kind)
    head = TiedNormHead(args.dim, args.vocab, settings=settings)
    with torch.no_grad():
        head.weight.normal_(0, 0.02)
    hidden = torch.randn(args.tokens, args.dim).requires_grad_(True)
    labels = torch.randint(0, args.vocab, (args.tokens,))
    labels[:: 17] = -100  # some padding, as in a real batch

    def step():
        head.zero_grad(set_to_none=True)
        hidden.grad = None
        if contender == "plain":
            loss = token_cross_entropy(head(hidden), labels, args.label_smoothing)
        else:
            loss = chunked_head_cross_entropy(head, hidden, labels, args.chunk_size, args.label_smoothing)
        loss.backward()
        return loss.item()

    loss = step()  # warm-up (and grads allocated once, as in training)
    head.zero_grad(set_to_none=True)
    hidden.grad = None
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = status_kib("VmRSS")
    t0 = time.perf_counter()
    step()
    first = time.perf_counter() - t0
    peak = status_kib("VmHWM") - before
    times = [first]
    for _ in range(args.iters):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    return {"peak_mib": peak / 1024, "time_s": statistics.median(times), "times_s": times, "loss": loss}


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    if args.child:
        print("RESULT " + json.dumps(run_child(args)))
        return
    modes = args.head_modes.split(",")
    contenders = ["plain"] + [f"chunked-{s}" for s in args.strategies.split(",")]
    runs: dict[str, list[dict]] = {f"{m}:{c}": [] for m in modes for c in contenders}
    for rep in range(args.reps):
        for key in runs:  # interleaved: every contender once per repetition
            cmd = [sys.executable, __file__, "--child", key]
            for name, value in asdict(args).items():
                if name not in ("child", "output"):
                    cmd += [f"--{name}", str(value)]
            # A fixed mmap threshold (it is dynamic by default) makes glibc mmap every block >= 128 KiB and unmap it
            # on free, so the resident set follows the live tensors and VmHWM is their peak.
            env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072"}
            out = subprocess.run(
                cmd, capture_output=True, text=True, check=True, cwd=Path(__file__).parents[1], env=env
            )
            result = json.loads(out.stdout.split("RESULT ", 1)[1])
            runs[key].append(result)
            print(f"rep {rep} {key:28s} peak {result['peak_mib']:8.1f} MiB  time {result['time_s']:.3f} s", flush=True)
    report = {
        "args": asdict(args),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "processor": platform.processor()},
        "method": "fresh subprocess per repetition and contender, interleaved; peak = VmHWM - VmRSS before the "
        "iteration (after resetting VmHWM via /proc/self/clear_refs); time = median of the timed iterations",
        "runs": runs,
        "ratios": {},
    }
    for mode in modes:
        plain = runs[f"{mode}:plain"]
        for c in contenders[1:]:
            got = runs[f"{mode}:{c}"]
            mem = [g["peak_mib"] / p["peak_mib"] for g, p in zip(got, plain)]
            tim = [g["time_s"] / p["time_s"] for g, p in zip(got, plain)]
            report["ratios"][f"{mode}:{c}"] = {
                "peak_memory_ratio": _summary(mem),
                "time_ratio": _summary(tim),
                "plain_peak_mib": _summary([p["peak_mib"] for p in plain]),
                "chunked_peak_mib": _summary([g["peak_mib"] for g in got]),
                "plain_time_s": _summary([p["time_s"] for p in plain]),
                "chunked_time_s": _summary([g["time_s"] for g in got]),
                "memory_target_met": statistics.median(mem) <= 0.3,
                "time_target_met": statistics.median(tim) <= 1.10,
            }
            r = report["ratios"][f"{mode}:{c}"]
            print(
                f"{mode:9s} {c:18s} memory x{r['peak_memory_ratio']['median']:.3f} "
                f"[{r['peak_memory_ratio']['min']:.3f}-{r['peak_memory_ratio']['max']:.3f}] (target <= 0.3)  "
                f"time x{r['time_ratio']['median']:.3f} [{r['time_ratio']['min']:.3f}-{r['time_ratio']['max']:.3f}] "
                f"(target <= 1.10)"
            )
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
