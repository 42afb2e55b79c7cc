"""Time and peak memory of the head's loss + backward against the plain path, at LLM scale (issue 39).

Contenders, all on the same hidden states (N, d), weight W (V, d) and labels, loss + backward (gradients of the
hidden states, W and the head's learned terms):

* ``plain``: ``F.cross_entropy(F.linear(h, W).float(), y)``, what transformers does for a tied head (the reference);
* ``<mode>:plain``: our head's plain path (``TiedNormHead.forward`` + ``token_cross_entropy``);
* ``<mode>:fused``: what ``loss_implementation="fused"`` picks on this device (liger-kernel on CUDA where installed,
  torch's ``F.linear_cross_entropy`` where exact, else the chunked loop), on the folded weight;
* ``<mode>:chunked`` / ``<mode>:torch`` (``--paths``): one fused path by name;
* ``<mode>:fold`` (``--paths``): no loss, the head's own O(V·d) work alone (its folded weight and bias forward, and
  their backward from a given gradient): what a mode adds to any loss path, measurable where the matmuls are slow.

One process, round-robin: every repetition runs each contender once, in turn, so all see the same machine load; the
ratios are per repetition against the ``plain`` run of the same repetition (median, min–max), and for each
``<mode>:<path>`` also against ``baseline:<path>`` (``time_ratio_to_baseline``: the normalized head's cost over the
plain tied head's on the same loss path), in wall time and in the process's CPU time (``cpu_time_ratio_to_baseline``,
``time.process_time``: what other processes on a busy machine change least). Peak memory is what
one loss + backward adds above its inputs: on CUDA ``torch.cuda.max_memory_allocated`` after a reset; on the CPU
(no allocator statistics) the kernel's resident-set high-water mark (``VmHWM``, reset through
``/proc/self/clear_refs``) minus the resident set before, with glibc told to mmap every block ≥ 128 KiB
(``mallopt(M_MMAP_THRESHOLD, 131072)``, what ``MALLOC_MMAP_THRESHOLD_=131072`` sets at start) so that the
resident set follows the live tensors.

    # GPU (to be measured): the issue's sizes
    python experiments/benchmark_lm_head_loss.py --device cuda --dtype bfloat16 --vocab 128256 --dim 2048 \\
        --tokens 8192,32768    # -> results/benchmark_lm_head_loss_cuda.json
    # CPU, a size CI can afford (docs/benchmarks.md)
    python experiments/benchmark_lm_head_loss.py --device cpu --dtype float32,bfloat16 --vocab 32000 --dim 512 \\
        --tokens 8192 --output results/benchmark_lm_head_loss_cpu.json
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from benchmark_chunked_loss import status_kib  # this folder: the /proc/self/status reader

_MMAP_ENV = "MALLOC_MMAP_THRESHOLD_"
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter that the variable above sets at process start


def mmap_large_blocks() -> bool:
    """Make glibc mmap (and unmap on free) every block of 128 KiB or more, so that the resident set follows the live
    tensors and VmHWM - VmRSS measures a step's peak on the CPU: ``mallopt(M_MMAP_THRESHOLD, 131072)``, which is what
    ``MALLOC_MMAP_THRESHOLD_=131072`` does at start, set in this process (no re-execution: ``main()`` also runs
    in-process, e.g. for its ``--help`` in the docs tests). Returns False where the C library has no mallopt."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(_M_MMAP_THRESHOLD, 131072))
    except (OSError, AttributeError):
        return False


@dataclass
class Args:
    device: str = field(default="cpu", metadata={"help": "cpu or cuda"})
    dtype: str = field(default="float32", metadata={"help": "comma-separated weight dtypes: float32, bfloat16"})
    vocab: int = field(default=32000, metadata={"help": "vocabulary size V"})
    dim: int = field(default=512, metadata={"help": "hidden size d"})
    tokens: str = field(default="8192", metadata={"help": "comma-separated token counts N"})
    head_modes: str = field(default="baseline,cosine,distance", metadata={"help": "comma-separated head modes"})
    logit_scale_kind: str = field(default="vector", metadata={"help": "logit scale of the normalized modes' head"})
    logit_bias: bool = field(default=True, metadata={"help": "a learned logit bias on the normalized modes' head"})
    paths: str = field(
        default="plain,fused", metadata={"help": "our paths: plain, fused, chunked, torch; fold: the O(V·d) work"}
    )
    reps: int = field(default=3, metadata={"help": "round-robin repetitions"})
    threads: int = field(default=0, metadata={"help": "torch threads; 0 = torch's default"})
    cpu_memory: str = field(
        default="measure",
        metadata={"help": "CPU only. measure: glibc mmaps every block of 128 KiB or more, so that each step's peak "
                  "reads from the resident set (fresh tensors page-fault anew, which costs time); keep_freed: freed "
                  "memory stays in the process for reuse, as the training scripts run (--keep_freed_cpu_memory), "
                  "and no peak is read"},
    )
    output: str = field(
        default="", metadata={"help": "JSON written here; default results/benchmark_lm_head_loss_<device>.json"}
    )


