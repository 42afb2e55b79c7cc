"""Model cards rendered from a saved folder's config: front matter, model-index and body."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from testing_utils import FAMILIES, tiny_model
from tiny_architectures import CONFIGS, source_model
from transformers import MarianConfig

from hf_tiednorm import TiedNormWrappedConfig
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.publishing.model_card import (
    LIU_ET_AL_BIBTEX,
    PRESS_WOLF_BIBTEX,
    TIE_TOPOLOGY_TEXT,
    WRAPPED_TIE_TEXT,
    main,
    render_model_card,
    write_model_card,
)

SIGNATURE = "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.4.0"


def test_seq2seq_card_with_bleu(tmp_path):
    tiny_model("seq2seq", head_mode="cosine", logit_scale_kind="scalar").save_pretrained(tmp_path)
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
    assert (data.library_name, data.pipeline_tag, data.license) == ("transformers", "translation", "unknown")
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


def test_converted_causal_card(tmp_path):
    """A converted GPT-2 (tiednorm_wrapped): architecture and g's init from the wrapped config (n_embd=32)."""
    normalize_tied_head(source_model("gpt2"), "square", logit_scale_kind="fixed").save_pretrained(tmp_path)
    card = ModelCard.load(write_model_card(tmp_path, metrics={"eval_perplexity": 20.0}, dataset="wikitext"))
    assert card.data.pipeline_tag == "text-generation"
    assert {"tiednorm", "square", "text-generation", "gpt2"} <= set(card.data.tags)
    assert card.data.eval_results[0].metric_type == "perplexity"
    for expected in (
        "A `gpt2` model (transformers' own code) with the **`square`** output head", "eq. 22",
        f"fixed g = {32**0.5:.4g}", "| tie topology | input = output embedding |", "| label smoothing | 0.0 |",
        "| vocabulary | 61 tokens |", "AutoModelForCausalLM", "trust_remote_code=True", LIU_ET_AL_BIBTEX,
    ):  # fmt: skip
        assert expected in card.text, expected
    assert "Regularizers" not in card.text and "tiednorm-translation" not in card.text


def test_converted_encoder_decoder_cards(tmp_path):
    """A converted M2M100 (three-way tied by its architecture; its folder serves the translation pipeline), and a
    Marian with two vocabularies, whose config says its encoder embedding is its own (config-only folder)."""
    normalize_tied_head(source_model("m2m_100"), "l2").save_pretrained(tmp_path / "m2m")
    card = ModelCard.load(write_model_card(tmp_path / "m2m", languages=["de", "en"]))
    assert card.data.pipeline_tag == "translation" and {"l2", "translation", "m2m_100"} <= set(card.data.tags)
    for expected in (
        "A `m2m_100` model (transformers' own code)", "eq. 19", f"| tie topology | {WRAPPED_TIE_TEXT} |",
        "| logit scale (`logit_scale_kind`) | none |", "AutoModelForSeq2SeqLM",
        'pipeline("tiednorm-translation", model="m2m", trust_remote_code=True)',
    ):  # fmt: skip
        assert expected in card.text, expected
    assert "Regularizers" not in card.text

    fields = CONFIGS["marian"].to_dict() | {"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 50}
    TiedNormWrappedConfig(text_config=fields, head_mode="cosine").save_pretrained(tmp_path / "marian")
    text = write_model_card(tmp_path / "marian").read_text()
    assert f"| tie topology | {TIE_TOPOLOGY_TEXT['decoder']} |" in text and "`marian` model" in text


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


@pytest.mark.parametrize("family", FAMILIES)
def test_regularizer_table_lists_only_what_describes_the_model(family, tmp_path):
    """A plain model has no "Regularizers" section (no transformers bookkeeping such as ``custom_pipelines``, no
    settings of techniques that are off); a technique that is on shows with its own settings."""
    tiny_model(family).save_pretrained(tmp_path / "plain")
    assert "Regularizers" not in write_model_card(tmp_path / "plain").read_text()

    on = {"weight_norm_regularization": 1e-3, "projection_regularization": 0.15, "adaptive_cutoffs": [20, 40]}
    tiny_model(family, **on).save_pretrained(tmp_path / "on")
    text = write_model_card(tmp_path / "on").read_text()
    for row in (
        "| `weight_norm_regularization` | `0.001` |", "| `weight_norm_target` | `2.0` |",
        "| `projection_regularization` | `0.15` |", "| `adaptive_cutoffs` | `[20, 40]` |",
        "| `adaptive_tie_projections` | `True` |", "| `adaptive_div_value` | `4.0` |",
    ):  # fmt: skip
        assert row in text, row
    assert "custom_pipelines" not in text and "decoder_vocab_size" not in text and "loss_chunk_size" not in text


# Formerly test_card_truth.py ---------------------------------------------------------------------------------------
# The card describes the head as the weights hold it and lists only hf_tiednorm's settings (issue 35 item 4).


def learned_scale(model):
    return next(p for name, p in model.named_parameters() if name.endswith("logit_scale"))


def test_a_lossless_start_scale_is_described_by_its_values(tmp_path):
    """A lossless start sets g_i = ‖w_i‖ (1.79-7.49 on SmolLM2); the card said "initialized to 1"."""
    model = tiny_model("causal", head_mode="cosine", logit_scale_kind="vector")
    with torch.no_grad():
        learned_scale(model).copy_(torch.linspace(1.79, 7.49, learned_scale(model).numel()))
    model.save_pretrained(tmp_path)
    text = render_model_card(tmp_path).text
    assert "g_i in 1.79–7.49 in these weights" in text and "initialized to 1" not in text


def test_unk_token_id_is_not_listed_as_an_hf_tiednorm_setting(tmp_path):
    model = tiny_model("causal")
    model.config.unk_token_id = 3
    model.save_pretrained(tmp_path)
    text = render_model_card(tmp_path).text
    assert "`unk_token_id`" not in text
