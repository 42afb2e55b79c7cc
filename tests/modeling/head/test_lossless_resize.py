"""Tokens added by ``resize_token_embeddings`` to a lossless-started conversion start by the lossless map from their
initial rows (cosine g = ‖w‖, square g = ‖w‖², distance b = ½‖w‖²), so the resized model still computes what the
source computes after the same resize: the new tokens take the probability mass they take there, not several
times more (g = 1)."""

from __future__ import annotations

import pytest
import torch
from testing_utils import TINY_VOCAB
from tiny_architectures import ENCODER_DECODER, auto_class, inputs_for, source_model
from transformers import MarianConfig, MarianMTModel

import hf_tiednorm
from hf_tiednorm.convert import convert_checkpoint, main, normalize_tied_head

MODES = ("cosine", "square", "distance")
NEW = 10


def resized_logits(model, inputs) -> torch.Tensor:
    """``model``'s logits after resizing it by NEW tokens (mean resizing, drawn from seed 1)."""
    torch.manual_seed(1)
    model.resize_token_embeddings(TINY_VOCAB + NEW)
    with torch.no_grad():
        return model(**inputs).logits.float()


def check_like_the_source(model, name: str) -> None:
    source = source_model(name)
    inputs = inputs_for(source)
    expected = resized_logits(source, inputs)
    logits = resized_logits(model, inputs)
    new_mass = logits.softmax(-1)[..., TINY_VOCAB:].sum(-1)
    torch.testing.assert_close(new_mass, expected.softmax(-1)[..., TINY_VOCAB:].sum(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("head_mode", MODES)
@pytest.mark.parametrize("name", ["llama", "gpt2", "t5", "marian"])
def test_resize_after_a_lossless_start_adds_tokens_as_the_source_does(name, head_mode, tmp_path):
    model = normalize_tied_head(source_model(name), head_mode, lossless_start=True, generic=True).eval()
    assert model.config.lossless_start
    model.save_pretrained(tmp_path)  # the start is recorded: a reloaded model resizes the same way
    check_like_the_source(auto_class(model.config).from_pretrained(tmp_path).eval(), name)


@pytest.mark.parametrize("head_mode", MODES)
def test_own_family_resize_after_a_lossless_start_from_the_cli(head_mode, tmp_path):
    source_model("llama").save_pretrained(tmp_path / "source")
    main([str(tmp_path / "source"), str(tmp_path / "converted"), "--head-mode", head_mode, "--lossless-start"])
    model = hf_tiednorm.TiedNormForCausalLM.from_pretrained(tmp_path / "converted").eval()
    assert model.config.lossless_start
    check_like_the_source(model, "llama")


def test_a_plain_conversion_keeps_the_head_rule_for_new_tokens():
    model = normalize_tied_head(source_model("llama"), "cosine", logit_scale_kind="vector").eval()
    model.resize_token_embeddings(TINY_VOCAB + NEW)
    assert torch.equal(model.get_output_embeddings().logit_scale[TINY_VOCAB:], torch.ones(NEW))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"head_mode": "cosine"}, r"but head_mode='cosine' with these settings lacks \['logit_scale'\]"),
        ({"head_mode": "distance", "logit_bias": False}, r"'distance' with these settings lacks \['logit_bias'\]"),
        ({"head_mode": "l2"}, "lossless_start=True, but head_mode='l2' has no lossless start"),
    ],
)
def test_a_config_claiming_a_lossless_start_its_head_cannot_have_is_refused(fields, message):
    """The model refuses to be built (issue 56: the head mode's math is checked where the model is built, the
    configuration imports no torch)."""
    config = hf_tiednorm.TiedNormCausalConfig(lossless_start=True, **fields)
    with pytest.raises(ValueError, match=message):
        hf_tiednorm.TiedNormForCausalLM(config)


# Formerly test_lossless_decoder_resize.py --------------------------------------------------------------------------
# Tokens that ``resize_decoder_token_embeddings`` adds to a lossless-started encoder-decoder with its own decoder
# vocabulary (tie topology "decoder") start by the lossless map from their initial rows, as
# ``resize_token_embeddings`` starts them (test_lossless_resize.py): the resized model computes what the source
# computes after the same resize.


NEW_DECODER = 6


def decoder_resized_logits(model, inputs) -> torch.Tensor:
    torch.manual_seed(1)  # the new rows' draw: the same for the source and the conversion
    model.resize_decoder_token_embeddings(TINY_VOCAB + NEW_DECODER)
    with torch.no_grad():
        return model(**inputs).logits.float()


@pytest.mark.parametrize("head_mode", ["cosine", "square", "distance"])
def test_decoder_resize_after_a_lossless_start_adds_tokens_as_the_source_does(head_mode, tmp_path):
    torch.manual_seed(0)
    config = MarianConfig(share_encoder_decoder_embeddings=False, **ENCODER_DECODER)  # two vocabularies
    MarianMTModel(config).eval().save_pretrained(tmp_path / "source")
    model = convert_checkpoint(tmp_path / "source", head_mode=head_mode, lossless_start=True)
    assert isinstance(model, hf_tiednorm.TiedNormForConditionalGeneration)
    assert model.config.tie_topology == "decoder" and model.config.lossless_start
    source = MarianMTModel.from_pretrained(tmp_path / "source").eval()
    inputs = inputs_for(source)
    expected = decoder_resized_logits(source, inputs)
    logits = decoder_resized_logits(model, inputs)
    assert logits.shape[-1] == TINY_VOCAB + NEW_DECODER
    new_mass = logits.softmax(-1)[..., TINY_VOCAB:].sum(-1)
    torch.testing.assert_close(new_mass, expected.softmax(-1)[..., TINY_VOCAB:].sum(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