class PeakMemory:
    """Peak bytes one call adds above what was live before it (CUDA: allocator; CPU: resident set)."""

    def __init__(self, device):
        import torch

        self.torch, self.device = torch, device

    def start(self):
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.before = self.torch.cuda.memory_allocated()
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset VmHWM to the current resident set
            self.before = status_kib("VmRSS") * 1024

    def stop(self) -> int:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize()
            return self.torch.cuda.max_memory_allocated() - self.before
        return status_kib("VmHWM") * 1024 - self.before


def contenders(args: Args, dtype, tokens: int):
    """{name: step()} for one dtype and token count (each step runs loss + backward and returns the loss), the kernel
    of each fused contender, and every tensor that gets a gradient."""
    import torch
    import torch.nn.functional as F

    from hf_tiednorm import HeadSettings, TiedNormHead
    from hf_tiednorm.modeling.loss.head_loss import head_linear_cross_entropy
    from hf_tiednorm.modeling.loss.policy import choose_loss_path
    from hf_tiednorm.modeling.loss.token import token_cross_entropy

    device = torch.device(args.device)
    torch.manual_seed(0)
    weight = torch.nn.Parameter((torch.randn(args.vocab, args.dim, device=device) * 0.02).to(dtype))
    hidden = torch.randn(tokens, args.dim, device=device).to(dtype).requires_grad_(True)
    labels = torch.randint(0, args.vocab, (tokens,), device=device)
    labels[::17] = -100  # some padding, as in a real batch
    steps, kernels, params = {}, {}, [weight, hidden]
    FreshGradient = _fresh_gradient()  # noqa: N806

    def reset(*params):
        for p in params:
            p.grad = None

    def plain():
        reset(weight, hidden)
        loss = F.cross_entropy(F.linear(hidden, weight).float(), labels, ignore_index=-100)
        loss.backward()
        return loss

    if set(args.paths.split(",")) - {"fold"}:  # the reference of the loss paths (the fold alone computes no loss)
        steps["plain"] = plain
    for mode in args.head_modes.split(","):
        normalized = mode != "baseline"
        settings = HeadSettings(head_mode=mode, logit_scale_kind=args.logit_scale_kind if normalized else "none",
                              logit_bias=args.logit_bias and normalized)
        head = TiedNormHead(args.dim, args.vocab, settings=settings, device=device, dtype=dtype)
        head.weight = weight  # tied: the same matrix for every contender
        params += [p for p in head.parameters() if p is not weight]

        for path in args.paths.split(","):
            if path == "plain":

                def step(head=head):
                    reset(weight, hidden, *head.parameters())
                    loss = token_cross_entropy(head(hidden), labels)
                    loss.backward()
                    return loss

            elif path == "fold":
                # The head's own O(V·d) work alone: its folded weight and bias, forward and backward, given the
                # gradients a loss hands back (a fresh (V, d) buffer, as the loss's matmul gives it: a copy, made for
                # every mode, baseline's identity fold included, so the difference to baseline:fold is the work).
                grad_w = (torch.randn(args.vocab, args.dim, device=device) * 1e-3).to(dtype)
                grad_b = torch.randn(args.vocab, device=device) * 1e-3

                def step(head=head, grad_w=grad_w, grad_b=grad_b):
                    reset(weight, *head.parameters())
                    folded, bias = head.folded_weight_and_bias()
                    outputs, grads = [FreshGradient.apply(folded)], [grad_w]
                    if bias is not None:
                        outputs.append(bias)
                        grads.append(grad_b)
                    torch.autograd.backward(outputs, grads)
                    return outputs[0][0, 0]

                kernels[f"{mode}:{path}"] = "fold"
            else:
                kernel = choose_loss_path("fused", head, tokens) if path == "fused" else path

                def step(head=head, kernel=kernel):
                    reset(weight, hidden, *head.parameters())
                    loss = head_linear_cross_entropy(head, hidden, labels, kernel) / (labels != -100).sum()
                    loss.backward()
                    return loss

                kernels[f"{mode}:{path}"] = kernel
            steps[f"{mode}:{path}"] = step
    return steps, kernels, params


