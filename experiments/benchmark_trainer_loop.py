#!/usr/bin/env python
"""Whole-Trainer-loop training speed: ours (TiedNormForConditionalGeneration) vs transformers' MarianMTModel, fp32 vs
bf16 autocast, at the main-job size and recipe (scripts/configs/multi30k_de_en.yaml: d = 256, 3 + 3 layers, joint
BPE 8k, batch 64, label smoothing 0.1, group_by_length, inverse-sqrt schedule).

    python experiments/benchmark_trainer_loop.py                                  # ≈ 5 min on 2 CPU cores
    python experiments/benchmark_trainer_loop.py --steps 60 --reps 3 --note "idle machine"
    python experiments/benchmark_trainer_loop.py --profile true --reps 1 --steps 12 \
        --output results/profile_trainer_loop.json

Every (model, precision) run is a short ``TiedNormSeq2SeqTrainer.train()`` in a fresh subprocess (accelerate keeps
one mixed-precision state per process), on the same Multi30k pairs, tokenizer, seed and therefore batches, with the
loop of scripts/run_translation.py: its collator, Trainer class, tie check callback, attention choice (eager with an
fp32 softmax under bf16 on CPU) and loss path (ours: the model's label-smoothed loss; Marian: the Trainer's
LabelSmoother, as run_translation.py --model_family marian trains it).
Repetitions are interleaved (rep 1 of every run, then rep 2, ...) so that load drifting on a shared machine hits every
run alike. Timed: from the end of step --skip_steps to the end of the last step (the first steps allocate);
tokens: non-padding source + target tokens of those steps' batches. The JSON in --output holds every repetition,
the medians, the ratios and the machine (CPU, flags, threads, load average before and after). With --profile true the
timed steps run under torch.profiler and the JSON also holds each run's top operators by self CPU time (the timings
then include the profiler's overhead: use them for where the time goes, not for speed).
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml
from transformers import HfArgumentParser

ROOT = Path(__file__).resolve().parents[1]
MAIN_JOB_CONFIG = ROOT / "scripts" / "configs" / "multi30k_de_en.yaml"
# name -> (model family, head_mode, loss_chunk_size). "-chunked": the fused chunked loss
# (hf_tiednorm/modeling/loss/chunked.py),
# which drops the padding positions before the head and never materializes the (tokens × V) logits.
MODELS = {
    "ours-baseline": ("tiednorm", "baseline", None),
    "ours-baseline-chunked": ("tiednorm", "baseline", 4096),
    "ours-cosine": ("tiednorm", "cosine", None),
    "marian": ("marian", None, None),
}
PRECISIONS = ("fp32", "bf16")


@dataclass
class BenchmarkArguments:
    data_dir: str = field(default="../shared/data/multi30k", metadata={"help": "Multi30k folder (train.{de,en}.gz)"})
    models: str = field(default=",".join(MODELS), metadata={"help": f"comma-separated, from {list(MODELS)}"})
    precisions: str = field(default=",".join(PRECISIONS), metadata={"help": f"comma-separated, from {PRECISIONS}"})
    steps: int = field(default=30, metadata={"help": "training steps per run"})
    skip_steps: int = field(default=5, metadata={"help": "untimed first steps of each run"})
    reps: int = field(default=2, metadata={"help": "interleaved repetitions of every run"})
    num_threads: int = field(default=2, metadata={"help": "torch CPU threads per run"})
    keep_freed_cpu_memory: bool = field(
        default=True, metadata={"help": "keep freed tensor memory for reuse, as run_translation.py does on CPU"}
    )
    output: str = field(default="results/benchmark_trainer_loop.json", metadata={"help": "JSON written here"})
    note: str = field(default="", metadata={"help": "free text stored in the JSON (e.g. the machine's other load)"})
    profile: bool = field(default=False, metadata={"help": "run the timed steps under torch.profiler (top ops)"})
    pad_to_multiple_of: str = field(
        default="default",
        metadata={"help": "comma-separated collator padding multiples to run each model/precision with (0: none); "
                  "'default': the run's own (8 on an accelerator, none on CPU: --pad_to_multiple_of of the scripts)"},
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "a saved tokenizer folder (e.g. a main-job run's); None: train the recipe's"}
    )
    tiny: bool = field(
        default=False,
        metadata={"help": "a toy model (d = 32, 1 + 1 layers) for a CI-sized smoke run; the speeds mean nothing"},
    )
    count_shapes: bool = field(
        default=False,
        metadata={"help": "only count the distinct (batch, length) shapes of one epoch of the main job's training "
                  "batches with each --pad_to_multiple_of (the full training set, group_by_length), and exit"},
    )
    child: str | None = field(default=None, metadata={"help": "internal: one run's settings as JSON"})

    def __post_init__(self):
        unknown = set(self.model_list()) - set(MODELS) | set(self.precision_list()) - set(PRECISIONS)
        if unknown:
            raise ValueError(f"unknown --models/--precisions {sorted(unknown)}")
        if not 0 <= self.skip_steps < self.steps:
            raise ValueError(f"--skip_steps must be in [0, --steps), got {self.skip_steps}")

    def model_list(self) -> list[str]:
        return [m for m in self.models.split(",") if m]

    def precision_list(self) -> list[str]:
        return [p for p in self.precisions.split(",") if p]

    def padding_list(self) -> list[int | None]:
        """None: the run's default padding multiple."""
        return [None if p == "default" else int(p) for p in self.pad_to_multiple_of.split(",") if p]

    def variants(self) -> list[tuple[str, str, int | None]]:
        """(label, precision, padding multiple) of every run setting: "bf16", or "bf16-pad8" with several paddings."""
        paddings = self.padding_list()
        return [(p if paddings == [None] else f"{p}-pad{n}", p, n) for n in paddings for p in self.precision_list()]


