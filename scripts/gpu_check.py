#!/usr/bin/env python
"""The GPU check: every GPU-facing path of the project in one device call (at most 10 minutes, of which the lent machine
returns at most 8 files of 16 MiB, 2 folders deep), with its findings in results/gpu_<gpu>.json
(``scripts/gpu_check.sh`` sets up the lent machine, bounds the whole call and calls this).

    python scripts/gpu_check.py                       # on a GPU: the steps below, within --budget_s seconds
    python scripts/gpu_check.py --tiny                # on a CPU, CI-sized: the same steps at toy sizes
    python scripts/gpu_check.py --dry_run             # print the plan and its time limits, run nothing
    python scripts/gpu_check.py --out_dir $OUT        # also the report and one capped log per step under $OUT

First a **preflight** (``--preflight_s``, 30 s): one process imports every module the steps need (and checks that
each wheel carried in .whl is the version imported), printing one line per missing module with the wheel to carry;
nothing runs when one is missing. Then the steps, each its own process under ``timeout``, the ones that answer open
questions first:

1. ``head_loss``: experiments/benchmark_lm_head_loss.py, every mode's LM-head loss + backward at LLM scale
   (V = 128,256, d = 2,048, bf16), plain, fused and chunked paths against plain ``F.linear`` + cross-entropy;
2. ``trainer_loop``: experiments/benchmark_trainer_loop.py, ours vs HF Marian, fp32 vs bf16, with and without the
   padding multiple 8 (tokens/s: the suspected cause of bf16's 10x slowdown, batch shapes);
3. ``fsdp_tie``: scripts/verify_fsdp_tie.py (FSDP2 and accelerate routes);
4. ``main_fp32``: scripts/run_translation.py with the main-job recipe (scripts/configs/multi30k_de_en.yaml) in fp32,
   training capped by --main_minutes, no checkpoints: exit 0, the test BLEU, and the card and both plots written;
5. ``main_default``: the same with the precision the scripts pick there (bf16 on a GPU with native bf16), reusing the
   first main job's tokenizer.

Run folders (29 MiB models, checkpoints) go to --work_dir, never to --out_dir. A step that fails or runs out of time
is recorded as such and the next one runs; the time left bounds each step's limit (--budget_s in all), and a step
with under 20 s left is skipped. The report says ``"passed": true`` (exit 0) only when every planned step ran and
passed: a skipped or absent step, or a plan with nothing run, is not a pass. The JSON names the GPU (or CPU), torch
and CUDA, and holds each step's status, seconds, the tail of its log and what it measured.
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
# One device call is at most 600 s. gpu_check.sh ends the whole call at CALL_LIMIT_S (+ 5 s to kill), before that; its
# setup (unpacking the carried wheels) has SETUP_S, the preflight PREFLIGHT_S, the steps DEFAULT_BUDGET_S: together
# PLANNED_S, which leaves the rest of CALL_LIMIT_S for the interpreter starts and the report.
DEVICE_CALL_S, CALL_LIMIT_S, PLANNED_S = 600, 580, 540
SETUP_S, PREFLIGHT_S = 45, 30
DEFAULT_BUDGET_S = PLANNED_S - SETUP_S - PREFLIGHT_S
# What the device returns from $OUT: at most 8 files, 16 MiB each, 2 folders deep. A step's log is kept under LOG_CAP
# bytes (its head and its tail); the report is one JSON file; run folders stay in --work_dir.
OUT_MAX_FILES, OUT_MAX_BYTES, LOG_CAP = 8, 16 * 2**20, 2 * 2**20

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
    needs: tuple[str, ...] = field(default=(), metadata={"help": "modules it imports (the preflight checks them)"})
    result_lines: str = field(
        default="", metadata={"help": "a regex of the log lines that are its result (a step without a JSON output)"}
    )
    results: dict = field(default_factory=dict, metadata={"help": "what the step measured, for the report"})


# What every step imports, directly or through datasets / evaluate / the plots, for the preflight: a module missing on a
# lent machine is found in one line before anything runs, not by each step dying in turn.
COMMON_NEEDS = ("torch", "transformers", "accelerate", "safetensors", "huggingface_hub", "tokenizers", "yaml",
                "numpy", "hf_tiednorm", "hf_tiednorm.training.precision")
DATA_NEEDS = ("datasets", "pyarrow", "pandas", "xxhash", "requests", "dill", "multiprocess", "fsspec",
              "hf_tiednorm.training.data", "hf_tiednorm.training.trainers")
MAIN_NEEDS = (*DATA_NEEDS, "evaluate", "sacrebleu", "matplotlib", "hf_tiednorm.training.plots",
              "hf_tiednorm.training.steps")
# Where a module's wheel has another name than the module.
WHEEL_NAMES = {"yaml": "pyyaml", "sklearn": "scikit-learn", "PIL": "pillow", "liger_kernel": "liger-kernel",
               "hf_xet": "hf-xet", "google": "protobuf"}


def plan(args: argparse.Namespace) -> list[Step]:
    """The steps of the check, in running order, with their commands and time limits (GPU sizes, or toy ones with
    --tiny). The limits add up to DEFAULT_BUDGET_S."""
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
        # No checkpoint: the recipe saves every epoch (a 29 MiB model each); the card, plots and BLEU come at the end.
        main += ["--max_train_minutes", str(args.main_minutes), "--save_strategy", "no"]
        loop = ["--models", "ours-baseline,marian", "--precisions", "fp32,bf16", "--pad_to_multiple_of", "0,8",
                "--steps", "40", "--skip_steps", "8", "--reps", "1", "--num_threads", "4"]
        fsdp = ["--routes", "fsdp2", "accelerate"]
        head = ["--device", "cuda", "--dtype", "bfloat16", "--vocab", "128256", "--dim", "2048", "--tokens", "8192",
                "--head_modes", "baseline,l2,square,distance,cosine", "--paths", "plain,fused,chunked", "--reps", "3"]
    data = ["--data_dir", args.data_dir] if args.data_dir else []
    return [
        Step("head_loss", [py, HEAD_LOSS_BENCHMARK, *head, "--output", str(out / "head_loss.json")], 60,
             "LM-head loss + backward at LLM scale, every mode and path (issue 39)", out / "head_loss.json",
             optional_script=HEAD_LOSS_BENCHMARK, needs=("hf_tiednorm.modeling.loss.policy",)),
        Step("trainer_loop", [py, "experiments/benchmark_trainer_loop.py", *loop, *data,
                              "--output", str(out / "trainer_loop.json"), "--note", "scripts/gpu_check.py"],
             150, "trainer loop tokens/s: ours vs HF Marian, fp32 vs bf16, padding multiple 0 vs 8",
             out / "trainer_loop.json", needs=DATA_NEEDS),
        Step("fsdp_tie", [py, "scripts/verify_fsdp_tie.py", *fsdp], 45, "the tie under FSDP2 / accelerate",
             needs=("torch.distributed.fsdp",), result_lines=r"(PASS|FAIL|SKIP|SUMMARY)\b"),
        Step("main_fp32", [*main, "--bf16", "false", "--output_dir", str(out / "main_fp32")], 105,
             "the main job end to end in fp32", out / "main_fp32", needs=MAIN_NEEDS),
        Step("main_default", [*main, "--output_dir", str(out / "main_default")], 105,
             "the main job end to end in the precision the scripts pick here", out / "main_default", needs=MAIN_NEEDS),
    ]


def wheel_name(module: str) -> str:
    top = module.split(".")[0]
    return WHEEL_NAMES.get(top, top.replace("_", "-"))


_PREFLIGHT_CODE = """
import importlib, importlib.metadata, json, os, sys
os.environ.setdefault("MPLBACKEND", "Agg")
missing = []
for module in json.loads(sys.argv[1]):
    try:
        importlib.import_module(module)
    except ImportError as error:  # ModuleNotFoundError.name: the module actually missing (e.g. pandas for datasets)
        missing.append({"module": module, "missing": getattr(error, "name", None) or module, "error": str(error)})
    except Exception as error:  # an installed module that fails on import (a version clash) is as fatal
        missing.append({"module": module, "missing": module, "error": f"{type(error).__name__}: {error}"})