def _fresh_gradient():
    import torch

    class FreshGradient(torch.autograd.Function):
        """Identity whose backward hands on a copy of its gradient: a buffer nobody else holds, as a matmul's."""

        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, grad):
            return grad.clone()

    return FreshGradient


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def main() -> None:
    import torch
    from transformers import HfArgumentParser

    from hf_tiednorm.training.precision import cpu_description  # the CPU and its native bf16, as the scripts log it

    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()

    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    if args.cpu_memory not in ("measure", "keep_freed"):
        raise ValueError(f"--cpu_memory {args.cpu_memory!r}: expected 'measure' or 'keep_freed'")
    measure_peaks = device.type == "cuda" or args.cpu_memory == "measure"
    if device.type == "cpu" and not measure_peaks:
        from hf_tiednorm.training.cpu_memory import keep_freed_memory

        print(keep_freed_memory(), flush=True)
    elif device.type == "cpu" and not mmap_large_blocks():
        print(f"warning: mallopt is not available: CPU peaks may read low (set {_MMAP_ENV}=131072)", file=sys.stderr)
    peak = PeakMemory(device) if measure_peaks else None
    report = {
        "args": asdict(args),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_description(),
        "machine": {"cpu_count": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
        "method": "one process, round-robin over the contenders in every repetition; peak = bytes one loss + "
        "backward adds above its inputs (CUDA: max_memory_allocated; CPU: VmHWM - VmRSS with glibc's mmap threshold "
        "at 131072 bytes, set by mallopt; with --cpu_memory keep_freed no peak is read: freed memory is kept for reuse "
        "as the training scripts keep it, so fresh tensors are not page-faulted anew); ratios per repetition "
        "against the plain run of the same repetition, and "
        "(time_ratio_to_baseline; cpu_time_ratio_to_baseline: the process's CPU time) against baseline:<path> of the "
        "same repetition",
        "results": {},
    }  # fmt: skip
    for dtype_name in args.dtype.split(","):
        dtype = getattr(torch, dtype_name)
        for tokens in (int(t) for t in args.tokens.split(",")):
            steps, kernels, params = contenders(args, dtype, tokens)
            for step in steps.values():
                step()  # warm-up: gradients allocated once, as in training
            runs = {name: [] for name in steps}
            for rep in range(args.reps):
                for name, step in steps.items():
                    for param in params:  # the previous contender's gradients freed before the measurement
                        param.grad = None
                    if peak is not None:
                        peak.start()
                    t0, cpu0 = time.perf_counter(), time.process_time()
                    loss = step()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
                    peak_bytes = None if peak is None else peak.stop()
                    runs[name].append({"time_s": seconds, "cpu_time_s": cpu_seconds, "peak_bytes": peak_bytes,
                                       "loss": float(loss.detach())})
                    memory = "" if peak_bytes is None else f"{peak_bytes / 2**20:9.1f} MiB"
                    print(f"{dtype_name} N={tokens} rep {rep} {name:20s} {seconds:.3f} s {memory}", flush=True)
            base = runs.get("plain")
            table = {}
            for name, got in runs.items():
                table[name] = {
                    "kernel": kernels.get(name, "plain"),
                    "time_s": _summary([g["time_s"] for g in got]),
                    "cpu_time_s": _summary([g["cpu_time_s"] for g in got]),
                    "peak_mib": _summary([g["peak_bytes"] / 2**20 for g in got]) if peak is not None else None,
                    "time_ratio": _summary([g["time_s"] / b["time_s"] for g, b in zip(got, base)]) if base else None,
                    # None where the plain run's peak read 0 (a toy size: below the allocator's resolution on the CPU)
                    "memory_ratio": _summary([g["peak_bytes"] / b["peak_bytes"] for g, b in zip(got, base)])
                    if base and peak is not None and all(b["peak_bytes"] > 0 for b in base) else None,
                    "loss": got[-1]["loss"],
                }
                # The normalized head against the plain tied head on the same path, in the same repetition.
                same_path = runs.get(f"baseline:{name.split(':')[-1]}") if ":" in name else None
                if same_path is not None:
                    for key in ("time_s", "cpu_time_s"):
                        table[name][f"{key[:-2]}_ratio_to_baseline"] = _summary(
                            [g[key] / b[key] for g, b in zip(got, same_path)]
                        )
                r = table[name]
                memory = "n/a" if r["memory_ratio"] is None else f"x{r['memory_ratio']['median']:.3f}"
                versus = "".join(
                    f"  {label} x{r[key]['median']:.3f} [{r[key]['min']:.3f}-{r[key]['max']:.3f}]"
                    for key, label in (("time_ratio_to_baseline", "of baseline"), ("cpu_time_ratio_to_baseline", "cpu"))
                    if key in r
                )
                ratio = r["time_ratio"]
                time_text = "n/a" if ratio is None else (
                    f"x{ratio['median']:.3f} [{ratio['min']:.3f}-{ratio['max']:.3f}]")
                print(f"{dtype_name} N={tokens} {name:20s} ({r['kernel']:7s}) time {time_text}  memory {memory}"
                      f"{versus}  {r['time_s']['median'] * 1e3:.1f} ms (cpu {r['cpu_time_s']['median'] * 1e3:.1f} ms)",
                      flush=True)  # fmt: skip
            report["results"][f"{dtype_name}:N={tokens}"] = table
    output = Path(args.output or f"results/benchmark_lm_head_loss_{device.type}.json")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=1))
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