def recipe() -> dict:
    return yaml.safe_load(MAIN_JOB_CONFIG.read_text())


def run_child(settings: dict) -> dict:
    """One short training run in this process; returns its timing."""
    import torch
    from datasets import load_from_disk
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, MarianMTModel, TrainerCallback, set_seed

    import hf_tiednorm
    from hf_tiednorm.training.callbacks import TiedWeightsCheck
    from hf_tiednorm.training.cpu_memory import keep_freed_memory
    from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments, choose_attention, padding_multiple
    from hf_tiednorm.training.trainers import TiedNormSeq2SeqTrainer

    sys.path.insert(0, str(ROOT / "scripts"))
    from run_translation import marian_config

    torch.set_num_threads(settings["num_threads"])
    if settings["keep_freed_cpu_memory"]:
        keep_freed_memory()
    config = recipe()
    set_seed(config["seed"])
    tokenizer = AutoTokenizer.from_pretrained(settings["tokenizer"])
    data = load_from_disk(settings["tokenized"])  # tokenized once by the parent (tokenized_train)
    dims = {k: config[k] for k in ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim",
                                   "dropout", "label_smoothing", "tie_topology")}
    if settings.get("tiny"):
        dims |= {"d_model": 32, "encoder_layers": 1, "decoder_layers": 1, "encoder_ffn_dim": 64, "decoder_ffn_dim": 64,
                 "encoder_attention_heads": 2, "decoder_attention_heads": 2}
    ours = hf_tiednorm.TiedNormSeq2SeqConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
        head_mode=settings["head_mode"] or "baseline", loss_chunk_size=settings["loss_chunk_size"], **dims,
    )
    marian = settings["family"] == "marian"
    model = MarianMTModel(marian_config(ours)) if marian else hf_tiednorm.TiedNormForConditionalGeneration(ours)
    keys = ("learning_rate", "lr_scheduler_type", "warmup_steps", "weight_decay", "adam_beta2", "max_grad_norm",
            "per_device_train_batch_size", "train_sampling_strategy", "seed")
    args = TiedNormSeq2SeqTrainingArguments(
        output_dir=settings["output_dir"], max_steps=settings["steps"], save_strategy="no", report_to="none",
        logging_steps=10, bf16=settings["precision"] == "bf16", disable_tqdm=True,
        label_smoothing_factor=config["label_smoothing"] if marian else 0.0, **{k: config[k] for k in keys},
        pad_to_multiple_of=settings.get("pad_to_multiple_of"),
    )
    choose_attention(model, args)  # as run_translation.py does
    collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                      pad_to_multiple_of=padding_multiple(args))
    synchronize = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    batch_tokens: list[int] = []
    batch_shapes: list[tuple[int, ...]] = []

    def counting_collator(features):
        batch = collator(features)
        batch_shapes.append(tuple(batch["input_ids"].shape) + tuple(batch["labels"].shape))
        sources = int(batch["attention_mask"].sum())
        batch_tokens.append(sources + int((batch["labels"] != -100).sum()))
        return batch

    step_ends: list[float] = []
    profiler = None
    if settings.get("profile"):
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])

    class StepClock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step in (settings["skip_steps"], settings["steps"]):
                synchronize()  # a GPU runs ahead of the host: the timed span ends when its work is done
            step_ends.append(time.perf_counter())
            if profiler is not None and state.global_step == settings["skip_steps"]:
                profiler.start()

    trainer = TiedNormSeq2SeqTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                     data_collator=counting_collator, callbacks=[TiedWeightsCheck(), StepClock()])
    trainer.train()
    top_ops = []
    if profiler is not None:
        profiler.stop()
        averages = sorted(profiler.key_averages(), key=lambda event: -event.self_cpu_time_total)
        total = sum(event.self_cpu_time_total for event in averages)
        top_ops = [{"op": e.key, "self_cpu_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total,
                    "calls": e.count} for e in averages[:25]]
    skip = settings["skip_steps"]
    seconds = step_ends[-1] - step_ends[skip - 1] if skip else None
    tokens = sum(batch_tokens[skip:settings["steps"]])
    if not skip:  # no earlier step end to start from: the Trainer's own runtime
        seconds = trainer.state.log_history[-1]["train_runtime"]
    return {"seconds": seconds, "tokens": tokens, "tokens_per_s": tokens / seconds,
            "steps_per_s": (settings["steps"] - skip) / seconds, "mixed_precision": args.mixed_precision,
            "pad_to_multiple_of": args.pad_to_multiple_of, "device": str(args.device),
            "distinct_shapes": len({tuple(shape) for shape in batch_shapes}),
            "losses": [entry["loss"] for entry in trainer.state.log_history if "loss" in entry], "top_ops": top_ops}


