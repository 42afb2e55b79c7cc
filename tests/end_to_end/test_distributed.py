"""Sharded training on 2 CPU processes (gloo) keeps the tie and equals one process, for every model family.

Each route runs once (scripts/fsdp_tie_worker.py under torch.distributed.run; the numbers it measures are
asserted here): FSDP2 through torch's ``fully_shard`` (``hf_tiednorm.training.fsdp.fully_shard_tied``)
and through accelerate's own FSDP2 preparation (transformer-based wrapping, as scripts/accelerate/fsdp2.yaml), about 20
s each; DeepSpeed ZeRO-3 is in the slow set. The reference is the same model trained by one process on the whole global
batch with the same SGD steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from script_helpers import subprocess_env
from testing_utils import FAMILIES, tiny_config

WORKER = Path(__file__).resolve().parents[2] / "scripts" / "fsdp_tie_worker.py"
FSDP2_ROUTES = ("fsdp2", "accelerate")
# Measured: losses and gradients within 1e-6 of one process, logits within 3e-6 (float32 sums in another order).
# A gradient summed over the 2 ranks instead of averaged is off by its own size (about 2 here).
TOLERANCE = {"loss_diff": 1e-5, "grad_diff": 1e-5, "penalty_diff": 1e-5, "logits_diff": 1e-4}


def launch(route: str, tmp_path_factory) -> dict:
    """2 CPU processes (--device cpu: the same on GPU machines). --standalone: the launcher's rendezvous store binds
    a port the OS picks and the workers use it (no port picked here, closed, then raced for by other programs).
    Each rank's output goes to its own log file, shown per rank if the launch fails."""
    folder = tmp_path_factory.mktemp(route)
    out, logs = folder / "results.json", folder / "logs"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--log-dir", str(logs), "--redirects", "3", str(WORKER), route, str(out), "--device", "cpu",
    ]
    completed = subprocess.run(
        command, env=subprocess_env(), capture_output=True, text=True, timeout=600, check=False
    )
    assert completed.returncode == 0, failure_report(completed, logs)
    return json.loads(out.read_text())


def failure_report(completed: subprocess.CompletedProcess, logs: Path) -> str:
    """The launcher's summary (which rank failed, exit code or signal) and the end of every rank's stderr (Python
    traceback, or the faulthandler dump of every thread when a rank dies from a signal)."""
    parts = [f"launcher:\n{(completed.stdout + completed.stderr)[-3000:]}"]
    for stderr in sorted(logs.rglob("stderr.log"), key=lambda path: int(path.parent.name)):
        parts.append(f"local rank {stderr.parent.name} stderr:\n{stderr.read_text(errors='replace')[-4000:]}")
    return "\n".join(parts)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict]:
    return {route: launch(route, tmp_path_factory) for route in FSDP2_ROUTES}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("route", FSDP2_ROUTES)
def test_fsdp2_keeps_the_tie(results, route, family):
    measured = results[route][family]
    assert measured["untied_after_prepare"] == []
    assert measured["untied_after_training"] == []


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("route", FSDP2_ROUTES)
def test_fsdp2_trains_like_one_process(results, route, family):
    """Losses, every gradient (the tied one collects lookups and scores), the regularizers' terms (read from
    whole weights) and the logits after training equal the 1-process run on the same global batch."""
    measured = results[route][family]
    for name, tolerance in TOLERANCE.items():
        assert measured[name] <= tolerance, (name, measured)
    assert measured["losses"][-1] < measured["losses"][0] - 0.1  # it trained


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("route", FSDP2_ROUTES)
def test_fsdp2_full_state_dict_reloads_tied(results, route, family):
    """The gathered state dict, through save_pretrained, reloads tied and scores as the 1-process model."""
    measured = results[route][family]
    assert measured["owner_saved"] and measured["reloaded_untied"] == []
    assert measured["reloaded_logits_diff"] <= TOLERANCE["logits_diff"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("route", FSDP2_ROUTES)
def test_head_inference_cache_after_sharded_steps(results, route, family):
    """Evaluations (no_grad, where the head serves cached norms) before and between the sharded steps score as the
    1-process model at the same step: norms cached before a step are not served after FSDP2 refilled the gathered
    weight."""
    measured = results[route][family]
    assert measured["cached_logits_diff"] <= TOLERANCE["logits_diff"]


@pytest.mark.parametrize("family", [family for family in FAMILIES if tiny_config(family).is_encoder_decoder])
def test_seq2seq_trainer_predict_with_generate_under_fsdp2(results, family):
    """Seq2SeqTrainer.predict(predict_with_generate) on the accelerate-FSDP2 model: each rank generates its share
    and the gathered outputs are the 1-process model's greedy outputs."""
    measured = results["accelerate"][family]
    assert len(measured["generated"]) == 4
    assert measured["generated"] == measured["reference_generated"]


# Slow: deepspeed's import and engine set-up take about 30 s on 2 shared cores, and the first run on a machine
# compiles DeepSpeed's shared-memory comm op (about 2.5 minutes).
@pytest.mark.slow
def test_zero3_keeps_the_tie_and_trains_like_one_process(tmp_path_factory):
    """DeepSpeed ZeRO-3 (scripts/accelerate/deepspeed_zero3.json, every parameter partitioned): the tie stays one
    partitioned parameter, the regularizers read whole weights, and the consolidated state dict reloads tied."""
    pytest.importorskip("deepspeed")
    results = launch("zero3", tmp_path_factory)
    for family in FAMILIES:
        measured = results[family]
        assert measured["untied_after_prepare"] == [] and measured["untied_after_training"] == [], family
        for name, tolerance in TOLERANCE.items():
            assert measured[name] <= tolerance, (family, name, measured)
        assert measured["cached_logits_diff"] <= TOLERANCE["logits_diff"], family
        # Stored once: the tied keys alias the owner's storage in the consolidated state dict.
        assert measured["owner_saved"] and measured["tied_keys_saved"] == [], family
        assert measured["reloaded_untied"] == [] and measured["reloaded_logits_diff"] <= TOLERANCE["logits_diff"]
