"""``pipeline("tiednorm-translation", ...)`` whose tokenizer fails to load says so, naming what failed and why (it
said no tokenizer had been passed); a model object without any tokenizer still gets the missing-tokenizer advice."""

from __future__ import annotations

import pytest
from testing_utils import tiny_model, tiny_tokenizer
from transformers import pipeline


def corrupt_tokenizer(folder) -> None:
    tiny_tokenizer().save_pretrained(folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "trunc')


def test_a_corrupt_tokenizer_folder_is_named_with_the_reason(tmp_path):
    corrupt_tokenizer(tmp_path / "tokenizer")
    # Not named by its path: the name lived only in transformers' frame, which the pipeline no longer reads (issue 56).
    given = r"the tokenizer given as pipeline\(tokenizer=...\) failed to load \(JSONDecodeError"
    with pytest.raises(ValueError, match=given):
        pipeline("tiednorm-translation", model=tiny_model("seq2seq"), tokenizer=str(tmp_path / "tokenizer"))


def test_a_model_folder_with_a_corrupt_tokenizer_is_named_with_the_reason(tmp_path):
    tiny_model("seq2seq").save_pretrained(tmp_path / "model")
    corrupt_tokenizer(tmp_path / "model")
    with pytest.raises(ValueError, match=rf"the tokenizer in {tmp_path / 'model'} failed to load \(JSONDecodeError"):
        pipeline("tiednorm-translation", model=str(tmp_path / "model"), trust_remote_code=True)


def test_a_model_object_without_tokenizer_still_gets_the_missing_tokenizer_advice():
    with pytest.raises(ValueError, match="needs a tokenizer, and the model .* came without one"):
        pipeline("tiednorm-translation", model=tiny_model("seq2seq"))