def tokenized_train(tokenizer_dir: Path, data_dir: Path, rows: int, folder: Path) -> str:
    """The first ``rows`` training pairs, tokenized once and saved to ``folder`` for every run to load (each run's
    process used to load and tokenize them again: 8 times per repetition)."""
    from transformers import AutoTokenizer

    from hf_tiednorm.training.data import load_parallel, tokenize_parallel

    config = recipe()
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    raw = load_parallel({"train": str(data_dir / "train.{lang}.gz")}, config["source_lang"], config["target_lang"])
    raw["train"] = raw["train"].select(range(rows))
    data = tokenize_parallel(raw, tokenizer, config["source_lang"], config["target_lang"], 128, 128)["train"]
    data.save_to_disk(str(folder))
    return str(folder)


def count_shapes(tokenizer_dir: str, data_dir: Path, paddings: list[int]) -> dict[str, dict]:
    """One epoch of the main job's training batches (the full training set, its batch size, group_by_length and
    seed, the Trainer's own sampler and run_translation.py's collator) per padding multiple: the number of batches and
    of distinct (batch, source length, target length) shapes, and the padding share of the tokens."""
    import torch
    from transformers import AutoTokenizer, DataCollatorForSeq2Seq, set_seed

    import hf_tiednorm
    from hf_tiednorm.training.data import load_parallel, tokenize_parallel
    from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments
    from hf_tiednorm.training.trainers import TiedNormSeq2SeqTrainer

    config = recipe()
    set_seed(config["seed"])
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    raw = load_parallel({"train": str(data_dir / "train.{lang}.gz")}, config["source_lang"], config["target_lang"])
    data = tokenize_parallel(raw, tokenizer, config["source_lang"], config["target_lang"], 128, 128)["train"]
    model = hf_tiednorm.TiedNormForConditionalGeneration(hf_tiednorm.TiedNormSeq2SeqConfig(
        vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id, decoder_start_token_id=tokenizer.bos_token_id,
        d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=16, decoder_ffn_dim=16,
        encoder_attention_heads=1, decoder_attention_heads=1))  # only the collator's decoder-input shift needs it
    counts = {}
    for padding in paddings:
        args = TiedNormSeq2SeqTrainingArguments(
            output_dir=tempfile.mkdtemp(), report_to="none", bf16=False, use_cpu=True, pad_to_multiple_of=padding,
            per_device_train_batch_size=config["per_device_train_batch_size"],
            train_sampling_strategy=config["train_sampling_strategy"], seed=config["seed"],
        )
        collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100,
                                          pad_to_multiple_of=padding or None)
        trainer = TiedNormSeq2SeqTrainer(model=model, args=args, train_dataset=data, processing_class=tokenizer,
                                         data_collator=collator)
        shapes, tokens, real = set(), 0, 0
        for batch in trainer.get_train_dataloader():
            shapes.add((*batch["input_ids"].shape, batch["labels"].shape[1]))
            tokens += batch["input_ids"].numel() + batch["labels"].numel()
            real += int(batch["attention_mask"].sum()) + int((batch["labels"] != -100).sum())
        counts[f"pad_to_multiple_of={padding}"] = {
            "batches": len(trainer.get_train_dataloader()), "distinct_shapes": len(shapes),
            "padding_share": round(1 - real / tokens, 4), "torch": torch.__version__,
        }
    return counts


