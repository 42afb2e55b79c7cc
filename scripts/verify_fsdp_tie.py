#!/usr/bin/env python
"""Check that sharded training keeps the tied embedding / output layer ONE parameter, for every model family.

    python scripts/verify_fsdp_tie.py                        # FSDP2, both routes: every GPU, or 2 CPU processes
    python scripts/verify_fsdp_tie.py --routes fsdp2 accelerate zero3 --nproc 4
    python scripts/verify_fsdp_tie.py --device cpu           # CPU processes (gloo) even where there are GPUs

Launches scripts/fsdp_tie_worker.py with torch.distributed.run once per route — "fsdp2" (torch fully_shard
through hf_tiednorm.training.fsdp.fully_shard_tied), "accelerate" (accelerate's FSDP2 preparation, as
scripts/accelerate/fsdp2.yaml) and "zero3" (DeepSpeed ZeRO-3, scripts/accelerate/deepspeed_zero3.json) — and, for
the Marian-based, BART-based and causal families, prints PASS/FAIL for: the tie after prepare and after training;
losses, every gradient and the regularizers' terms equal to one process trained on the same global batch;
evaluation between steps; the gathered state dict saved with save_pretrained reloading tied with the same logits;
Seq2SeqTrainer predict_with_generate (accelerate route). Exits 1 on any failure. A route whose library is not
installed (zero3 without DeepSpeed: ``pip install -e ".[deepspeed]"``) is skipped and says so: it is no failure.
tests/end_to_end/test_distributed.py asserts the same numbers on 2 CPU processes.

Where CUDA is available (and --device cpu is not given) one process per GPU (--nproc, default: all visible GPUs)
runs on its own GPU over nccl; otherwise CPU processes over gloo (--nproc default 2). Each process trains on 2
examples, so the global batch is 2 x processes; the reference run is the unsharded model on the same device.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).resolve().parent / "fsdp_tie_worker.py"
# The package a route needs beyond the install's own, with the extra that installs it.
ROUTE_NEEDS = {"zero3": ("deepspeed", 'pip install -e ".[deepspeed]"')}
# Measured on 2 CPU processes: within 1e-6 (losses, gradients) and 3e-6 (logits) of one process. Not measured on
# GPUs yet (no GPU machine so far); float32 without TF32 there, so the same bounds are expected to hold.
TOLERANCE = {"loss_diff": 1e-5, "grad_diff": 1e-5, "penalty_diff": 1e-5, "logits_diff": 1e-4,
             "cached_logits_diff": 1e-4, "reloaded_logits_diff": 1e-4}


def pick_device(requested: str) -> str:
    """"cuda" when asked, or by default when CUDA is available; "cpu" otherwise. The worker follows this choice."""
    if requested != "auto":
        return requested
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def default_nproc(device: str) -> int:
    if device == "cuda":
        import torch

        return torch.cuda.device_count()
    return 2


def missing_library(route: str) -> str | None:
    """Why ``route`` cannot run here (its library is not installed), or None when it can."""
    if route in ROUTE_NEEDS and importlib.util.find_spec(ROUTE_NEEDS[route][0]) is None:
        package, install = ROUTE_NEEDS[route]
        return f"{package} is not installed ({install})"
    return None


def run_route(route: str, nproc: int, device: str) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out, logs = Path(folder) / "results.json", Path(folder) / "logs"
        # --standalone: the launcher's rendezvous store binds a port the OS picks (no port chosen here and then
        # raced for by another program), and the workers use that store. Each rank's output goes to its own file.
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                   "--log-dir", str(logs), "--redirects", "3", str(WORKER), route, str(out), "--device", device]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            print((completed.stdout + completed.stderr)[-3000:])
            for stderr in sorted(logs.rglob("stderr.log"), key=lambda path: int(path.parent.name)):
                print(f"--- local rank {stderr.parent.name} stderr:\n{stderr.read_text(errors='replace')[-3000:]}")
            return {}
        return json.loads(out.read_text())


def checks(measured: dict) -> list[tuple[str, bool, str]]:
    """(name, ok, detail) for one family's measurements."""
    rows = [
        ("tie intact after prepare", measured["untied_after_prepare"] == [], str(measured["untied_after_prepare"])),
        ("tie intact after training", measured["untied_after_training"] == [], str(measured["untied_after_training"])),
        ("saved model reloads tied", measured["reloaded_untied"] == [] and measured["owner_saved"], ""),
    ]
    rows += [(f"{name} <= {limit:g}", measured[name] <= limit, f"{measured[name]:.2e}") for name, limit in
             TOLERANCE.items()]
    if "generated" in measured:
        rows.append(("predict_with_generate = 1-process outputs",
                     measured["generated"] == measured["reference_generated"], ""))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    routes = ["fsdp2", "accelerate", "zero3"]
    parser.add_argument("--routes", nargs="+", default=routes[:2], choices=routes)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto (default): one process per GPU over nccl when CUDA is available, else CPU (gloo)")
    parser.add_argument("--nproc", type=int, default=None,
                        help="processes (default: the number of GPUs on cuda, 2 on cpu); at most one per GPU")
    args = parser.parse_args()
    device = pick_device(args.device)
    nproc = args.nproc or default_nproc(device)
    if device == "cuda" and not 0 < nproc <= default_nproc(device):
        parser.error(f"--device cuda: {nproc} processes for {default_nproc(device)} visible GPUs (one per GPU)")
    print(f"{nproc} {'GPU' if device == 'cuda' else 'CPU'} processes ({'nccl' if device == 'cuda' else 'gloo'})")
    failures, skipped = [], []
    for route in args.routes:
        if reason := missing_library(route):
            print(f"SKIP  {route}: {reason}")
            skipped.append(f"{route}: {reason}")
            continue
        results = run_route(route, nproc, device)
        if not results:
            failures.append(f"{route}: worker failed")
        for family, measured in results.items():
            for name, ok, detail in checks(measured):
                print(f"{'PASS' if ok else 'FAIL'}  {route} {family}: {name}{f'  ({detail})' if detail else ''}")
                if not ok:
                    failures.append(f"{route} {family}: {name}")
    verdict = "FAIL" if failures else "PASS" if len(skipped) < len(args.routes) else "NOTHING CHECKED"
    print(f"SUMMARY: {verdict}" + "".join(f"\n  failed: {name}" for name in failures)
          + "".join(f"\n  skipped: {name}" for name in skipped))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
