"""The short paths users expect: pipeline("text-generation") and the registered "tiednorm-translation", which also
loads from a saved model folder alone, refuses a model without tokenizer, and truncates over-long inputs."""

from __future__ import annotations

import json

import pytest
import torch
from testing_utils import run_without_package, tiny_model, tiny_tokenizer
from tiny_architectures import source_model
from transformers import pipeline
from transformers.testing_utils import CaptureLogger

from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.modeling import translation_pipeline as pipeline_translation
from hf_tiednorm.publishing.model_card import write_model_card


def test_text_generation_pipeline_with_a_saved_causal_lm(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model("causal", head_mode="cosine", vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    generator = pipeline("text-generation", model=str(tmp_path), trust_remote_code=True)
    # The pipeline returns prompt + continuation, so "starts with the prompt" held even when nothing was generated
    # (it was: the tiny tokenizer appends </s> for translation sources and the model answered </s>). No </s> after
    # the prompt, and min_new_tokens: the text must be the prompt followed by the model's own greedy continuation.
    kwargs = dict(max_new_tokens=4, min_new_tokens=4, do_sample=False)
    out = generator("a dog", add_special_tokens=False, **kwargs)
    prompt = tokenizer("a dog", add_special_tokens=False, return_tensors="pt")
    with torch.no_grad():
        new_ids = model.generate(**prompt, **kwargs)[0, prompt["input_ids"].shape[1] :]
    continuation = tokenizer.decode(new_ids, skip_special_tokens=True)
    assert len(new_ids) == 4 and continuation.strip()
    assert out[0]["generated_text"] == "a dog" + continuation
    assert generator("a dog", add_special_tokens=False, return_full_text=False, **kwargs)[0]["generated_text"] == (
        continuation
    )


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


def test_saved_translation_models_serve_the_pipeline_from_their_folder_alone(tmp_path):
    # Issue 15 item 5: no pipe.save_pretrained. Our own family saved as the Trainer saves it (the main job's output,
    # what tiednorm-push uploads), and a converted NLLB-architecture model: each folder carries the pipeline.
    tokenizer = tiny_tokenizer()
    own = tiny_model("seq2seq", head_mode="l2", vocab_size=len(tokenizer))
    own.save_pretrained(tmp_path / "own")
    tokenizer.save_pretrained(tmp_path / "own")
    source_model("m2m_100").save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    converted = convert_checkpoint(tmp_path / "source", tmp_path / "converted", head_mode="cosine")
    expected = {}
    for name, model in (("own", own), ("converted", converted)):
        config = json.loads((tmp_path / name / "config.json").read_text())
        assert "tiednorm-translation" in config["custom_pipelines"]
        assert "class TiedNormTranslationPipeline(" in (tmp_path / name / "modeling_tiednorm.py").read_text()
        translator = pipeline("tiednorm-translation", model=model, tokenizer=tokenizer)
        expected[name] = translator("ein hund läuft .", num_beams=2, max_new_tokens=5)

    out = run_without_package(
        f"""
from transformers import pipeline
for name in ("own", "converted"):
    translator = pipeline("tiednorm-translation", model={str(tmp_path)!r} + "/" + name, trust_remote_code=True)
    print(repr(translator("ein hund läuft .", num_beams=2, max_new_tokens=5)))
""",
        cwd=tmp_path,
    )
    assert out.splitlines() == [repr(expected["own"]), repr(expected["converted"])]


def test_translation_pipeline_refuses_a_model_folder_without_tokenizer(tmp_path):
    tiny_model("seq2seq").save_pretrained(tmp_path / "model")  # no tokenizer saved
    with pytest.raises(ValueError, match="needs a tokenizer.*came without one.*tokenizer.json"):
        # The folder ships the pipeline's code, so transformers wants trust_remote_code even with hf_tiednorm here.
        pipeline("tiednorm-translation", model=str(tmp_path / "model"), trust_remote_code=True)


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
    tiny_model("seq2seq").save_pretrained(tmp_path / "translation")
    tiny_model("causal").save_pretrained(tmp_path / "causal")  # no translation pipeline
    line = 'pipeline("tiednorm-translation", model="user/model", trust_remote_code=True)'
    assert line in write_model_card(tmp_path / "translation", repo_id="user/model").read_text()
    assert line not in write_model_card(tmp_path / "causal", repo_id="user/model").read_text()
