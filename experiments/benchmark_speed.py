"""Training and generation speed of the normalized tied head vs plain tying and vs the HF parent models.

Contenders, all built with the same dimensions (``SIZES``) and all with tied embeddings (checked: the output layer's
weight is the input embedding's tensor):
  * ``seq2seq:<mode>``: ``TiedNormForConditionalGeneration`` with ``tie_topology="three_way"``, one per head mode;
  * ``seq2seq:hf_marian``: HF ``MarianMTModel`` (shared vocabulary, ``tie_word_embeddings=True``);
  * ``causal:baseline``: ``TiedNormForCausalLM`` with ``head_mode="baseline"``;
  * ``causal:hf_llama``: HF ``LlamaForCausalLM`` with ``tie_word_embeddings=True``.
Tasks: one training step (forward + backward + AdamW step, train mode, dropout on) and generation in eval mode
(greedy and beam search at each ``--gen_batches`` size) with ``min_new_tokens = max_new_tokens`` so that every
contender decodes exactly ``--new_tokens`` steps (asserted on the output length).

Method: all contenders live in one process; after ``--warmup`` untimed calls each, every repetition runs each task
once per contender in turn (round-robin, rotating the start), so slow drifts of the machine hit all contenders
alike. A measurement is the mean of ``--iters`` calls. Ratios are taken within a repetition (contender time /
reference time) and reported as median and min–max over repetitions. Each measurement also counts the process's
minor page faults (fresh memory mapped by the kernel); on CPU the process keeps freed tensor memory for reuse, as the
training scripts do (``--keep_freed_cpu_memory false``: glibc's defaults, which page-fault large temporaries anew).
FLOPs of a training step are counted exactly with ``torch.utils.flop_counter.FlopCounterMode`` on one forward +
backward, with SDPA forced onto its math backend so that attention decomposes into counted matmuls (CPU's fused
SDPA kernel has no FLOP formula); AdamW's elementwise work is not counted. The peak is the best time of a large
square matmul on the same device (fp32, plus bf16 on CUDA).

    nice -n 0 python experiments/benchmark_speed.py --sizes default --reps 5 --output results/benchmark_speed_cpu.json
    python experiments/benchmark_speed.py --quick --output /tmp/speed.json   # smoke test, tiny dims
"""

from __future__ import annotations

import json
import math
import os
import platform
import resource
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import transformers
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    GenerationConfig,
    HfArgumentParser,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
)

from hf_tiednorm import (
    HEAD_MODES,
    TiedNormCausalConfig,
    TiedNormForCausalLM,
    TiedNormForConditionalGeneration,
    TiedNormSeq2SeqConfig,
)
from hf_tiednorm.training.cpu_memory import keep_freed_memory
from hf_tiednorm.training.precision import cpu_description

# Model dimensions. "layers" is per stack of the encoder-decoder; the causal LM gets 2 x layers so that both families
# have the same depth. "large" is Transformer-base (Vaswani et al.) with a 32k vocabulary.
SIZES = {
    "quick": {"vocab": 512, "d_model": 32, "layers": 1, "ffn": 64, "heads": 2},
    "default": {"vocab": 8000, "d_model": 256, "layers": 3, "ffn": 1024, "heads": 4},
    "large": {"vocab": 32000, "d_model": 512, "layers": 6, "ffn": 2048, "heads": 8},
}
TRAIN_TARGET = 1.03  # mode / baseline time of a training step
GENERATION_TARGET = 1.02  # mode / baseline time of a generate() call
PARENT_TARGET = 1.0  # HF parent time / our baseline time (= our throughput / the parent's)
SPECIAL_IDS = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}


