"""A checkpoint is complete only if it can be read (issue 34 §2): truncated torch archives and weights lacking a
model tensor are found before any data work; `last` falls back to the newest readable checkpoint, naming the one it
skips; an explicit path is refused naming the file. Tiny data made in code."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file
from script_helpers import load_script, run_script, tiny_translation_flags

from hf_tiednorm.training.checkpoint_reading import archive_problem, missing_weight_names, read_trainer_state
from hf_tiednorm.training.run_directory import (
    checkpoint_problems,
    last_complete_checkpoint,
    resolve_resume_checkpoint,
)


def truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.parametrize("name", ["optimizer.pt", "scheduler.pt", "rng_state.pth"])
def test_a_truncated_archive_is_refused_by_name_and_last_falls_back(finished_run, data_flags, tmp_path,
                                                                    monkeypatch, caplog, name):
    """It passed as complete; `last` picked it and the run died after data preparation naming no file."""
    output_dir = tmp_path / "run"
    shutil.copytree(finished_run, output_dir)
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


def test_weights_lacking_a_model_tensor_are_refused_by_name(finished_run, data_flags, tmp_path, monkeypatch):
    """A checkpoint without the shared embedding counted as complete and resumed with a fresh embedding."""
    output_dir = tmp_path / "run"
    shutil.copytree(finished_run, output_dir)
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


def test_an_intact_checkpoint_has_no_missing_names(finished_run):
    assert missing_weight_names(finished_run / "checkpoint-2") == []
    assert archive_problem(finished_run / "checkpoint-2" / "optimizer.pt") is None


# --- issue 40 U2-U5: a checkpoint whose files exist but cannot serve is named, and `last` skips it ---------------

def broken_copy(finished_run, tmp_path):
    output_dir = tmp_path / "run"
    shutil.copytree(finished_run, output_dir)
    return output_dir, output_dir / "checkpoint-2"


@pytest.mark.parametrize(("state", "named"), [
    ("{}", r"trainer_state\.json has no global_step"), ("[]", r"trainer_state\.json holds list"),
    ("null", r"trainer_state\.json holds null"), ('{"global_step": "2"}', r"trainer_state\.json has no global_step"),
])
def test_a_trainer_state_without_a_step_is_named(finished_run, tmp_path, caplog, state, named):
    """U2: `{}`, `[]`, `null` counted as complete; the resume failed with KeyError/TypeError, and `{}` recorded a
    change "at step None"."""
    output_dir, checkpoint = broken_copy(finished_run, tmp_path)
    (checkpoint / "trainer_state.json").write_text(state)
    assert any(re.search(named, problem) for problem in checkpoint_problems(checkpoint))
    with pytest.raises(ValueError, match=rf"checkpoint-2 is incomplete \(.*{named}"):
        resolve_resume_checkpoint(SimpleNamespace(output_dir=str(output_dir), resume_from_checkpoint=str(checkpoint)))
    with pytest.raises(ValueError, match=rf"checkpoint-2/trainer_state\.json: {named}"):
        read_trainer_state(checkpoint)
    with caplog.at_level("WARNING"):
        assert last_complete_checkpoint(output_dir) == output_dir / "checkpoint-1"
    assert "skipping" in caplog.text and "checkpoint-2" in caplog.text


def test_a_truncated_torch_weights_file_is_not_complete(finished_run, tmp_path):
    """U3: a truncated pytorch_model.bin counted as complete and failed late with `OSError 22`; a truncated shard
    of a sharded safetensors save was not read either."""
    output_dir, checkpoint = broken_copy(finished_run, tmp_path)
    weights = load_file(checkpoint / "model.safetensors")
    (checkpoint / "model.safetensors").unlink()
    torch.save(weights, checkpoint / "pytorch_model.bin")
    assert checkpoint_problems(checkpoint) == []
    truncate(checkpoint / "pytorch_model.bin")
    assert any("pytorch_model.bin" in problem for problem in checkpoint_problems(checkpoint))
    torch.save(weights, checkpoint / "pytorch_model.bin", _use_new_zipfile_serialization=False)
    assert archive_problem(checkpoint / "pytorch_model.bin") is None  # torch's legacy format: not an archive
    (checkpoint / "pytorch_model.bin").unlink()
    save_file(weights, checkpoint / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    (checkpoint / "model.safetensors.index.json").write_text("{}")
    truncate(checkpoint / "model-00001-of-00002.safetensors")
    assert any("model-00001-of-00002.safetensors is truncated" in p for p in checkpoint_problems(checkpoint))


def test_a_zip_without_torch_records_is_named(finished_run, tmp_path):
    """U4: a scheduler.pt that is a zip archive but not torch's passed and failed late inside torch."""
    output_dir, checkpoint = broken_copy(finished_run, tmp_path)
    with zipfile.ZipFile(checkpoint / "scheduler.pt", "w") as archive:
        archive.writestr("notes.txt", "not a scheduler")
    assert re.search(r"scheduler\.pt is a zip archive but not one torch\.save wrote .*notes\.txt",
                     archive_problem(checkpoint / "scheduler.pt"))
    with pytest.raises(ValueError, match=r"checkpoint-2 is incomplete \(scheduler\.pt is a zip archive but not"):
        resolve_resume_checkpoint(SimpleNamespace(output_dir=str(output_dir), resume_from_checkpoint=str(checkpoint)))


def test_a_checkpoint_without_config_is_named_and_skipped(finished_run, tmp_path, caplog):
    """U5: it gave transformers' "Unrecognized model", and `last` did not skip it."""
    output_dir, checkpoint = broken_copy(finished_run, tmp_path)
    (checkpoint / "config.json").unlink()
    assert "no config.json (the model's architecture)" in checkpoint_problems(checkpoint)
    with caplog.at_level("WARNING"):
        assert last_complete_checkpoint(output_dir) == output_dir / "checkpoint-1"
    assert "skipping" in caplog.text and "no config.json" in caplog.text
