"""A head term added in this file alone (issue 41): a learned per-token temperature τ_i (logits s_i / τ_i),
registered with ``register_head_term``. With no edit to the package it trains, saves and reloads, is refused by
name by a saved folder's remote code (which does not define it, as an unregistered head mode is), converts (API and
``tiednorm-convert --logit-temperature``), exports plain with the same logits and appears on the model card.

It is a ``HeadTerm`` of the same registry as the built-in logit scale and bias (issue 50), so it gets every hook they
get: its start value, its fold (the export bakes it), a resize's fill, fp32 under a bf16 load, a lossless start's
value, the load checks, the card row and the flags of the converter and of the training scripts; the contract test
below runs each of them over every registered term, built-in or added here."""

from __future__ import annotations

import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from testing_utils import model_inputs, run_without_package, tiny_model
from tiny_architectures import source_model
from transformers import HfArgumentParser

from hf_tiednorm import HEAD_TERMS, ExtraHeadTerm, HeadSettings, HeadTerm, register_head_term
from hf_tiednorm.conversion.convert import build_parser, convert_checkpoint, keep_head_terms_fp32, normalize_tied_head
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.publishing.model_card import render_model_card
from hf_tiednorm.training.arguments import TiedNormModelArguments

NAME = "logit_temperature"


def fold_temperature(tau, scale, bias):
    """s_i / τ_i = (W·h)_i · (scale_i / τ_i) + bias_i / τ_i."""
    return (1 / tau if scale is None else scale / tau), (None if bias is None else bias / tau)


@pytest.fixture
def temperature():
    register_head_term(
        ExtraHeadTerm(
            NAME,
            "a learned per-token temperature τ_i dividing the scores",
            1.0,
            fold_temperature,
            "a learned τ_i per token, dividing the scores (1 at first)",
        )
    )
    yield NAME
    del HEAD_TERMS[NAME]


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
    converted = convert_checkpoint(tmp_path / "llama", settings=HeadSettings(head_mode="cosine", extra_terms=(NAME,)))
    assert converted.config.extra_terms == (NAME,) or list(converted.config.extra_terms) == [NAME]
    set_temperatures(converted)
    result = export_plain(converted, tmp_path / "plain")  # checks the export's logits against the model's
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance
    inputs = model_inputs(converted)
    with torch.no_grad():
        torch.testing.assert_close(result.model(**inputs).logits, converted(**inputs).logits, rtol=1e-4, atol=1e-4)


# Every term on: the built-ins by their config fields, the added one by name (its switch).
ALL_TERMS = {"head_mode": "cosine", "logit_scale_kind": "vector", "logit_bias": True, "extra_terms": (NAME,)}


