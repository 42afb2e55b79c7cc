"""The learned per-token logit bias (``logit_bias=True``, issue 25 §2): s_i = g·score_i + b_i in every head mode and
logit scale, zero at initialization, through the plain and the chunked loss, saved and reloaded by every family and by
a converted model, resized with the vocabulary, and shown on the model card."""

from __future__ import annotations

import itertools

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from testing_utils import FAMILIES, TINY_VOCAB, model_inputs, reference_scores, tiny_config, tiny_model
from tiny_architectures import source_model
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_tiednorm import HEAD_MODES, LOGIT_SCALES, TiedNormHead
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.modeling.head.adaptive import AdaptiveSoftmaxHead
from hf_tiednorm.modeling.head.settings import HeadSettings
from hf_tiednorm.modeling.loss.head_loss import chunked_head_cross_entropy
from hf_tiednorm.publishing.model_card import write_model_card

VOCAB, DIM = 37, 8


def biased_head(head_mode: str, logit_scale: str, dtype=torch.float32) -> TiedNormHead:
    """A head with random rows (one dead), distinct per-token scales and a non-zero bias."""
    torch.manual_seed(0)
    init = None if logit_scale == "none" else 3.0
    head = TiedNormHead(DIM, VOCAB, settings=HeadSettings(
        head_mode=head_mode, logit_scale_kind=logit_scale, logit_scale_init=init, logit_bias=True))
    head = head.to(dtype)
    with torch.no_grad():
        head.weight.normal_()
        head.weight[5].zero_()
        if logit_scale == "vector":
            head.logit_scale.uniform_(0.5, 3.0)
        head.logit_bias.normal_()
    return head


def test_the_bias_is_a_zero_initialized_parameter_and_absent_by_default():
    head = TiedNormHead(DIM, VOCAB, settings=HeadSettings(head_mode="cosine", logit_bias=True))
    assert isinstance(head.logit_bias, torch.nn.Parameter) and head.logit_bias.shape == (VOCAB,)
    assert torch.equal(head.logit_bias, torch.zeros(VOCAB))
    assert TiedNormHead(DIM, VOCAB).logit_bias is None
    assert "logit_bias=True" in repr(head)


# 3 × 2 = 6 tokens <= d scale the logits, 4 × 10 = 40 > d fold the scale into W: both branches against one reference.
@pytest.mark.parametrize("shape", [(3, 2), (4, 10)], ids=["logit-scaled", "row-scaled"])
@pytest.mark.parametrize("logit_scale", LOGIT_SCALES)
@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_scores_are_scaled_mode_scores_plus_the_bias(head_mode, logit_scale, shape):
    head = biased_head(head_mode, logit_scale)
    hidden = torch.randn(*shape, DIM)
    expected = reference_scores(head.weight.detach(), hidden, head_mode)
    if logit_scale == "fixed":
        expected = expected * 3.0
    elif logit_scale in ("scalar", "vector"):
        expected = expected * head.logit_scale.detach().double()
    expected = expected + head.logit_bias.detach().double()  # after the scale: b is not multiplied by g
    with torch.no_grad():
        torch.testing.assert_close(head(hidden).double(), expected, rtol=1e-5, atol=1e-5)


def test_the_bias_gets_the_gradient_of_a_bias():
    head = biased_head("cosine", "scalar")
    hidden = torch.randn(4, DIM)
    head(hidden).sum().backward()
    torch.testing.assert_close(head.logit_bias.grad, torch.full((VOCAB,), 4.0))  # d Σ s / d b_i = tokens


def _loss_and_grads(head, hidden, labels, chunk):
    head.zero_grad()
    h = hidden.clone().requires_grad_(True)
    if chunk is None:
        logits = head(h).reshape(-1, VOCAB)
        loss = torch.nn.functional.cross_entropy(logits, labels.reshape(-1), label_smoothing=0.1)
    else:
        loss = chunked_head_cross_entropy(head, h, labels, chunk, 0.1)
    loss.backward()
    grads = {"hidden": h.grad, "weight": head.weight.grad, "logit_bias": head.logit_bias.grad}
    if head.logit_scale is not None:
        grads["logit_scale"] = head.logit_scale.grad
    return loss.detach(), grads


BIAS_CASES = list(itertools.product(HEAD_MODES, ("none", "scalar", "vector")))


@pytest.mark.parametrize(("head_mode", "logit_scale"), BIAS_CASES)
def test_chunked_loss_equals_plain_with_the_bias(head_mode, logit_scale):
    head = biased_head(head_mode, logit_scale, torch.float64)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 11, DIM, generator=g, dtype=torch.float64)
    labels = torch.randint(0, VOCAB, (3, 11), generator=g)
    labels[0, :3] = -100
    ref_loss, ref = _loss_and_grads(head, hidden, labels, None)
    for chunk in (5, 1000):
        loss, grads = _loss_and_grads(head, hidden, labels, chunk)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-10, atol=1e-12)
        assert grads.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(grads[name], ref[name], rtol=1e-9, atol=1e-11, msg=name)