@dataclass
class Args:
    sizes: str = field(default="default", metadata={"help": f"comma-separated among {list(SIZES)}"})
    quick: bool = field(default=False, metadata={"help": "smoke-test preset: tiny dims, 2 reps, short sequences"})
    device: str = field(default="auto", metadata={"help": "cpu, cuda or auto (cuda when available)"})
    reps: int = field(default=5, metadata={"help": "interleaved repetitions"})
    iters: int = field(default=1, metadata={"help": "calls per timed measurement (their mean is recorded)"})
    warmup: int = field(default=1, metadata={"help": "untimed calls per contender and task before the repetitions"})
    threads: int = field(default=0, metadata={"help": "torch intra-op threads; 0 = torch's default"})
    head_modes: str = field(default=",".join(HEAD_MODES), metadata={"help": "seq2seq head modes to compare"})
    train_batch: int = field(default=16, metadata={"help": "sentences per training step"})
    seq_len: int = field(default=32, metadata={"help": "source = target length in training; prompt length"})
    new_tokens: int = field(default=32, metadata={"help": "tokens every generate() call produces"})
    gen_batches: str = field(default="1,32", metadata={"help": "comma-separated generation batch sizes"})
    beams: str = field(default="1,4", metadata={"help": "comma-separated beam sizes (1 = greedy; empty: train only)"})
    peak_size: int = field(default=0, metadata={"help": "side of the peak matmul; 0 = 2048 on CPU, 8192 on CUDA"})
    keep_freed_cpu_memory: bool = field(
        default=True,
        metadata={"help": "on CPU, keep freed tensor memory for reuse, as the training scripts do (cpu_memory.py)"},
    )
    seed: int = field(default=0, metadata={"help": "torch seed of the models and inputs"})
    output: str = field(default="results/benchmark_speed.json", metadata={"help": "JSON written here"})

    def __post_init__(self):
        if self.quick:  # tiny dims and few calls: seconds in total
            self.sizes, self.reps, self.warmup = "quick", 2, 1
            self.train_batch, self.seq_len, self.new_tokens, self.gen_batches, self.peak_size = 4, 8, 4, "1,4", 256
        unknown = set(self.sizes.split(",")) - set(SIZES)
        if unknown:
            raise ValueError(f"--sizes must be among {list(SIZES)}, got {sorted(unknown)}")
        if self.device == "auto":
            self.device = "cuda" if torch.cuda.is_available() else "cpu"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device, iters: int = 1) -> float:
    """Mean seconds of ``iters`` calls of ``fn``."""
    synchronize(device)  # CUDA kernels are asynchronous: time only what these calls launched
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    synchronize(device)
    return (time.perf_counter() - start) / iters


def minor_page_faults() -> int:
    """Page faults of this process so far that needed no disk: the kernel mapping (and zeroing) fresh memory, e.g.
    for every large tensor glibc's malloc takes from mmap and gives back on free
    (hf_tiednorm/training/cpu_memory.py)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, iters: int = 3) -> float:
    """Best-of-``iters`` FLOP/s of an (n x n) @ (n x n) matmul: the practical peak the training step is held to."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up (library initialization, CUDA kernel selection)
    best = min(timed(lambda: a @ b, device) for _ in range(iters))
    return 2 * n**3 / best


