"""--overwrite_output_dir deletes a previous run's outputs and nothing else (issue 34 §0, §5): never a folder holding
a live run's lock beneath it, never the config file the run was started from, never files no run of ours wrote."""

from __future__ import annotations

import fcntl
import os

import pytest
import yaml
from script_helpers import run_script, tiny_translation_flags

from hf_tiednorm.training.run_directory import lock_path


def test_overwrite_of_a_parent_folder_spares_a_live_run_beneath(data_flags, tmp_path, monkeypatch):
    """`--output_dir runs/nest --overwrite_output_dir` while a run trained in runs/nest/inner deleted its checkpoints,
    token counts and lock file."""
    nest = tmp_path / "nest"
    inner = nest / "inner"
    (inner / "checkpoint-1").mkdir(parents=True)
    (inner / "token_counts.pt").write_bytes(b"counts")
    (nest / "config.json").write_text("{}")  # a previous run's output in the parent
    lock = lock_path(inner)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the inner run, alive
    try:
        with pytest.raises(RuntimeError, match=r"another run is training beneath it \(live lock .*\.inner\.lock"):
            run_script("run_translation", tiny_translation_flags(
                data_flags, nest, "--overwrite_output_dir", "--do_train", "--max_steps", "1", "--save_strategy", "no",
            ), monkeypatch)
    finally:
        os.close(fd)
    assert (inner / "checkpoint-1").is_dir() and (inner / "token_counts.pt").is_file() and lock.is_file()
    assert (nest / "config.json").is_file()  # refused before anything was deleted


def test_overwrite_keeps_the_config_file_and_files_no_run_wrote(data_flags, tmp_path, monkeypatch):
    """`run_translation.py run.yaml --output_dir . --overwrite_output_dir` deleted run.yaml and every unrelated file;
    now only the previous run's outputs go (a folder no run of ours wrote stays too)."""
    folder = tmp_path / "here"
    folder.mkdir()
    flags = tiny_translation_flags(data_flags, ".", "--do_train", "--max_steps", "1", "--save_strategy", "no")
    monkeypatch.chdir(folder)
    run_script("run_translation", flags, monkeypatch)  # the previous run
    assert (folder / "config.json").is_file()
    config = {"max_steps": 1, "save_strategy": "no"}
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "my_data").mkdir()
    (folder / "my_data" / "extra.de").write_text("ein hund\n")
    (folder / "checkpoint-9").mkdir()  # a previous run's checkpoint: goes
    run_script("run_translation", ["run.yaml", *flags[:-4], "--overwrite_output_dir"], monkeypatch)
    assert (folder / "run.yaml").read_text() == yaml.safe_dump(config)
    assert (folder / "notes.txt").read_text() == "my notes\n"
    assert (folder / "my_data" / "extra.de").is_file()
    assert not (folder / "checkpoint-9").exists()
    assert (folder / "model.safetensors").is_file()