@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_adaptive_softmax_adds_the_bias_per_band(head_mode):
    torch.manual_seed(0)
    settings = HeadSettings(head_mode=head_mode, logit_scale_kind="vector", logit_bias=True)
    head = AdaptiveSoftmaxHead(32, 61, [20, 40], settings=settings)
    hidden = torch.randn(2, 3, 32)
    with torch.no_grad():
        before = [s.clone() for s in head.band_scores(hidden)]
        head.logit_bias.copy_(torch.linspace(-1, 1, 61))
        after = head.band_scores(hidden)
        for (lo, hi), b, a in zip([(0, 20), (20, 40), (40, 61)], before, after):
            torch.testing.assert_close(a, b + head.logit_bias[lo:hi])
        assert torch.allclose(head(hidden).logsumexp(-1), torch.zeros(()), atol=1e-5)


# A Trainer run, save and reload per case (2-3 s): every mode on the causal family and every family in cosine by
# default, the other pairs with -m slow.
@pytest.mark.parametrize(("family", "head_mode"), [
    (f, m) if f == "causal" or m == "cosine" else pytest.param(f, m, marks=pytest.mark.slow)
    for f in FAMILIES for m in HEAD_MODES
])
def test_every_family_starts_at_zero_trains_and_reloads_the_bias(family, head_mode, tmp_path):
    model = tiny_model(family, head_mode=head_mode, logit_bias=True)
    assert torch.equal(model.lm_head.logit_bias, torch.zeros(TINY_VOCAB))  # _init_weights keeps it zero
    inputs = model_inputs(model)
    plain = tiny_model(family, head_mode=head_mode)
    with torch.no_grad():  # a zero bias scores as no bias at all
        torch.testing.assert_close(model(**inputs).logits, plain(**inputs).logits, rtol=0, atol=0)

    model.train()
    labels = inputs["decoder_input_ids"] if model.config.is_encoder_decoder else inputs["input_ids"]
    model(**inputs, labels=labels).loss.backward()
    assert model.lm_head.logit_bias.grad.abs().sum() > 0  # the model's own loss reaches it
    with torch.no_grad():
        model.lm_head.logit_bias.uniform_(-1, 1)  # a trained-looking bias must survive save/load
        expected = model.eval()(**inputs).logits
    model.save_pretrained(tmp_path)
    auto = AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else AutoModelForCausalLM
    loaded, info = auto.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert loaded.config.logit_bias is True
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**inputs).logits, expected, rtol=0, atol=0)


def test_the_config_field_is_a_checked_bool():
    assert tiny_config("causal").logit_bias is False
    with pytest.raises(StrictDataclassError, match="logit_bias"):
        tiny_config("causal", logit_bias="yes")


@pytest.mark.parametrize("name", ["gpt2", "t5"])
def test_a_converted_model_gets_reloads_and_resizes_the_bias(name, tmp_path):
    model = normalize_tied_head(source_model(name), "cosine", logit_bias=True).eval()
    head = model.get_output_embeddings()
    assert torch.equal(head.logit_bias, torch.zeros(TINY_VOCAB))
    with torch.no_grad():
        head.logit_bias.uniform_(-1, 1)
    model.save_pretrained(tmp_path / "m")
    auto = AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else AutoModelForCausalLM
    loaded = auto.from_pretrained(tmp_path / "m", trust_remote_code=True).eval()
    torch.testing.assert_close(loaded.get_output_embeddings().logit_bias, head.logit_bias, rtol=0, atol=0)
    model.resize_token_embeddings(TINY_VOCAB + 3)
    resized = model.get_output_embeddings().logit_bias
    assert resized.shape == (TINY_VOCAB + 3,) and torch.equal(resized[-3:], torch.zeros(3))
    torch.testing.assert_close(resized[:TINY_VOCAB], head.logit_bias[:TINY_VOCAB])


def test_own_family_conversion_and_card_carry_the_bias(tmp_path):
    source = source_model("llama")
    source.save_pretrained(tmp_path / "source")
    model = convert_checkpoint(tmp_path / "source", tmp_path / "converted", head_mode="distance", logit_bias=True)
    assert model.config.logit_bias is True and torch.equal(model.lm_head.logit_bias, torch.zeros(TINY_VOCAB))
    card = write_model_card(tmp_path / "converted").read_text()
    assert "| logit bias (`logit_bias`) | a learned b_i per token" in card
    tiny_model("causal").save_pretrained(tmp_path / "plain")
    assert "| logit bias (`logit_bias`) | none |" in write_model_card(tmp_path / "plain").read_text()