def seq2seq_config_fields(size: dict) -> dict:
    """MarianConfig fields shared by our model and HF's Marian, so that only the head differs."""
    return dict(
        vocab_size=size["vocab"],
        d_model=size["d_model"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_ffn_dim=size["ffn"],
        decoder_ffn_dim=size["ffn"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        max_position_embeddings=256,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        scale_embedding=True,  # Marian's default is False, ours True: pin it
        decoder_start_token_id=1,
        forced_eos_token_id=None,
        **SPECIAL_IDS,
    )


def causal_config_fields(size: dict) -> dict:
    return dict(
        vocab_size=size["vocab"],
        hidden_size=size["d_model"],
        intermediate_size=size["ffn"],
        num_hidden_layers=2 * size["layers"],
        num_attention_heads=size["heads"],
        num_key_value_heads=size["heads"],
        max_position_embeddings=256,
        tie_word_embeddings=True,
        **SPECIAL_IDS,
    )


def build_contenders(size: dict, head_modes: list[str]) -> dict[str, torch.nn.Module]:
    seq2seq = seq2seq_config_fields(size)
    causal = causal_config_fields(size)
    models = {}
    for mode in head_modes:
        config = TiedNormSeq2SeqConfig(**seq2seq, head_mode=mode, tie_topology="three_way")
        models[f"seq2seq:{mode}"] = TiedNormForConditionalGeneration(config)
    marian = MarianConfig(**seq2seq, share_encoder_decoder_embeddings=True, tie_word_embeddings=True)
    models["seq2seq:hf_marian"] = MarianMTModel(marian)
    models["causal:baseline"] = TiedNormForCausalLM(TiedNormCausalConfig(**causal, head_mode="baseline"))
    models["causal:hf_llama"] = LlamaForCausalLM(LlamaConfig(**causal))
    for name, model in models.items():
        if not is_tied(model):
            raise RuntimeError(f"{name}: the output layer is not tied to the input embedding")
    return models


def is_tied(model: torch.nn.Module) -> bool:
    """Whether the output layer's weight is the input embedding's tensor (not merely equal to it)."""
    return model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def unique_parameter_count(model: torch.nn.Module) -> int:
    # The parameters a step trains; parameters() yields a tied tensor once. HF Marian keeps its sinusoidal position
    # tables as frozen parameters, ours computes them as buffers: neither is trained.
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def make_train_batch(model: torch.nn.Module, args: Args, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed)
    shape = (args.train_batch, args.seq_len)
    ids = torch.randint(4, model.config.vocab_size, shape, generator=generator).to(device)
    if model.config.is_encoder_decoder:
        labels = torch.randint(4, model.config.vocab_size, shape, generator=generator).to(device)
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": ids}


def make_prompts(model: torch.nn.Module, batch: int, args: Args, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed + batch)
    ids = torch.randint(4, model.config.vocab_size, (batch, args.seq_len), generator=generator).to(device)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor]) -> None:
    model.train()
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def training_flops(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> int:
    """Exact matmul FLOPs of one forward + backward (the optimizer step is elementwise and not counted)."""
    model.train()
    counter = FlopCounterMode(display=False)
    with counter, sdpa_kernel(SDPBackend.MATH):
        model(**batch).loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def generate_fn(model: torch.nn.Module, prompts: dict[str, torch.Tensor], beams: int, new_tokens: int) -> Callable:
    # Every setting spelled out, so no contender inherits a different default from its own generation_config.
    config = GenerationConfig(
        do_sample=False,
        num_beams=beams,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,  # EOS is masked until the end: every contender decodes the same number of steps
        length_penalty=1.0,
        no_repeat_ngram_size=0,
        use_cache=True,
        decoder_start_token_id=1 if model.config.is_encoder_decoder else None,
        **SPECIAL_IDS,
    )
    # The decoder output holds the start token (encoder-decoder) or the prompt (causal) before the new tokens.
    expected = new_tokens + (1 if model.config.is_encoder_decoder else prompts["input_ids"].shape[1])

    def run() -> None:
        model.eval()
        out = model.generate(**prompts, generation_config=config)
        if out.shape[1] != expected:
            raise RuntimeError(f"generated length {out.shape[1]} != {expected}: contenders would not be comparable")

    return run


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def comparisons(contenders: list[str], tasks: list[str]) -> list[tuple[str, str, str, str, float, bool]]:
    """(task, label, numerator, denominator, target, higher_is_better) of every reported ratio of times."""
    rows = []
    for task in tasks:
        target = TRAIN_TARGET if task == "train" else GENERATION_TARGET
        for name in contenders:
            family, mode = name.split(":")
            if family == "seq2seq" and mode in HEAD_MODES and mode != "baseline":
                rows.append((task, f"seq2seq {mode} / baseline time", name, "seq2seq:baseline", target, False))
        # parent time / our time: our throughput relative to the HF parent's
        rows.append((task, "seq2seq baseline / HF Marian throughput", "seq2seq:hf_marian", "seq2seq:baseline",
                     PARENT_TARGET, True))
        rows.append((task, "causal baseline / HF Llama throughput", "causal:hf_llama", "causal:baseline",
                     PARENT_TARGET, True))
    return rows


def bench_size(size_name: str, args: Args, device: torch.device) -> dict:
    size = SIZES[size_name]
    head_modes = args.head_modes.split(",")
    if "baseline" not in head_modes:
        raise ValueError("--head_modes must include baseline, the reference of the mode ratios")
    torch.manual_seed(args.seed)
    models = {name: model.to(device) for name, model in build_contenders(size, head_modes).items()}
    tasks: dict[str, dict[str, Callable]] = {"train": {}}
    info = {}
    for name, model in models.items():
        batch = make_train_batch(model, args, device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        tasks["train"][name] = lambda m=model, o=optimizer, b=batch: train_step(m, o, b)
        tokens = batch["labels"].numel() + (batch["input_ids"].numel() if model.config.is_encoder_decoder else 0)
        info[name] = {
            "class": type(model).__name__,
            "parameters": unique_parameter_count(model),
            "tied": is_tied(model),
            "train_tokens_per_step": tokens,
            "train_flops_per_step": training_flops(model, batch),
        }
    for beams in [int(b) for b in args.beams.split(",") if b]:
        for gen_batch in map(int, args.gen_batches.split(",")):
            task = f"{'greedy' if beams == 1 else f'beam{beams}'}_b{gen_batch}"
            tasks[task] = {
                name: generate_fn(model, make_prompts(model, gen_batch, args, device), beams, args.new_tokens)
                for name, model in models.items()
            }
    for fns in tasks.values():
        for fn in fns.values():
            for _ in range(args.warmup):
                fn()
    times: dict[str, dict[str, list[float]]] = {task: {name: [] for name in fns} for task, fns in tasks.items()}
    faults: dict[str, dict[str, list[float]]] = {task: {name: [] for name in fns} for task, fns in tasks.items()}
    names = list(models)
    for rep in range(args.reps):
        # Round-robin: every contender once per task and repetition, starting one later each repetition so that
        # no contender always runs first after a task switch (cold caches, clock ramp-up).
        order = names[rep % len(names):] + names[: rep % len(names)]
        for task, fns in tasks.items():
            for name in order:
                before = minor_page_faults()
                times[task][name].append(timed(fns[name], device, args.iters))
                faults[task][name].append((minor_page_faults() - before) / args.iters)
        print(f"[{size_name}] rep {rep + 1}/{args.reps} done", flush=True)
    ratios = []
    for task, label, numerator, denominator, target, higher in comparisons(list(models), list(tasks)):
        per_rep = [n / d for n, d in zip(times[task][numerator], times[task][denominator])]
        stats = summary(per_rep)
        met = stats["median"] >= target if higher else stats["median"] <= target
        ratios.append({"task": task, "comparison": label, "numerator": numerator, "denominator": denominator,
                       "ratio": stats, "target": f"{'>=' if higher else '<='} {target}", "met": met})
    for name in models:
        train_s = statistics.median(times["train"][name])
        info[name]["train_flops_per_s"] = info[name]["train_flops_per_step"] / train_s
        info[name]["train_tokens_per_s"] = info[name]["train_tokens_per_step"] / train_s
        info[name]["train_page_faults_per_step"] = statistics.median(faults["train"][name])
    return {
        "dims": size,
        "contenders": info,
        "times_s": {task: {name: {**summary(t), "all": t} for name, t in per.items()} for task, per in times.items()},
        "minor_page_faults_per_call": {
            task: {name: {**summary(f), "all": f} for name, f in per.items()} for task, per in faults.items()
        },
        "ratios": ratios,
    }


def machine_info(device: torch.device) -> dict:
    info = {
        "device": str(device),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": platform.processor(),
        "cpu": cpu_description(),
        "loadavg_at_start": os.getloadavg(),  # other processes competing for the cores make the timings noisy
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["tf32_matmul"] = torch.backends.cuda.matmul.allow_tf32
    return info


def print_report(report: dict) -> None:
    peak = report["peak_flops"]["float32"]
    for size_name, result in report["sizes"].items():
        print(f"\n== {size_name} {result['dims']} on {report['machine']['device']} "
              f"({report['machine']['torch_threads']} threads), {report['args']['reps']} reps ==")
        print(f"{'task':11s} {'comparison':42s} {'median':>7s} {'min-max':>15s} {'target':>8s}")
        for r in result["ratios"]:
            s = r["ratio"]
            print(f"{r['task']:11s} {r['comparison']:42s} {s['median']:7.3f} {s['min']:7.3f}-{s['max']:<7.3f} "
                  f"{r['target']:>8s} {'PASS' if r['met'] else 'MISS'}")
        print(f"{'contender':18s} {'params':>10s} {'train s':>8s} {'tok/s':>9s} {'GFLOP/s':>9s} {'of fp32 peak':>12s} "
              f"{'faults/step':>11s}")
        for name, c in result["contenders"].items():
            print(f"{name:18s} {c['parameters']:10d} {result['times_s']['train'][name]['median']:8.4f} "
                  f"{c['train_tokens_per_s']:9.0f} {c['train_flops_per_s'] / 1e9:9.2f} "
                  f"{c['train_flops_per_s'] / peak:12.1%} {c['train_page_faults_per_step']:11.0f}")
    print("\npeak matmul: " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in report["peak_flops"].items()))
    machine = report["machine"]
    print(f"load average at start {machine['loadavg_at_start']}, at end {machine['loadavg_at_end']}")


def main() -> None:
    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    cpu_memory = keep_freed_memory() if args.keep_freed_cpu_memory and device.type == "cpu" else "allocator defaults"
    print(cpu_memory, flush=True)
    peak_size = args.peak_size or (8192 if device.type == "cuda" else 2048)
    peak_flops = {"float32": matmul_peak(device, torch.float32, peak_size)}
    if device.type == "cuda":
        peak_flops["bfloat16"] = matmul_peak(device, torch.bfloat16, peak_size)
    report = {
        "args": asdict(args),
        "machine": {**machine_info(device), "cpu_memory": cpu_memory},
        "method": "all contenders in one process; after warm-up, every repetition runs each task once per contender "
        "(round-robin, start rotated each repetition); a measurement is the mean of --iters calls; ratios are taken "
        "within a repetition and summarized as median and min-max; training FLOPs from FlopCounterMode on one "
        "forward+backward with SDPA on its math backend; peak = best time of a square matmul",
        "peak_flops": peak_flops,
        "peak_matmul_size": peak_size,
        "sizes": {name: bench_size(name, args, device) for name in args.sizes.split(",")},
    }
    for result in report["sizes"].values():
        for r in result["ratios"]:
            if not (math.isfinite(r["ratio"]["median"]) and r["ratio"]["min"] > 0):
                raise RuntimeError(f"ratio {r['comparison']} of {r['task']} is not a positive number: {r['ratio']}")
    report["machine"]["loadavg_at_end"] = os.getloadavg()
    print_report(report)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
