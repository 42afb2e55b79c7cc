"""Model cards rendered from a saved folder's config: front matter, model-index and body."""

from __future__ import annotations

import json

import pytest
from conftest import tiny_model
from huggingface_hub import ModelCard
from transformers import MarianConfig

from hf_tiednorm.model_card import (
    LIU_ET_AL_BIBTEX,
    PRESS_WOLF_BIBTEX,
    main,
    write_model_card,
)

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"


def test_seq2seq_card_with_bleu(tmp_path):
    tiny_model("seq2seq", head_mode="cosine", logit_scale="scalar").save_pretrained(tmp_path)
    (tmp_path / "embedding_norms.png").write_bytes(b"\x89PNG fake")
    path = write_model_card(
        tmp_path,
        metrics={"test_bleu": 38.123, "test_bleu_signature": SIGNATURE, "eval_loss": 1.9},
        dataset="bentrevett/multi30k",
        languages=["de", "en"],
        training={"steps": 1000, "GPU hours": 0.5},
    )
    card = ModelCard.load(path)
    data = card.data
    assert (data.library_name, data.pipeline_tag, data.license) == ("transformers", "translation", "apache-2.0")
    assert {"tiednorm", "cosine"} <= set(data.tags) and data.language == ["de", "en"]
    assert data.datasets == ["bentrevett/multi30k"]
    (result,) = data.eval_results  # the loss stays in the body, only sacreBLEU / perplexity go to the model-index
    assert (result.metric_type, result.metric_value, result.metric_config) == ("sacrebleu", 38.12, SIGNATURE)
    assert (result.task_type, result.dataset_split) == ("translation", "test")
    text = card.text
    for expected in (
        "s_i = w_i·h / ‖w_i‖", "eq. 27", "three-way", "one learned g", "| steps | 1000 |", "loss (validation)",
        "trust_remote_code=True", "AutoModelForSeq2SeqLM", "![Histogram of embedding row norms](embedding_norms.png)",
        LIU_ET_AL_BIBTEX, PRESS_WOLF_BIBTEX,
    ):  # fmt: skip
        assert expected in text, expected


def test_causal_card_with_perplexity_via_cli(tmp_path):
    folder = tmp_path / "model"
    tiny_model("causal", head_mode="baseline").save_pretrained(folder)
    (tmp_path / "metrics.json").write_text(json.dumps({"eval_perplexity": 12.3456}))
    main([str(folder), "--metrics", str(tmp_path / "metrics.json"), "--dataset", "wikitext", "--languages", "en"])
    card = ModelCard.load(folder / "README.md")
    assert card.data.pipeline_tag == "text-generation" and "baseline" in card.data.tags
    (result,) = card.data.eval_results
    assert (result.metric_type, result.metric_value, result.dataset_split) == ("perplexity", 12.346, "validation")
    assert "AutoModelForCausalLM" in card.text and "embedding_norms.png" not in card.text
    # Baseline is plain tying: Press & Wolf only, no normalization paper.
    assert PRESS_WOLF_BIBTEX in card.text and LIU_ET_AL_BIBTEX not in card.text


def test_config_fields_beyond_head_and_parent_are_listed(tmp_path):
    model = tiny_model("causal")
    model.config.embedding_norm_penalty = 0.01  # how a regularizer field added to the config shows up
    model.save_pretrained(tmp_path)
    assert "| `embedding_norm_penalty` | `0.01` |" in write_model_card(tmp_path).read_text()


def test_bad_inputs_are_refused(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        write_model_card(tmp_path)
    MarianConfig().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="holds a 'marian' model.*hf_tiednorm.convert"):
        write_model_card(tmp_path)
    tiny_model("causal").save_pretrained(tmp_path / "ours")
    with pytest.raises(ValueError, match="without `dataset`"):
        write_model_card(tmp_path / "ours", metrics={"bleu": 30.0})
    with pytest.raises(TypeError, match="must be a number"):
        write_model_card(tmp_path / "ours", metrics={"bleu": "thirty"}, dataset="d")
    assert not (tmp_path / "ours" / "README.md").exists()
