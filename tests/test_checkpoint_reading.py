"""A checkpoint is complete only if it can be read (issue 34 §2): truncated torch archives and weights lacking a
model tensor are found before any data work; `last` falls back to the newest readable checkpoint, naming the one it
skips; an explicit path is refused naming the file. Tiny data made in code."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file
from script_helpers import load_script, run_script, tiny_translation_flags

from hf_tiednorm.training.checkpoint_reading import archive_problem, missing_weight_names


@pytest.fixture(scope="module")
def two_checkpoints(data_flags, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("two_checkpoints")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_steps", "1",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_truncated_archive_is_refused_by_name_and_last_falls_back(two_checkpoints, data_flags, tmp_path,
                                                                    monkeypatch, caplog, name):
    """It passed as complete; `last` picked it and the run died after data preparation naming no file."""
    output_dir = tmp_path / "run"
    shutil.copytree(two_checkpoints, output_dir)
    truncate(output_dir / "checkpoint-2" / name)
    assert name in archive_problem(output_dir / "checkpoint-2" / name)
    module = load_script("run_translation")
    with monkeypatch.context() as patched:
        patched.setattr(module, "load_parallel", lambda *a, **k: pytest.fail("data loaded before the check"))
        with pytest.raises(ValueError, match=rf"checkpoint-2 is incomplete \({name.replace('.', '[.]')} "):
            run_script("run_translation", tiny_translation_flags(
                data_flags, output_dir, "--do_train", "--max_steps", "3", "--resume_from_checkpoint",
                output_dir / "checkpoint-2",
            ), monkeypatch)
    with caplog.at_level("WARNING"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_strategy", "no",
            "--resume_from_checkpoint", "last",
        ), monkeypatch)
    assert "skipping" in caplog.text and "checkpoint-2" in caplog.text and name in caplog.text
    assert json.loads((output_dir / "all_results.json").read_text())["train_resumed_from_step"] == 1


def test_weights_lacking_a_model_tensor_are_refused_by_name(two_checkpoints, data_flags, tmp_path, monkeypatch):
    """A checkpoint without the shared embedding counted as complete and resumed with a fresh embedding."""
    output_dir = tmp_path / "run"
    shutil.copytree(two_checkpoints, output_dir)
    path = output_dir / "checkpoint-2" / "model.safetensors"
    weights = load_file(path)
    shared = next(name for name in weights if "shared" in name or "embed_tokens" in name)
    del weights[shared]
    save_file(weights, path, metadata={"format": "pt"})
    assert shared in missing_weight_names(output_dir / "checkpoint-2")
    with pytest.raises(ValueError, match=rf"checkpoint-2 is incomplete \(model\.safetensors lacks the model's "
                                         rf".*{shared.replace('.', '[.]')}"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "3", "--resume_from_checkpoint",
            output_dir / "checkpoint-2",
        ), monkeypatch)


def test_an_intact_checkpoint_has_no_missing_names(two_checkpoints):
    assert missing_weight_names(two_checkpoints / "checkpoint-2") == []
    assert archive_problem(two_checkpoints / "checkpoint-2" / "optimizer.pt") is None
