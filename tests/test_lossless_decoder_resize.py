"""Tokens that ``resize_decoder_token_embeddings`` adds to a lossless-started encoder-decoder with its own decoder
vocabulary (tie topology "decoder") start by the lossless map from their initial rows, as ``resize_token_embeddings``
starts them (test_lossless_resize.py): the resized model computes what the source computes after the same resize."""

from __future__ import annotations

import pytest
import torch
from testing_utils import TINY_VOCAB
from tiny_architectures import ENCODER_DECODER, inputs_for
from transformers import MarianConfig, MarianMTModel

import hf_tiednorm
from hf_tiednorm.convert import convert_checkpoint

NEW = 6


def decoder_resized_logits(model, inputs) -> torch.Tensor:
    torch.manual_seed(1)  # the new rows' draw: the same for the source and the conversion
    model.resize_decoder_token_embeddings(TINY_VOCAB + NEW)
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
    assert logits.shape[-1] == TINY_VOCAB + NEW
    new_mass = logits.softmax(-1)[..., TINY_VOCAB:].sum(-1)
    torch.testing.assert_close(new_mass, expected.softmax(-1)[..., TINY_VOCAB:].sum(-1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