def trained_terms(model):
    """Give every learned term of ``model``'s head values far from its start (as training would)."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        for term in HEAD_TERMS:
            if getattr(head, term, None) is not None:
                getattr(head, term).uniform_(0.5, 2.0)
    return model


@pytest.mark.parametrize("term", ["logit_scale", "logit_bias", NAME])
def test_every_registered_term_gets_the_same_hooks(temperature, term, tmp_path):
    """One contract over the registry: the built-in g and b and the term added in this test alike are parameters of
    the head, folded into its scores and its plain export, resized with the vocabulary (new tokens at the start
    value), kept fp32 under a bf16 load, and named by the load checks when their tensor is missing."""
    assert isinstance(HEAD_TERMS[term], HeadTerm)
    model = trained_terms(tiny_model("seq2seq", **ALL_TERMS))  # Marian: a parent with a bias slot exports b too
    values = getattr(model.get_output_embeddings(), term)
    before = model(**model_inputs(model)).logits
    with torch.no_grad():
        values.mul_(1.5)  # the fold: the term is part of the scores
    assert not torch.allclose(model(**model_inputs(model)).logits, before)
    result = export_plain(model, tmp_path / "plain")  # the export bakes every term, checking the logits
    assert result.max_abs_diff is not None and result.max_abs_diff <= result.tolerance

    model.resize_token_embeddings(model.config.vocab_size + 3)  # the resize fill: new tokens at the start value
    head = model.get_output_embeddings()
    assert torch.equal(getattr(head, term)[-3:], torch.full((3,), head.term_starts[term]))

    model.save_pretrained(tmp_path / "model")
    loaded = type(model).from_pretrained(tmp_path / "model", dtype=torch.bfloat16)
    head = loaded.get_output_embeddings()
    assert head.weight.dtype == torch.bfloat16 and getattr(head, term).dtype == torch.float32
    assert term in loaded._keep_in_fp32_modules_strict
    cast = loaded.to(torch.bfloat16)
    keep_head_terms_fp32(cast)  # after a cast of the whole model (the converter's bf16 sources)
    assert getattr(cast.get_output_embeddings(), term).dtype == torch.float32

    weights = load_file(tmp_path / "model" / "model.safetensors")
    (key,) = [key for key in weights if key.endswith(f".{term}")]
    save_file({k: v for k, v in weights.items() if k != key}, tmp_path / "model" / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    setting = re.escape(HEAD_TERMS[term].setting(HeadSettings(**ALL_TERMS)))
    with pytest.raises(ValueError, match=rf"'{key}' is missing from the weights, but config.json declares {setting}"):
        type(model).from_pretrained(tmp_path / "model")


def test_a_registered_term_takes_its_lossless_value_at_a_lossless_start_and_a_resize(tmp_path):
    """A lossless start sets a term that declares a ``lossless`` value to it, as it sets g and b from the rows: a
    temperature that starts training at 2 converts with the source's logits (refused before: its init changes them),
    and the tokens a resize adds take the same value."""
    register_head_term(ExtraHeadTerm("warm", "a temperature starting at 2", 2.0, fold_temperature, "τ_i", lossless=1.0))
    try:
        source = source_model("llama").eval()
        model = normalize_tied_head(source, settings=HeadSettings(head_mode="cosine", extra_terms=("warm",)),
                                    lossless_start=True).eval()  # fmt: skip
        inputs = model_inputs(model)
        with torch.no_grad():
            torch.testing.assert_close(model(**inputs).logits, source(**inputs).logits, rtol=1e-4, atol=1e-4)
        assert torch.equal(model.lm_head.warm, torch.ones_like(model.lm_head.warm))
        model.resize_token_embeddings(model.config.vocab_size + 2)
        assert torch.equal(model.lm_head.warm[-2:], torch.ones(2))  # a lossless start's value, not the init
        fresh = tiny_model("causal", extra_terms=("warm",))
        assert torch.equal(fresh.lm_head.warm, torch.full_like(fresh.lm_head.warm, 2.0))  # a new model: its init
    finally:
        del HEAD_TERMS["warm"]


def test_a_registered_term_is_a_flag_of_the_training_scripts_and_starts_in_the_wrapper(temperature):
    """The training scripts switch a registered term on by name (``--extra_terms``, as a new model's config field);
    the wrapper, whose head is built on the meta device, gives it storage at its start value like g and b."""
    (args,) = HfArgumentParser(TiedNormModelArguments).parse_args_into_dataclasses(["--extra_terms", NAME])
    assert tuple(args.config_overrides()["extra_terms"]) == (NAME,)
    model = tiny_model("causal", **args.config_overrides())
    assert getattr(model.lm_head, NAME).shape == (model.config.vocab_size,)
    assert "--extra_terms" in HfArgumentParser(TiedNormModelArguments).format_help()

    wrapped = normalize_tied_head(source_model("gpt2"), settings=HeadSettings(head_mode="cosine", extra_terms=(NAME,)),
                                  generic=True)  # fmt: skip
    term = getattr(wrapped.get_output_embeddings(), NAME)
    assert not term.is_meta and torch.equal(term, torch.ones_like(term))


def test_a_term_added_from_outside_is_switched_by_extra_terms_not_by_config_fields_of_its_own():
    """A config has fields for the built-in terms only: an added term that declares its own is refused by name
    (it could never be switched on), and nothing is registered."""

    class Sharpness(HeadTerm):
        name, help, init, card, config_fields = "sharpness", "h", 1.0, "c", ("sharpness_kind",)

        def fold(self, values, scale, bias):
            return fold_temperature(values, scale, bias)

    with pytest.raises(ValueError, match=r"'sharpness' \(register_head_term\) declares config_fields"):
        register_head_term(Sharpness())
    assert "sharpness" not in HEAD_TERMS
