"""The short paths users expect: pipeline("text-generation") and the registered "tiednorm-translation", which also
loads from a saved model folder alone, refuses a model without tokenizer, and truncates over-long inputs."""

from __future__ import annotations

import json

import pytest
from conftest import run_without_package, tiny_model, tiny_tokenizer
from tiny_architectures import source_model
from transformers import pipeline
from transformers.testing_utils import CaptureLogger

from hf_tiednorm import pipeline_translation
from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.model_card import write_model_card


def test_text_generation_pipeline_with_a_saved_causal_lm(tmp_path):
    tokenizer = tiny_tokenizer()
    tiny_model("causal", head_mode="cosine", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)
    out = generator("a dog", max_new_tokens=4, do_sample=False)
    assert out[0]["generated_text"].startswith("a dog")


def test_translation_pipeline_saved_folder_loads_without_the_package(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model("seq2seq", head_mode="l2", vocab_size=len(tokenizer))
    translator = pipeline("tiednorm-translation", model=model, tokenizer=tokenizer)
    expected = translator("ein hund läuft .", num_beams=2, max_new_tokens=5)
    assert set(expected[0]) == {"translation_text"}
    translator.save_pretrained(tmp_path)

    out = run_without_package(
        f"""
from transformers import pipeline
translator = pipeline("tiednorm-translation", model={str(tmp_path)!r}, trust_remote_code=True)
print(repr(translator("ein hund läuft .", num_beams=2, max_new_tokens=5)))
""",
        cwd=tmp_path.parent,
    )
    assert out.strip() == repr(expected)


def test_translation_pipeline_rejects_unknown_arguments():
    tokenizer = tiny_tokenizer()
    translator = pipeline("tiednorm-translation", model=tiny_model("seq2seq"), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="unknown arguments"):
        translator("ein hund", beam_size=4)


def test_a_converted_translation_model_serves_the_pipeline_from_its_folder_alone(tmp_path):
    # Issue 15 item 5: no pipe.save_pretrained; the converted model's own folder carries the pipeline.
    tokenizer = tiny_tokenizer()
    source = source_model("m2m_100")  # NLLB's architecture, vocabulary of the tiny tokenizer's size
    source.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    model = convert_checkpoint(tmp_path / "source", tmp_path / "converted", head_mode="cosine")
    config = json.loads((tmp_path / "converted" / "config.json").read_text())
    assert "tiednorm-translation" in config["custom_pipelines"]
    translator = pipeline("tiednorm-translation", model=model, tokenizer=tokenizer)
    expected = translator("ein hund läuft .", num_beams=2, max_new_tokens=5)

    out = run_without_package(
        f"""
from transformers import pipeline
translator = pipeline("tiednorm-translation", model={str(tmp_path / "converted")!r}, trust_remote_code=True)
print(repr(translator("ein hund läuft .", num_beams=2, max_new_tokens=5)))
""",
        cwd=tmp_path,
    )
    assert out.strip() == repr(expected)


def test_translation_pipeline_refuses_a_model_folder_without_tokenizer(tmp_path):
    tiny_model("seq2seq").save_pretrained(tmp_path / "model")  # no tokenizer saved
    with pytest.raises(ValueError, match="needs a tokenizer.*came without one.*tokenizer.json"):
        pipeline("tiednorm-translation", model=str(tmp_path / "model"))


def test_translation_pipeline_truncates_inputs_longer_than_the_positions(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model("seq2seq", vocab_size=len(tokenizer))  # 64 positions
    translator = pipeline("tiednorm-translation", model=model, tokenizer=tokenizer)
    long_input = " ".join(["ein hund läuft auf dem gras ."] * 500)  # 3,500 words
    with CaptureLogger(pipeline_translation.logger) as captured:
        out = translator(long_input, max_new_tokens=3)
    assert set(out[0]) == {"translation_text"}
    assert "translating its first 64 tokens only" in captured.out
    with CaptureLogger(pipeline_translation.logger) as captured:
        translator("ein hund läuft .", max_new_tokens=3)
    assert captured.out == ""  # short inputs are left alone


def test_the_model_card_shows_the_pipeline_line_when_the_folder_serves_it(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model("seq2seq", vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "plain")  # a model folder saved without the pipeline
    pipeline("tiednorm-translation", model=model, tokenizer=tokenizer).save_pretrained(tmp_path / "with_pipeline")
    line = 'pipeline("tiednorm-translation", model="user/model", trust_remote_code=True)'
    assert line in write_model_card(tmp_path / "with_pipeline", repo_id="user/model").read_text()
    assert line not in write_model_card(tmp_path / "plain", repo_id="user/model").read_text()