carried = []
for name, version in json.loads(sys.argv[2]):
    try:
        found = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        found = None
    if found != version:
        carried.append({"wheel": f"{name}=={version}", "found": found})
print(json.dumps({"missing": missing, "carried": carried}))
"""


def carried_wheels(folder: Path) -> list[tuple[str, str]]:
    """(distribution, version) of every wheel in ``folder`` (.whl: what gpu_check.sh installs into /tmp/site)."""
    found = []
    for wheel in sorted(folder.glob("*.whl")):
        name, version = wheel.name.split("-")[:2]
        found.append((name, version))
    return found


def preflight(steps: list[Step], env: dict, timeout_s: int = PREFLIGHT_S) -> dict:
    """Import every module the steps need in one fresh process (under ``timeout_s``) and check that every carried
    wheel is the version imported. Returns {"ok", "seconds", "missing": [...], "carried": [...], "lines": [...]}, the
    lines being what to print: one per missing module, naming it, the steps that need it and the wheel to carry."""
    modules = list(dict.fromkeys(m for step in [Step("common", [], 0, "", needs=COMMON_NEEDS), *steps]
                                 for m in step.needs))
    users = {m: [s.name for s in steps if m in s.needs] or ["every step"] for m in modules}
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", _PREFLIGHT_CODE, json.dumps(modules),
                               json.dumps(carried_wheels(ROOT / ".whl"))], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=timeout_s, check=False)
        found = json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else None
        problem = None if found is not None else f"the import process exited {done.returncode}: {done.stderr[-500:]}"
    except subprocess.TimeoutExpired:
        found, problem = None, f"importing the steps' modules took over {timeout_s} s"
    result = {"seconds": round(time.monotonic() - start, 1), "modules": modules, "missing": [], "carried": []}
    if found is None:
        return result | {"ok": False, "lines": [f"preflight: {problem}"]}
    lines, by_missing = [], {}
    for entry in found["missing"]:
        by_missing.setdefault(entry["missing"], []).append(entry)
    for name, entries in by_missing.items():
        needed_by = sorted({user for e in entries for user in users[e["module"]]})
        via = sorted({e["module"] for e in entries} - {name})
        lines.append(f"preflight: missing module {name}{f' (imported by {chr(44).join(via)})' if via else ''}, needed "
                     f"by {', '.join(needed_by)}: carry the wheel {wheel_name(name)} in .whl "
                     f"(pip download --no-deps {wheel_name(name)} -d .whl); {entries[0]['error']}")
    for entry in found["carried"]:
        lines.append(f"preflight: the carried wheel {entry['wheel']} is not what imports here (found "
                     f"{entry['found']}): it did not install into the path")
    return result | {"ok": not lines, "missing": found["missing"], "carried": found["carried"], "lines": lines}


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


def cap_log(log: Path, cap: int | None = None) -> None:
    """Keep ``log`` under ``cap`` bytes (``LOG_CAP``): its first quarter and its last three quarters, with a line
    saying how much was cut (the device returns files of 16 MiB at most)."""
    cap = LOG_CAP if cap is None else cap
    size = log.stat().st_size
    if size <= cap:
        return
    data = log.read_bytes()
    head, tail = data[: cap // 4], data[-(cap - cap // 4 - 200):]
    log.write_bytes(head + f"\n[... {size - len(head) - len(tail)} bytes cut by gpu_check.py ...]\n".encode() + tail)


def run_step(step: Step, seconds: int, log_dir: Path, env: dict) -> dict:
    log = log_dir / f"{step.name}.log"
    command = ["timeout", "-k", "10", str(seconds), *step.command]
    start = time.monotonic()
    with log.open("w") as handle:
        handle.write("$ " + shlex.join(command) + "\n")
        handle.flush()
        done = subprocess.run(command, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, check=False)
    elapsed = time.monotonic() - start
    cap_log(log)
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
        keys = ("median_tokens_per_s", "ratios", "paired_ratios", "device", "machine", "results", "summary")
        result["measured"] = {k: report[k] for k in keys if k in report} or report
    elif step.output is not None and status == "pass":
        result |= {"status": "fail", "note": f"exit 0 without writing {step.output.name}: nothing measured"}
    elif step.result_lines:
        lines = [line for line in log.read_text(errors="replace").splitlines() if re.match(step.result_lines, line)]
        result["measured"] = {"lines": lines}
        if status == "pass" and not lines:
            result |= {"status": "fail", "note": "exit 0 without a result line: nothing checked"}
    return result


def report_verdict(results: dict[str, dict]) -> tuple[bool, str]:
    """(passed, one line): passed only when at least one step ran and every planned step ran and passed."""
    failed = [name for name, r in results.items() if r["status"] in ("fail", "timeout")]
    not_run = [name for name, r in results.items() if r["status"] not in ("pass", "fail", "timeout")]
    if failed:
        return False, f"FAILED: {', '.join(failed)}" + (f"; not run: {', '.join(not_run)}" if not_run else "")
    if not_run or not results:
        return False, f"INCOMPLETE: not run: {', '.join(not_run) or 'every step (none planned)'}"
    return True, f"all {len(results)} steps passed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="CI-sized steps on a CPU (toy model, a few batches)")
    parser.add_argument("--budget_s", type=int, default=DEFAULT_BUDGET_S, help="seconds for all steps together")
    parser.add_argument("--main_minutes", type=float, default=0.5,
                        help="--max_train_minutes of each main-job run (the run still scores and writes its card)")
    parser.add_argument("--only", nargs="+", default=None, help="run only these steps (names as in the plan)")
    parser.add_argument("--work_dir", default=None,
                        help="run folders and benchmark JSON (default: a temp folder); never inside --out_dir")
    parser.add_argument("--out_dir", default=None,
                        help="what the device call returns: the report and one capped log per step (<= 8 files)")
    parser.add_argument("--log_dir", default=None,
                        help="one log per step (default: <out_dir>/logs, else <work_dir>/logs)")
    parser.add_argument("--output", default=None, help="the report (default: results/gpu_<device>.json)")
    parser.add_argument("--data_dir", default=None, help="Multi30k folder for the trainer-loop benchmark")
    parser.add_argument("--preflight_s", type=int, default=PREFLIGHT_S, help="time limit of the preflight's imports")
    parser.add_argument("--dry_run", action="store_true", help="print the plan and write nothing")
    args = parser.parse_args(argv)
    if args.work_dir is None:
        import tempfile

        args.work_dir = "<work_dir>" if args.dry_run else tempfile.mkdtemp(prefix="gpu_check_")
    out_dir = Path(args.out_dir).resolve() if args.out_dir else None
    if out_dir is not None and out_dir in (Path(args.work_dir).resolve(), *Path(args.work_dir).resolve().parents):
        parser.error(f"--work_dir {args.work_dir} is inside --out_dir {out_dir}: its run folders would not come back "
                     "(the device returns 8 files)")
    steps = plan(args)
    if args.only:
        unknown = set(args.only) - {s.name for s in steps}
        if unknown:
            parser.error(f"--only: unknown steps {sorted(unknown)}; the plan has {[s.name for s in steps]}")
        steps = [s for s in steps if s.name in args.only]
    if args.dry_run:
        for step in steps:
            print(f"{step.name:13s} <= {step.limit_s:3d} s  {shlex.join(step.command)}")
        print(f"budget {args.budget_s} s for {sum(s.limit_s for s in steps)} s of step limits, after {SETUP_S} s of "
              f"setup and {args.preflight_s} s of preflight")
        return 0

    work, started = Path(args.work_dir), time.monotonic()
    log_dir = Path(args.log_dir) if args.log_dir else (out_dir or work) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    device = device_description()
    print(f"device: {device['device']}, torch {device['torch']}, CUDA {device['cuda']}, {device['gpus']} GPU(s)",
          flush=True)
    if not args.tiny and device["gpus"] == 0:
        print("no GPU here: run with --tiny for the CPU-sized check", file=sys.stderr)
        return 2
    output = Path(args.output) if args.output else ROOT / "results" / f"gpu_{slug(device['device'])}.json"
    copies = [output] + ([out_dir / output.name] if out_dir is not None else [])
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), str(ROOT)) if p)
    report = {"command": shlex.join(["python", "scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])]),
              "tiny": args.tiny, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "machine": device,
              "budget_s": args.budget_s, "passed": False, "steps": {}}

    def write() -> None:  # after every step: a call cut short still returns what was measured
        report["seconds"] = round(time.monotonic() - started, 1)
        for path in copies:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(report, indent=1, default=str) + "\n")

    # --tiny: 3x the limit, as for its steps (a busy CI CPU imports torch + transformers + datasets in ~20 s).
    report["preflight"] = checked = preflight(steps, env, args.preflight_s * (3 if args.tiny else 1))
    for line in checked["lines"]:
        print(line, flush=True)
    if not checked["ok"]:
        report["verdict"] = "FAILED: preflight (no step ran)"
        write()
        print(f"{report['verdict']}; report: {output}")
        return 1
    print(f"preflight: {len(checked['modules'])} modules import ({checked['seconds']} s)", flush=True)
    started = time.monotonic()  # the budget is the steps'
    for step in steps:
        left = int(args.budget_s - (time.monotonic() - started))
        if step.optional_script and not (ROOT / step.optional_script).is_file():
            result = {"status": "absent", "what": step.what,
                      "note": f"{step.optional_script} is not in this checkout (written in issue 39): not measured"}
        elif left < MIN_STEP_SECONDS and not args.tiny:
            result = {"status": "skipped", "what": step.what, "note": f"out of budget ({left} s left)"}
        else:
            tokenizer = work / "main_fp32" / "tokenizer.json"
            if step.name == "main_default" and tokenizer.is_file():  # the same data, the same BPE
                step.command = [*step.command, "--tokenizer_name", str(tokenizer.parent)]
            # --tiny runs on a CI machine's CPU, maybe a busy one: its steps get 3x their limits, and no budget.
            seconds = 3 * step.limit_s if args.tiny else min(step.limit_s, left)
            result = run_step(step, seconds, log_dir, env)
        report["steps"][step.name] = result
        print(f"{step.name:13s} {result['status']:8s} {result.get('seconds', 0):6.1f} s  {result['what']}",
              flush=True)
        write()
    report["passed"], report["verdict"] = report_verdict(report["steps"])
    write()
    print(f"{report['verdict']}; report: {output}")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
