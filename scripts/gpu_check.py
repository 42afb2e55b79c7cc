#!/usr/bin/env python
"""The GPU check: every GPU-facing path of the project in one run that fits one device call of at most 8 minutes on
one H100/H200, with its findings in results/gpu_<gpu>.json (``scripts/gpu_check.sh`` sets up the lent machine and
calls this).

    python scripts/gpu_check.py                       # on a GPU: the steps below, within --budget_s seconds
    python scripts/gpu_check.py --tiny                # on a CPU, CI-sized: the same steps at toy sizes
    python scripts/gpu_check.py --dry_run             # print the plan and its time limits, run nothing

Steps, each its own process under ``timeout`` with a log in --log_dir, in this order:

1. ``main_fp32``: scripts/run_translation.py with the main-job recipe (scripts/configs/multi30k_de_en.yaml) in fp32,
   training capped by --max_train_minutes: exit 0, the test BLEU, and the card and both plots written.
2. ``main_default``: the same with the precision the scripts pick there (bf16 on a GPU with native bf16).
3. ``trainer_loop``: experiments/benchmark_trainer_loop.py, ours vs HF Marian, fp32 vs bf16, with and without the
   padding multiple 8: the measurement of the suspected cause of bf16's 10x slowdown (batch shapes).
4. ``fsdp_tie``: scripts/verify_fsdp_tie.py (FSDP2 and accelerate routes).
5. ``head_loss``: experiments/benchmark_lm_head_loss.py (the LLM-scale head loss of issue 39), when present.

The later steps reuse the first main job's tokenizer (the same data gives the same BPE) when it saved one.
A step that fails or runs out of time is recorded as such and the next one runs; the time left bounds each step's
limit (--budget_s in all), and a step with under 20 s left is skipped. Exit status: 0 when every step that ran
passed, 1 otherwise. The JSON names the GPU (or CPU), torch and CUDA, and holds each step's status, seconds, the
tail of its log and what it measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAIN_CONFIG = "scripts/configs/multi30k_de_en.yaml"
HEAD_LOSS_BENCHMARK = "experiments/benchmark_lm_head_loss.py"
MIN_STEP_SECONDS = 20  # a step with less time left is skipped, not started
# One device call is at most 8 minutes; the lent machine's setup (gpu_check.sh: unpacking wheels) takes ~20 s of it.
DEFAULT_BUDGET_S = 450

# The tiny run's model and data: CI-sized, on the real Multi30k files.
TINY_MAIN_FLAGS = [
    "--max_train_samples", "64", "--max_eval_samples", "8", "--max_predict_samples", "8", "--vocab_size", "300",
    "--d_model", "32", "--encoder_layers", "1", "--decoder_layers", "1", "--encoder_ffn_dim", "64",
    "--decoder_ffn_dim", "64", "--encoder_attention_heads", "2", "--decoder_attention_heads", "2",
    "--num_train_epochs", "1", "--per_device_train_batch_size", "16", "--generation_num_beams", "1",
    "--generation_max_length", "16", "--num_threads", "1", "--save_strategy", "no", "--warmup_steps", "2",
]  # fmt: skip


@dataclass
class Step:
    """One step of the check (not a flag: the fields carry help as every dataclass of scripts/ does)."""

    name: str = field(metadata={"help": "the step's name (--only takes it)"})
    command: list[str] = field(metadata={"help": "the command line it runs"})
    limit_s: int = field(metadata={"help": "its own time limit in seconds (the time left may cut it shorter)"})
    what: str = field(metadata={"help": "what it checks, for the report"})
    output: Path | None = field(default=None, metadata={"help": "a run folder or JSON file the step writes"})
    optional_script: str | None = field(
        default=None, metadata={"help": "a script that may be absent (another issue's): the step is skipped then"}
    )
    results: dict = field(default_factory=dict, metadata={"help": "what the step measured, for the report"})


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps of the check, with their commands and time limits (GPU sizes, or toy ones with --tiny)."""
    py, out = sys.executable, Path(args.work_dir)
    main = [py, "scripts/run_translation.py", MAIN_CONFIG, "--do_eval", "false", "--overwrite_output_dir", "true"]
    if args.tiny:
        main += [*TINY_MAIN_FLAGS]
        loop = ["--models", "ours-baseline,marian", "--precisions", "fp32,bf16", "--pad_to_multiple_of", "0,8",
                "--steps", "3", "--skip_steps", "1", "--reps", "1", "--num_threads", "1", "--tiny", "true"]
        fsdp = ["--device", "cpu", "--routes", "fsdp2"]
        head = ["--device", "cpu", "--dtype", "float32", "--vocab", "512", "--dim", "32", "--tokens", "64",
                "--reps", "1"]
    else:
        main += ["--max_train_minutes", str(args.main_minutes)]
        loop = ["--models", "ours-baseline,marian", "--precisions", "fp32,bf16", "--pad_to_multiple_of", "0,8",
                "--steps", "40", "--skip_steps", "8", "--reps", "1", "--num_threads", "4"]
        fsdp = ["--routes", "fsdp2", "accelerate"]
        head = ["--device", "cuda", "--dtype", "bfloat16", "--vocab", "128256", "--dim", "2048", "--tokens", "8192",
                "--paths", "plain,fused,chunked", "--reps", "3"]
    data = ["--data_dir", args.data_dir] if args.data_dir else []
    return [
        Step("main_fp32", [*main, "--bf16", "false", "--output_dir", str(out / "main_fp32")], 120,
             "the main job end to end in fp32", out / "main_fp32"),
        Step("main_default", [*main, "--output_dir", str(out / "main_default")], 120,
             "the main job end to end in the precision the scripts pick here", out / "main_default"),
        Step("trainer_loop", [py, "experiments/benchmark_trainer_loop.py", *loop, *data,
                              "--output", str(out / "trainer_loop.json"), "--note", "scripts/gpu_check.py"],
             170, "trainer loop tokens/s: ours vs HF Marian, fp32 vs bf16, padding multiple 0 vs 8",
             out / "trainer_loop.json"),
        Step("fsdp_tie", [py, "scripts/verify_fsdp_tie.py", *fsdp], 60, "the tie under FSDP2 / accelerate"),
        Step("head_loss", [py, HEAD_LOSS_BENCHMARK, *head, "--output", str(out / "head_loss.json")], 50,
             "LM-head loss + backward at LLM scale (issue 39)", out / "head_loss.json",
             optional_script=HEAD_LOSS_BENCHMARK),
    ]


