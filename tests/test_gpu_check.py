"""scripts/gpu_check.py / gpu_check.sh: the one-call GPU check of issue 38, planned within one 8-minute device call and
run end to end at toy size on the CPU (--tiny)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from script_helpers import load_script, subprocess_env
from testing_utils import REPO_ROOT

DEVICE_CALL_S = 8 * 60


def test_the_gpu_check_plans_every_step_within_one_device_call(capsys):
    check = load_script("gpu_check")
    assert check.main(["--dry_run"]) == 0
    plan = capsys.readouterr().out
    names = ["main_fp32", "main_default", "trainer_loop", "fsdp_tie", "head_loss"]
    assert [line.split()[0] for line in plan.splitlines()[:-1]] == names
    assert check.DEFAULT_BUDGET_S + 20 <= DEVICE_CALL_S  # + the wheels' setup in gpu_check.sh
    for step in check.plan(check.argparse.Namespace(tiny=False, work_dir="w", data_dir=None, main_minutes=1.0)):
        script = step.command[1]
        assert (REPO_ROOT / script).is_file() or script == step.optional_script, script
    assert "--bf16 false" in plan.splitlines()[0] and "--bf16" not in plan.splitlines()[1]  # fp32, then its pick
    assert "--pad_to_multiple_of 0,8" in plan and "--precisions fp32,bf16" in plan and "marian" in plan


def test_the_gpu_check_refuses_an_unknown_step():
    with pytest.raises(SystemExit):
        load_script("gpu_check").main(["--dry_run", "--only", "nope"])


def test_main_job_results_need_bleu_card_and_both_plots(tmp_path):
    check = load_script("gpu_check")
    (tmp_path / "all_results.json").write_text(json.dumps({"test_bleu": 12.5, "precision": "fp32"}))
    (tmp_path / "README.md").write_text("card")
    (tmp_path / "embedding_norms.png").write_bytes(b"")
    assert not check.main_job_results(tmp_path)["complete"]  # one plot missing: the old GPU failure left none
    (tmp_path / "embedding_norms_vs_frequency.png").write_bytes(b"")
    found = check.main_job_results(tmp_path)
    assert found["complete"] and found["test_bleu"] == 12.5 and found["precision"] == "fp32"


# Slow: it runs every step of the check as its own process on the CPU (two tiny training runs with scoring, the
# FSDP2 check on 2 processes, 8 trainer-loop runs of a toy model): about 4 minutes on a busy 2-core machine.
@pytest.mark.slow
def test_the_tiny_gpu_check_runs_every_step_on_a_cpu(tmp_path, multi30k_dir):
    report_path = tmp_path / "gpu_tiny.json"
    done = subprocess.run(
        ["bash", "scripts/gpu_check.sh", "--tiny", "--output", str(report_path), "--work_dir", str(tmp_path / "w")],
        cwd=REPO_ROOT, env=subprocess_env() | {"PYTHON": sys.executable}, capture_output=True, text=True,
        timeout=1200, check=False,
    )
    report = json.loads(report_path.read_text())
    assert done.returncode == 0, (done.stdout[-3000:], json.dumps(report["steps"], indent=1)[-4000:])
    steps = report["steps"]
    for name in ("main_fp32", "main_default"):
        assert steps[name]["status"] == "pass" and steps[name]["complete"], steps[name]
        assert steps[name]["card"] and len(steps[name]["plots"]) == 2 and "test_bleu" in steps[name]
    assert steps["main_fp32"]["precision"] == "fp32"
    assert steps["trainer_loop"]["status"] == "pass" and steps["trainer_loop"]["measured"]["median_tokens_per_s"]
    assert steps["fsdp_tie"]["status"] == "pass"
    assert steps["head_loss"]["status"] in ("pass", "absent")
    assert report["passed"] and report["machine"]["gpus"] == 0 and report["tiny"]
