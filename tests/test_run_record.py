"""A resume continues the run it resumes (issue 34 §0, §1): the checkpoint's token order, and the flags that define
the run, recorded in the run folder at start and compared on resume. Tiny data made in code."""

from __future__ import annotations

import json
import shutil

import pytest
from script_helpers import run_script, tiny_translation_flags
from transformers import AutoTokenizer


@pytest.fixture(scope="module")
def adaptive_run(data_flags, tmp_path_factory):
    """An --adaptive_cutoffs run with checkpoints 1 and 2."""
    output_dir = tmp_path_factory.mktemp("adaptive")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_steps", "1",
            "--adaptive_cutoffs", "40", "100", "--max_train_samples", "40",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def test_resume_of_an_adaptive_run_keeps_the_checkpoint_token_order(adaptive_run, data_flags, tmp_path, monkeypatch):
    """Resuming with other counts (another --max_train_samples) re-sorted the checkpoint's tokenizer: a saved model
    whose token ids no longer matched its weights."""
    output_dir = tmp_path / "resumed"
    shutil.copytree(adaptive_run, output_dir)
    vocab = AutoTokenizer.from_pretrained(output_dir / "checkpoint-1").get_vocab()
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_strategy", "no",
        "--adaptive_cutoffs", "40", "100", "--max_train_samples", "8", "--allow_run_change", "max_train_samples",
        "--resume_from_checkpoint", output_dir / "checkpoint-1",
    ), monkeypatch)
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == vocab


@pytest.fixture(scope="module")
def recorded_run(data_flags, tmp_path_factory):
    """A run with label smoothing and checkpoints 1-4, resumed by the tests below with other flags."""
    output_dir = tmp_path_factory.mktemp("recorded")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "4", "--save_steps", "1", "--label_smoothing", "0.1",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def resume_copy(run, tmp_path, step=2):
    output_dir = tmp_path / "resumed"
    shutil.copytree(run, output_dir)
    for folder in output_dir.glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    return output_dir


def test_the_run_folder_records_what_defines_the_run(recorded_run, data_flags):
    record = json.loads((recorded_run / "run_record.json").read_text())
    assert record["data"]["source_lang"] == "de" and record["data"]["target_lang"] == "en"
    train = data_flags[data_flags.index("--train_file") + 1]
    assert record["data"][f"train_file {train.format(lang='de')}"]["sha256"]
    assert record["model"]["label_smoothing"] == 0.1 and record["model"]["dropout"] == 0
    assert record["training"]["seed"] == 1 and record["training"]["max_steps"] == 4
    assert record["training"]["precision"] == "fp32"
    results = json.loads((recorded_run / "all_results.json").read_text())
    assert results["precision"] == "fp32"
    assert "| precision | fp32 |" in (recorded_run / "README.md").read_text()


@pytest.mark.parametrize(("flags", "named"), [
    (["--source_lang", "en", "--target_lang", "de"], r"source_lang: 'de' -> 'en'"),
    (["--label_smoothing", "0"], r"label_smoothing: 0\.1 -> 0\.0"),
    (["--label_smoothing", "0.1", "--dropout", "0.3"], r"dropout: 0\.0 -> 0\.3"),
    (["--label_smoothing", "0.1", "--bf16", "true"], r"precision: 'fp32' -> 'bf16'"),
    (["--label_smoothing", "0.1", "--seed", "7"], r"seed: 1 -> 7"),
    (["--label_smoothing", "0.1", "--max_train_samples", "8"], r"max_train_samples: None -> 8"),
])
def test_resume_refuses_another_run_by_name(recorded_run, data_flags, tmp_path, monkeypatch, flags, named):
    """Each of these resumed with rc 0: another direction, objective, regularizer, precision, shuffle or data."""
    output_dir = resume_copy(recorded_run, tmp_path)
    with pytest.raises(ValueError, match=rf"continues a run started with other settings .*{named}.*"
                                         r"--allow_run_change"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "4", "--save_strategy", "no",
            "--resume_from_checkpoint", "last", *flags,
        ), monkeypatch)


def test_resume_refuses_other_training_data(recorded_run, data_flags, tmp_path, monkeypatch):
    """Another --train_file (here the test set) continued silently."""
    output_dir = resume_copy(recorded_run, tmp_path)
    flags = list(data_flags)
    flags[flags.index("--train_file") + 1] = flags[flags.index("--test_file") + 1]
    with pytest.raises(ValueError, match=r"train_file: .*train\.\{lang\}' -> .*test\.\{lang\}'"):
        run_script("run_translation", tiny_translation_flags(
            flags, output_dir, "--do_train", "--max_steps", "4", "--label_smoothing", "0.1",
            "--resume_from_checkpoint", "last",
        ), monkeypatch)


def test_a_knowing_change_is_allowed_and_recorded(recorded_run, data_flags, tmp_path, monkeypatch):
    output_dir = resume_copy(recorded_run, tmp_path)
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--max_steps", "3", "--save_strategy", "no", "--label_smoothing", "0.1",
        "--dropout", "0.3", "--allow_run_change", "dropout", "--resume_from_checkpoint", "last",
    ), monkeypatch)
    record = json.loads((output_dir / "run_record.json").read_text())
    assert record["model"]["dropout"] == 0.3
    assert {"step": 2, "flag": "dropout", "old": 0, "new": 0.3} in record["changes"]


def test_max_steps_below_the_checkpoint_is_refused(recorded_run, data_flags, tmp_path, monkeypatch):
    """Resuming checkpoint-4 with --max_steps 2 trained to step 5; the card said "max_steps 2 / steps trained 5"."""
    output_dir = resume_copy(recorded_run, tmp_path, step=4)
    with pytest.raises(ValueError, match=r"--max_steps 2 is not beyond --resume_from_checkpoint .*at step 4"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--label_smoothing", "0.1",
            "--resume_from_checkpoint", output_dir / "checkpoint-4",
        ), monkeypatch)


def test_resume_without_the_runs_tokenizer_is_refused(adaptive_run, data_flags, tmp_path, monkeypatch):
    """With no tokenizer beside the checkpoint, a resume trained a new one (or took --tokenizer_name unsorted): ids
    that did not match the checkpoint's embedding rows."""
    output_dir = tmp_path / "resumed"
    shutil.copytree(adaptive_run, output_dir)
    for folder in (output_dir, output_dir / "checkpoint-1"):
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"checkpoint-1: neither it nor .* holds the run's tokenizer"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--adaptive_cutoffs", "40", "100",
            "--max_train_samples", "40", "--resume_from_checkpoint", output_dir / "checkpoint-1",
        ), monkeypatch)