def machine() -> dict:
    import torch

    from hf_tiednorm.training.precision import cpu_bf16_flags, cpuinfo_field

    return {"cpu": cpuinfo_field("model name") or platform.processor(), "cpu_count": os.cpu_count(),
            "bf16_flags": cpu_bf16_flags(), "torch": torch.__version__, "platform": platform.platform(),
            "cuda": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


def summarize(results: dict[str, list[dict]], args: BenchmarkArguments) -> dict:
    """Median tokens/s per run, the ratios of those medians, and each ratio within a repetition (runs of one
    repetition are minutes apart) as median [min, max]; over the repetitions finished so far."""
    done = {name: reps for name, reps in results.items() if reps}
    medians = {name: statistics.median(r["tokens_per_s"] for r in reps) for name, reps in done.items()}
    pairs = []  # (ratio name, numerator run, denominator run)
    labels = {(precision, padding): label for label, precision, padding in args.variants()}
    for model in args.model_list():
        for (precision, padding), label in labels.items():
            fp32 = labels.get(("fp32", padding))
            if precision == "bf16" and fp32 is not None:
                pairs.append((f"{model}: {label} / {fp32}", f"{model}/{label}", f"{model}/{fp32}"))
            unpadded = labels.get((precision, 0))
            if padding and unpadded is not None:
                pairs.append((f"{model}: {label} / {unpadded}", f"{model}/{label}", f"{model}/{unpadded}"))
        if model != "marian" and "marian" in args.model_list():
            pairs += [(f"{model} / marian ({p})", f"{model}/{p}", f"marian/{p}") for p in labels.values()]
        plain = model.removesuffix("-chunked")
        if plain != model and plain in args.model_list():
            pairs += [(f"{model} / {plain} ({p})", f"{model}/{p}", f"{plain}/{p}") for p in labels.values()]
    pairs = [(name, top, bottom) for name, top, bottom in pairs if top in done and bottom in done]
    per_rep = {
        name: [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(done[top], done[bottom], strict=False)]
        for name, top, bottom in pairs
    }
    return {
        "median_tokens_per_s": medians,
        "ratios": {name: medians[top] / medians[bottom] for name, top, bottom in pairs},
        "paired_ratios": {
            name: {"median": statistics.median(values), "min": min(values), "max": max(values)}
            for name, values in per_rep.items()
            if values
        },
    }


def main() -> None:
    (args,) = HfArgumentParser(BenchmarkArguments).parse_args_into_dataclasses()
    if args.child is not None:
        print("RESULT " + json.dumps(run_child(json.loads(args.child))), flush=True)
        return
    from hf_tiednorm.training.data import load_parallel, training_texts
    from hf_tiednorm.training.tokenization import train_joint_tokenizer

    config = recipe()
    data_dir = Path(args.data_dir) if Path(args.data_dir).is_absolute() else (ROOT / args.data_dir).resolve()
    work = Path(tempfile.mkdtemp(prefix="benchmark_trainer_loop_"))
    if args.tokenizer is not None:
        from transformers import AutoTokenizer

        AutoTokenizer.from_pretrained(args.tokenizer).save_pretrained(work / "tokenizer")
    else:
        raw = load_parallel({"train": str(data_dir / "train.{lang}.gz")}, config["source_lang"], config["target_lang"])
        tokenizer = train_joint_tokenizer(training_texts(raw["train"], [config["source_lang"], config["target_lang"]]),
                                          vocab_size=config["vocab_size"], model="bpe", model_max_length=128)
        tokenizer.save_pretrained(work / "tokenizer")
    if args.count_shapes:
        paddings = [0, 8] if args.padding_list() == [None] else [n or 0 for n in args.padding_list()]
        counts = count_shapes(str(work / "tokenizer"), data_dir, paddings)
        for name, value in counts.items():
            print(f"{name}: {value['batches']} batches an epoch, {value['distinct_shapes']} distinct (batch, source "
                  f"length, target length) shapes, {100 * value['padding_share']:.1f}% padding tokens", flush=True)
        output = ROOT / args.output
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps({"command": shlex.join(["python", "experiments/benchmark_trainer_loop.py",
                                                              *sys.argv[1:]]), "shapes_per_epoch": counts}, indent=1)
                          + "\n")
        print(f"written to {output}")
        return
    runs = [(m, v) for m in args.model_list() for v in args.variants()]
    rows = args.steps * config["per_device_train_batch_size"] * 2
    tokenized = tokenized_train(work / "tokenizer", data_dir, rows, work / "train_tokenized")
    results: dict[str, list[dict]] = {f"{m}/{label}": [] for m, (label, _, _) in runs}
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1")
    output = ROOT / args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    recipe_fields = ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "vocab_size",
                     "per_device_train_batch_size", "label_smoothing")

    def write_report(complete: bool) -> dict:
        summary = summarize(results, args)
        report = {
            "command": shlex.join(["python", "experiments/benchmark_trainer_loop.py", *sys.argv[1:]]),
            "arguments": asdict(args), "complete": complete, "started": started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "machine": machine(), "loadavg_before": load_before,
            "loadavg_after": os.getloadavg(), "recipe": {k: config[k] for k in recipe_fields}, "note": args.note,
            **summary, "runs": results,
        }
        output.write_text(json.dumps(report, indent=1) + "\n")
        return summary

    for rep in range(args.reps):
        # Each repetition starts one run later in the list, so that no contender always takes the same place (the
        # first run after a pause or after another contender's run was measurably slower).
        for model, (label, precision, padding) in runs[rep % len(runs):] + runs[: rep % len(runs)]:
            family, head_mode, loss_chunk_size = MODELS[model]
            settings = {"family": family, "head_mode": head_mode, "loss_chunk_size": loss_chunk_size,
                        "precision": precision, "steps": args.steps, "skip_steps": args.skip_steps,
                        "num_threads": args.num_threads, "data_dir": str(data_dir),
                        "profile": args.profile, "keep_freed_cpu_memory": args.keep_freed_cpu_memory,
                        "pad_to_multiple_of": padding, "tiny": args.tiny,
                        "tokenizer": str(work / "tokenizer"), "tokenized": tokenized,
                        "output_dir": str(work / f"{model}-{label}")}
            done = subprocess.run([sys.executable, __file__, "--child", json.dumps(settings)], cwd=ROOT, env=env,
                                  capture_output=True, text=True, check=False)
            line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
            if line is None:
                raise RuntimeError(f"{model}/{label} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
            result = {"rep": rep, "loadavg_1min": os.getloadavg()[0], **json.loads(line.removeprefix("RESULT "))}
            results[f"{model}/{label}"].append(result)
            print(f"rep {rep} {model:21s} {label}: {result['tokens_per_s']:8.0f} tokens/s "
                  f"({result['steps_per_s']:.3f} steps/s, load {result['loadavg_1min']:.1f})", flush=True)
            write_report(complete=False)  # a killed benchmark keeps every finished run
    summary = write_report(complete=True)
    print("\nmedian tokens/s (source + target, non-padding):")
    for name, value in summary["median_tokens_per_s"].items():
        print(f"  {name:26s} {value:8.0f}")
    print("ratio of medians, and per repetition: median [min-max]")
    for name, value in summary["ratios"].items():
        paired = summary["paired_ratios"][name]
        print(f"  {name:45s} {value:.3f}   {paired['median']:.3f} [{paired['min']:.2f}-{paired['max']:.2f}]")
    print(f"written to {output}")


if __name__ == "__main__":
    main()
