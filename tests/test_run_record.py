"""A resume continues the run it resumes (issue 34 §0, §1): the checkpoint's token order, and the flags that define
the run, recorded in the run folder at start and compared on resume. Tiny data made in code."""

from __future__ import annotations

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
        "--adaptive_cutoffs", "40", "100", "--max_train_samples", "8",
        "--resume_from_checkpoint", output_dir / "checkpoint-1",
    ), monkeypatch)
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == vocab
