"""experiments/benchmark_speed.py: --quick runs end to end and writes a complete, consistent report."""

from __future__ import annotations

import json
import math
import re
import statistics

import pytest
from script_helpers import EXPERIMENTS, run_script

from hf_tiednorm import HEAD_MODES

CONTENDERS = [f"seq2seq:{mode}" for mode in HEAD_MODES] + ["seq2seq:hf_marian", "causal:baseline", "causal:hf_llama"]
TASKS = {"train", "greedy_b1", "greedy_b4", "beam4_b1", "beam4_b4"}


def test_quick_benchmark_report(tmp_path, monkeypatch):
    output = tmp_path / "speed.json"
    run_script("benchmark_speed", ["--quick", "--device", "cpu", "--threads", "1", "--output", output], monkeypatch)
    report = json.loads(output.read_text())
    # Neither the script nor its report cites the project's issue tracker (readers of a benchmark have no access).
    for text in (output.read_text(), (EXPERIMENTS / "benchmark_speed.py").read_text()):
        assert not re.search(r"(?i)\bissues?\s*#?\d|\(#\d", text)

    assert report["machine"]["cpu_count"] >= 1 and report["machine"]["torch"]
    assert report["machine"]["cpu_memory"].startswith("CPU memory: ")  # what cpu_memory.keep_freed_memory did
    assert report["peak_flops"]["float32"] > 0
    reps = report["args"]["reps"]
    result = report["sizes"]["quick"]
    assert list(result["contenders"]) == CONTENDERS
    assert set(result["times_s"]) == TASKS
    for task in TASKS:
        for name in CONTENDERS:
            times = result["times_s"][task][name]["all"]
            assert len(times) == reps and all(t > 0 for t in times)
            assert len(result["minor_page_faults_per_call"][task][name]["all"]) == reps

    contenders = result["contenders"]
    assert all(c["tied"] for c in contenders.values())
    # Same dims: our models train exactly the parameters of their HF parent (tied W counted once) ...
    assert contenders["seq2seq:baseline"]["parameters"] == contenders["seq2seq:hf_marian"]["parameters"]
    assert contenders["causal:baseline"]["parameters"] == contenders["causal:hf_llama"]["parameters"]
    # ... and the same matmuls: the head modes only add O(V) and elementwise work, which is not a matmul FLOP.
    seq2seq_flops = {contenders[name]["train_flops_per_step"] for name in CONTENDERS if name.startswith("seq2seq")}
    assert len(seq2seq_flops) == 1
    causal_flops = {contenders[name]["train_flops_per_step"] for name in ("causal:baseline", "causal:hf_llama")}
    assert len(causal_flops) == 1
    dims, args = result["dims"], report["args"]
    head_flops = 6 * dims["vocab"] * dims["d_model"] * args["train_batch"] * args["seq_len"]  # the head alone
    assert seq2seq_flops.pop() > head_flops
    assert all(c["train_flops_per_s"] > 0 for c in contenders.values())

    # 4 mode ratios + 2 parent ratios per task, all finite positive and consistent summaries.
    assert len(result["ratios"]) == len(TASKS) * (len(HEAD_MODES) - 1 + 2)
    expected_pairs = {(f"seq2seq:{mode}", "seq2seq:baseline") for mode in HEAD_MODES if mode != "baseline"}
    expected_pairs |= {("seq2seq:hf_marian", "seq2seq:baseline"), ("causal:hf_llama", "causal:baseline")}
    for task in TASKS:
        pairs = {(r["numerator"], r["denominator"]) for r in result["ratios"] if r["task"] == task}
        assert pairs == expected_pairs, task
    for r in result["ratios"]:
        s = r["ratio"]
        assert s["n"] == reps
        assert all(math.isfinite(v) and v > 0 for v in (s["median"], s["min"], s["max"]))
        assert s["min"] <= s["median"] <= s["max"]
        # The ratio is taken per repetition from the reported times, and "met" is its median against the target.
        numerators = result["times_s"][r["task"]][r["numerator"]]["all"]
        denominators = result["times_s"][r["task"]][r["denominator"]]["all"]
        per_rep = [n / d for n, d in zip(numerators, denominators)]
        assert s["median"] == pytest.approx(statistics.median(per_rep), rel=1e-12)
        assert (s["min"], s["max"]) == pytest.approx((min(per_rep), max(per_rep)), rel=1e-12)
        higher_is_better = r["numerator"].startswith(("seq2seq:hf_", "causal:hf_"))  # parent time / our time
        direction, target = r["target"].split()
        assert direction == (">=" if higher_is_better else "<=")
        assert r["met"] is (s["median"] >= float(target) if higher_is_better else s["median"] <= float(target))


def test_unknown_size_is_refused(monkeypatch):
    with pytest.raises(ValueError, match="--sizes"):
        run_script("benchmark_speed", ["--sizes", "huge"], monkeypatch)
