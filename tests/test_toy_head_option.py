"""A head option added in this file alone (issue 41): a learned per-token temperature τ_i (logits s_i / τ_i),
registered with ``register_head_option``. With no edit to the package it trains, saves and reloads, is refused by
name by a saved folder's remote code (which does not define it, as an unregistered head mode is), converts (API and
``tiednorm-convert --logit-temperature``), exports plain with the same logits and appears on the model card."""

from __future__ import annotations

import pytest
import torch
from testing_utils import model_inputs, run_without_package, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.conversion.convert import build_parser, convert_checkpoint
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.modeling.head.options import HEAD_OPTIONS, HeadOption, HeadOptions, register_head_option
from hf_tiednorm.publishing.model_card import render_model_card

NAME = "logit_temperature"


def fold_temperature(tau, scale, bias):
    """s_i / τ_i = (W·h)_i · (scale_i / τ_i) + bias_i / τ_i."""
    return (1 / tau if scale is None else scale / tau), (None if bias is None else bias / tau)


@pytest.fixture
def temperature():
    register_head_option(HeadOption(NAME, "a learned per-token temperature τ_i dividing the scores", 1.0,
                                    fold_temperature, "a learned τ_i per token, dividing the scores (1 at first)"))
    yield NAME
    del HEAD_OPTIONS[NAME]


def set_temperatures(model):
    with torch.no_grad():
        getattr(model.get_output_embeddings(), NAME).uniform_(0.5, 2.0)


def test_a_head_option_registered_in_a_test_trains_saves_and_reloads(temperature, tmp_path):
    model = tiny_model("causal", extra_terms=(NAME,)).train()
    inputs = model_inputs(model)
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    assert getattr(model.lm_head, NAME).grad.abs().sum() > 0  # it trains
    set_temperatures(model)
    plain = tiny_model("causal")  # the same weights (seed) without the option
    with torch.no_grad():
        expected = plain(**inputs).logits / getattr(model.lm_head, NAME)
        torch.testing.assert_close(model.eval()(**inputs).logits, expected)
    model.save_pretrained(tmp_path / "model")
    reloaded = type(model).from_pretrained(tmp_path / "model").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, expected)
    assert NAME in render_model_card(tmp_path / "model").text  # on the card, with its own line

    out = run_without_package(f"""
from transformers import AutoModelForCausalLM
try:
    AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
except Exception as error:
    print("REFUSED", error)
else:
    print("LOADED")
""", cwd=tmp_path)  # fmt: skip
    assert "REFUSED" in out and NAME in out, out


def test_a_head_option_registered_in_a_test_converts_and_exports(temperature, tmp_path):
    assert f"--{NAME.replace('_', '-')}" in build_parser().format_help()  # a flag of tiednorm-convert
    source_model("llama").save_pretrained(tmp_path / "llama")
    options = build_parser().parse_args([str(tmp_path / "llama"), str(tmp_path / "out"), "--head-mode", "cosine",
                                         "--logit-temperature"])  # fmt: skip
    assert options.logit_temperature
    converted = convert_checkpoint(tmp_path / "llama", options=HeadOptions(head_mode="cosine", extra_terms=(NAME,)))
    assert converted.config.extra_terms == (NAME,) or list(converted.config.extra_terms) == [NAME]
    set_temperatures(converted)
    result = export_plain(converted, tmp_path / "plain")  # checks the export's logits against the model's
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    inputs = model_inputs(converted)
    with torch.no_grad():
        torch.testing.assert_close(result.model(**inputs).logits, converted(**inputs).logits, rtol=1e-4, atol=1e-4)
