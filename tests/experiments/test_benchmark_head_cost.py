"""experiments/benchmark_head_step.py and benchmark_lm_head_loss.py's ratios to the baseline head: a tiny run writes a
complete report, every mode against baseline on the same loss path, in wall and CPU time."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from script_helpers import EXPERIMENTS, REPO_ROOT, run_script

MODES = ("baseline", "l2", "square", "distance", "cosine")


def test_the_step_benchmark_reports_every_mode_against_baseline_on_each_path(tmp_path):
    output = tmp_path / "step.json"
    run_script("benchmark_head_step", [
        "--vocab", "300", "--hidden", "16", "--intermediate", "32", "--heads", "2", "--tokens", "48", "--seq_len", "24",
        "--head_modes", ",".join(MODES), "--reps", "2", "--warmup", "0", "--threads", "1",
        "--keep_freed_cpu_memory", "false", "--output", output,
    ])  # fmt: skip
    report = json.loads(output.read_text())
    assert report["device"].startswith("CPU (") and report["machine"]["cpu_memory"] == "allocator defaults"
    for dtype in ("float32", "bfloat16"):
        table = report["results"][f"{dtype}:N=48"]
        assert set(table) == {f"{mode}:{path}" for mode in MODES for path in ("plain", "fused")}
        for name, row in table.items():
            assert row["time_s"]["n"] == 2 and row["time_ratio"]["min"] > 0 and row["cpu_time_ratio"]["min"] > 0
            if name.startswith("baseline:"):
                assert row["time_ratio"]["median"] == row["cpu_time_ratio"]["median"] == 1.0
        # The same model and batch on both paths: the same loss.
        for mode in MODES:
            assert abs(table[f"{mode}:plain"]["loss"] - table[f"{mode}:fused"]["loss"]) < 0.05


@pytest.mark.slow  # a subprocess (the benchmark sets glibc's mmap threshold process-wide): ~10 s idle, 60 s busy
def test_the_head_loss_benchmark_times_the_fold_alone_and_against_baseline(tmp_path):
    output = tmp_path / "head.json"
    subprocess.run([
        sys.executable, str(EXPERIMENTS / "benchmark_lm_head_loss.py"), "--vocab", "300", "--dim", "16", "--tokens",
        "40", "--dtype", "float32", "--head_modes", "baseline,cosine", "--paths", "plain,fold", "--reps", "2",
        "--threads", "1", "--output", str(output),
    ], check=True, cwd=REPO_ROOT, capture_output=True)  # fmt: skip
    table = json.loads(output.read_text())["results"]["float32:N=40"]
    assert set(table) == {"plain", "baseline:plain", "baseline:fold", "cosine:plain", "cosine:fold"}
    assert table["cosine:fold"]["kernel"] == "fold" and table["cosine:fold"]["time_ratio_to_baseline"]["n"] == 2
    assert table["cosine:plain"]["cpu_time_ratio_to_baseline"]["min"] > 0 and "time_ratio_to_baseline" not in table[
        "plain"]


@pytest.mark.slow  # a subprocess (the benchmark sets glibc's allocator process-wide): ~10 s idle, 60 s busy
def test_the_head_loss_benchmark_times_with_freed_memory_kept_as_training_runs(tmp_path):
    """--cpu_memory keep_freed: glibc keeps freed memory (training's --keep_freed_cpu_memory), so a step's fresh
    (V, d) tensors are not page-faulted anew; no peak is read then, and the report says so."""
    output = tmp_path / "head.json"
    done = subprocess.run([
        sys.executable, str(EXPERIMENTS / "benchmark_lm_head_loss.py"), "--vocab", "300", "--dim", "16", "--tokens",
        "40", "--dtype", "float32", "--head_modes", "baseline,cosine", "--paths", "plain", "--reps", "2",
        "--threads", "1", "--cpu_memory", "keep_freed", "--output", str(output),
    ], check=True, cwd=REPO_ROOT, capture_output=True, text=True)  # fmt: skip
    assert "freed tensor memory stays in the process" in done.stdout
    report = json.loads(output.read_text())
    assert report["args"]["cpu_memory"] == "keep_freed"
    table = report["results"]["float32:N=40"]
    assert set(table) == {"plain", "baseline:plain", "cosine:plain"}
    for row in table.values():
        assert row["peak_mib"] is None and row["memory_ratio"] is None and row["time_ratio"]["n"] == 2
    assert table["cosine:plain"]["time_ratio_to_baseline"]["min"] > 0


def test_the_head_loss_benchmark_refuses_an_unknown_cpu_memory_setting():
    done = subprocess.run([
        sys.executable, str(EXPERIMENTS / "benchmark_lm_head_loss.py"), "--cpu_memory", "keep", "--vocab", "30",
        "--dim", "4", "--tokens", "8", "--reps", "1",
    ], cwd=REPO_ROOT, capture_output=True, text=True)  # fmt: skip
    assert done.returncode != 0 and "--cpu_memory 'keep'" in done.stderr