def device_description() -> dict:
    import torch

    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"device": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(),
                 "memory_gib": round(props.total_memory / 2**30, 1),
                 "compute_capability": f"{props.major}.{props.minor}",
                 "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False)}
    else:
        from hf_tiednorm.training.precision import cpu_description

        info |= {"device": cpu_description(), "gpus": 0}
    return info


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:40] or "unknown"


def main_job_results(folder: Path) -> dict:
    """What a main-job run left: its test BLEU, precision, steps and epochs, and whether the card and plots exist."""
    found = {"card": (folder / "README.md").is_file(), "plots": sorted(p.name for p in folder.glob("*.png"))}
    for name in ("all_results.json", "train_results.json", "test_results.json"):
        path = folder / name
        if path.is_file():
            metrics = json.loads(path.read_text())
            for key in ("test_bleu", "precision", "train_minutes", "train_runtime", "epoch", "train_loss"):
                if key in metrics:
                    found[key] = metrics[key]
    state = folder / "trainer_state.json"
    if state.is_file():
        found["global_step"] = json.loads(state.read_text()).get("global_step")
    found["complete"] = bool(found["card"] and len(found["plots"]) == 2 and "test_bleu" in found)
    return found


def run_step(step: Step, seconds: int, log_dir: Path, env: dict) -> dict:
    log = log_dir / f"{step.name}.log"
    command = ["timeout", "-k", "10", str(seconds), *step.command]
    start = time.monotonic()
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(command) + "\n")
        handle.flush()
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - start
    status = {0: "pass", 124: "timeout", 137: "timeout"}.get(done.returncode, "fail")
    tail = log.read_text(errors="replace").splitlines()[-15:]
    result = {"status": status, "exit": done.returncode, "seconds": round(elapsed, 1), "limit_s": seconds,
              "log": str(log), "log_tail": tail, "what": step.what}
    if step.output is not None and step.name.startswith("main_"):
        result |= main_job_results(step.output)
        if status == "pass" and not result["complete"]:
            result["status"] = "fail"  # exit 0 without BLEU, card or plots is not the main job working
    elif step.output is not None and step.output.is_file():
        report = json.loads(step.output.read_text())
        keys = ("median_tokens_per_s", "ratios", "machine", "results", "summary")
        result["measured"] = {k: report[k] for k in keys if k in report} or report
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CI-sized steps on a CPU (toy model, a few batches)")
    parser.add_argument("--budget_s", type=int, default=DEFAULT_BUDGET_S, help="seconds for all steps together")
    parser.add_argument("--main_minutes", type=float, default=0.5,
                        help="--max_train_minutes of each main-job run (the run still scores and writes its card)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these steps (names as in the plan)")
    parser.add_argument("--work_dir", default=None, help="run folders and benchmark JSON (default: a temp folder)")
    parser.add_argument("--log_dir", default=None, help="one log per step (default: <work_dir>/logs)")
    parser.add_argument("--output", default=None, help="the report (default: results/gpu_<device>.json)")
    parser.add_argument("--data_dir", default=None, help="Multi30k folder for the trainer-loop benchmark")
    parser.add_argument("--dry_run", action="store_true", help="print the plan and write nothing")
    args = parser.parse_args(argv)
    if args.work_dir is None:
        import tempfile

        args.work_dir = "<work_dir>" if args.dry_run else tempfile.mkdtemp(prefix="gpu_check_")
    steps = plan(args)
    if args.only:
        unknown = set(args.only) - {s.name for s in steps}
        if unknown:
            parser.error(f"--only: unknown steps {sorted(unknown)}; the plan has {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in args.only]
    if args.dry_run:
        for step in steps:
            print(f"{step.name:13s} <= {step.limit_s:3d} s  {shlex.join(step.command)}")
        print(f"budget {args.budget_s} s for {sum(s.limit_s for s in steps)} s of step limits")
        return 0

    work, started = Path(args.work_dir), time.monotonic()
    log_dir = Path(args.log_dir) if args.log_dir else work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    device = device_description()
    if not args.tiny and device["gpus"] == 0:
        print("no GPU here: run with --tiny for the CPU-sized check", file=sys.stderr)
        return 2
    output = Path(args.output) if args.output else ROOT / "results" / f"gpu_{slug(device['device'])}.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    report = {"command": shlex.join(["python", "scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "tiny": args.tiny, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": device,
              "budget_s": args.budget_s, "steps": {}}

    def write() -> None:
        output.parent.mkdir(parents=True, exist_ok=True)
        report["seconds"] = round(time.monotonic() - started, 1)
        output.write_text(json.dumps(report, indent=1, default=str) + "\n")

    for step in steps:
        left = int(args.budget_s - (time.monotonic() - started))
        if step.optional_script and not (ROOT / step.optional_script).is_file():
            result = {"status": "absent", "what": step.what,
                      "note": f"{step.optional_script} is not in this checkout (written in issue 39): not measured"}
        elif left < MIN_STEP_SECONDS and not args.tiny:
            result = {"status": "skipped", "what": step.what, "note": f"out of budget ({left} s left)"}
        else:
            tokenizer = work / "main_fp32" / "tokenizer.json"
            if step.name in ("main_default", "trainer_loop") and tokenizer.is_file():  # the same data, the same BPE
                flag = "--tokenizer_name" if step.name == "main_default" else "--tokenizer"
                step.command = [*step.command, flag, str(tokenizer.parent)]
            # --tiny runs on a CI machine's CPU, maybe a busy one: its steps get 3x their limits, and no budget.
            seconds = 3 * step.limit_s if args.tiny else min(step.limit_s, left)
            result = run_step(step, seconds, log_dir, env)
        report["steps"][step.name] = result
        print(f"{step.name:13s} {result['status']:8s} {result.get('seconds', 0):6.1f} s  {result['what']}",
              flush=True)
        write()
    failed = [name for name, r in report["steps"].items() if r["status"] in ("fail", "timeout")]
    report["passed"] = not failed
    write()
    print(f"{'all steps passed' if not failed else 'FAILED: ' + ', '.join(failed)}; report: {output}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
