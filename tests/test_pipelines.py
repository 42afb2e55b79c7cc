"""The short paths users expect: pipeline("text-generation") and the registered "tiednorm-translation"."""

from __future__ import annotations

import pytest
from conftest import run_without_package, tiny_model, tiny_tokenizer
from transformers import pipeline


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
