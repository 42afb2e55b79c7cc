#!/usr/bin/env python
"""Check that sharded training keeps the tied embedding / output layer ONE parameter, for every model family.

    python scripts/verify_fsdp_tie.py                                  # FSDP2, both routes, 2 CPU processes
    python scripts/verify_fsdp_tie.py --routes fsdp2 accelerate zero3 --nproc 4

Launches tests/distributed_worker.py with torch.distributed.run (gloo, CPU) once per route — "fsdp2" (torch
fully_shard through hf_tiednorm.tie_topology.fully_shard_tied), "accelerate" (accelerate's FSDP2 preparation, as
scripts/accelerate/fsdp2.yaml) and "zero3" (DeepSpeed ZeRO-3, scripts/accelerate/deepspeed_zero3.json) — and, for
the Marian-based, BART-based and causal families, prints PASS/FAIL for: the tie after prepare and after training;
losses, every gradient and the regularizers' terms equal to one process trained on the same global batch;
evaluation between steps; the gathered state dict saved with save_pretrained reloading tied with the same logits;
Seq2SeqTrainer predict_with_generate (accelerate route). Exits 1 on any failure. tests/test_distributed.py asserts
the same numbers. The worker runs on CPU processes only: on GPU machines use the launch configs of
scripts/accelerate/ with the training scripts.
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER = REPO_ROOT / "tests" / "distributed_worker.py"
# Measured on 2 CPU processes: within 1e-6 (losses, gradients) and 3e-6 (logits) of one process.
TOLERANCE = {"loss_diff": 1e-5, "grad_diff": 1e-5, "penalty_diff": 1e-5, "logits_diff": 1e-4,
             "cached_logits_diff": 1e-4, "reloaded_logits_diff": 1e-4}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_route(route: str, nproc: int) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "results.json"
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                   "--master_port", str(free_port()), str(WORKER), route, str(out)]
        completed = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            print((completed.stdout + completed.stderr)[-3000:])
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
    parser.add_argument("--nproc", type=int, default=2, help="processes; the global batch of 4 must split evenly")
    args = parser.parse_args()
    failures = []
    for route in args.routes:
        results = run_route(route, args.nproc)
        if not results:
            failures.append(f"{route}: worker failed")
        for family, measured in results.items():
            for name, ok, detail in checks(measured):
                print(f"{'PASS' if ok else 'FAIL'}  {route} {family}: {name}{f'  ({detail})' if detail else ''}")
                if not ok:
                    failures.append(f"{route} {family}: {name}")
    print(f"SUMMARY: {'FAIL' if failures else 'PASS'}" + "".join(f"\n  failed: {name}" for name in failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
