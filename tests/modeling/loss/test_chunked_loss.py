"""The chunked head cross-entropy (hf_tiednorm/modeling/loss/chunked.py) equals the plain path: value and gradients."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from testing_utils import FAMILIES, model_inputs, tiny_config, tiny_model

from hf_tiednorm import HEAD_MODES, TiedNormHead
from hf_tiednorm.modeling.head.settings import HeadSettings
from hf_tiednorm.modeling.loss.head_loss import chunked_head_cross_entropy
from hf_tiednorm.modeling.loss.token import token_cross_entropy

VOCAB, DIM = 37, 8


def _head(mode, logit_scale, dtype):
    torch.manual_seed(0)
    head = TiedNormHead(DIM, VOCAB, settings=HeadSettings(head_mode=mode, logit_scale_kind=logit_scale)).to(dtype)
    with torch.no_grad():
        head.weight.normal_()
        head.weight[5].zero_()  # a zero row: the eps lower bound must behave the same on both paths
        if head.logit_scale is not None:
            head.logit_scale.uniform_(0.5, 3.0)  # distinct per-token values for "vector"
    return head


def _data(dtype, ignore, n=23):
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, n, DIM, generator=g, dtype=dtype)
    labels = torch.randint(0, VOCAB, (3, n), generator=g)
    if ignore:
        labels[0, :4] = -100
        labels[2, -3:] = -100
    return hidden, labels


def _loss_and_grads(head, hidden, labels, smoothing, num_items, chunk):
    head.zero_grad()
    h = hidden.clone().requires_grad_(True)
    if chunk is None and hidden.dtype == torch.float64:  # token_cross_entropy computes in fp32; stay in fp64 here
        logits = head(h).reshape(-1, VOCAB)
        loss = F.cross_entropy(logits, labels.reshape(-1), label_smoothing=smoothing, reduction="sum")
        loss = loss / (num_items if num_items is not None else (labels != -100).sum())
    elif chunk is None:
        loss = token_cross_entropy(head(h), labels, smoothing, num_items)
    else:
        loss = chunked_head_cross_entropy(head, h, labels, chunk, smoothing, num_items)
    loss.backward()
    grads = {"hidden": h.grad, "weight": head.weight.grad}
    if head.logit_scale is not None:
        grads["logit_scale"] = head.logit_scale.grad
    return loss.detach(), grads


CASES = list(itertools.product(HEAD_MODES, ("none", "fixed", "scalar", "vector"), (0.0, 0.1), (False, True)))


@pytest.mark.parametrize("mode,logit_scale,smoothing,ignore", CASES)
def test_chunked_equals_plain(mode, logit_scale, smoothing, ignore):
    """fp64 weights and hidden states: the chunked path computes in fp64 then, so tolerances are tight."""
    dtype = torch.float64
    head = _head(mode, logit_scale, dtype)
    hidden, labels = _data(dtype, ignore)
    ref_loss, ref = _loss_and_grads(head, hidden, labels, smoothing, None, None)
    for chunk in (7, 1000):
        loss, got = _loss_and_grads(head, hidden, labels, smoothing, None, chunk)
        assert loss.dtype == ref_loss.dtype == torch.float64
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
        assert got.keys() == ref.keys()
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-10, atol=1e-12, msg=f"{chunk} grad {name}")


@pytest.mark.parametrize("mode", HEAD_MODES)
def test_chunked_fp32_and_num_items(mode):
    head = _head(mode, "scalar", torch.float32)
    hidden, labels = _data(torch.float32, ignore=True)
    for num_items in (None, 150, torch.tensor(150)):
        ref_loss, ref = _loss_and_grads(head, hidden, labels, 0.1, num_items, None)
        loss, got = _loss_and_grads(head, hidden, labels, 0.1, num_items, 5)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for name in ref:
            torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-6, msg=f"grad {name}")


def test_chunked_no_grad_and_all_ignored():
    head = _head("cosine", "none", torch.float32)
    hidden, labels = _data(torch.float32, ignore=False)
    with torch.no_grad():
        torch.testing.assert_close(
            chunked_head_cross_entropy(head, hidden, labels, 4), token_cross_entropy(head(hidden), labels)
        )
    all_ignored = torch.full_like(labels, -100)
    assert chunked_head_cross_entropy(head, hidden, all_ignored, 4) == 0  # no targets: 0, not 0/0
    with pytest.raises(ValueError, match="chunk_size"):
        chunked_head_cross_entropy(head, hidden, labels, 0)


def _plain_and_chunked(family, **config):
    """The same tiny model in training mode with the plain and the chunked loss, its inputs and labels (-100 some)."""
    plain = tiny_model(family, label_smoothing=0.1, **config).train()
    chunked = tiny_model(family, label_smoothing=0.1, loss_chunk_size=3, **config).train()
    chunked.load_state_dict(plain.state_dict())
    inputs = model_inputs(plain, batch_size=2, length=7)
    labels = inputs.pop("decoder_input_ids", inputs["input_ids"]).clone()
    labels[0, :2] = -100
    return plain, chunked, inputs, labels


@pytest.mark.parametrize("family", FAMILIES)
def test_config_validation(family):
    with pytest.raises(StrictDataclassError, match="loss_chunk_size"):
        tiny_config(family, loss_chunk_size=0)
    assert tiny_config(family, loss_chunk_size=128).loss_chunk_size == 128


@pytest.mark.parametrize("mode", HEAD_MODES)
def test_chunked_under_bf16_autocast_runs_its_matmuls_in_bf16_and_the_rest_in_fp32(mode):
    """bf16 autocast is the training scripts' default on CPUs with native bf16: the chunked path then multiplies in
    bf16 (as the plain path's F.linear does) and keeps logits, softmax and loss in fp32. Reference: the plain loss
    of logits from explicit bf16 matmuls, with fp32 weights, scale and bias."""
    head = _head(mode, "scalar", torch.float32)
    hidden, labels = _data(torch.float32, ignore=True)
    scale, bias = head.column_terms()
    weight_scaled = head.weight if scale is None else head.weight * scale[:, None]

    def reference(h):
        logits = (h.bfloat16() @ weight_scaled.bfloat16().t()).float()
        return token_cross_entropy(logits if bias is None else logits + bias, labels, 0.1)

    h = hidden.clone().requires_grad_(True)
    expected = reference(h)
    (expected_grad,) = torch.autograd.grad(expected, h)
    h = hidden.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = chunked_head_cross_entropy(head, h, labels, 5, 0.1)
        loss.backward()  # inside autocast too
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-5)
    # d loss / d h: dz (fp32) rounded to bf16 for the matmul, as autocast's backward of F.linear rounds it
    torch.testing.assert_close(h.grad, expected_grad, rtol=2e-2, atol=1e-3)
    assert head.weight.grad.dtype == torch.float32 and head.weight.grad.isfinite().all()


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("mode", ("baseline", "cosine"))
def test_model_level_equivalence_under_bf16_autocast(family, mode):
    """A model with loss_chunk_size trains under bf16 autocast (it raised a dtype error in the weight-gradient
    matmul) with the plain path's loss and gradients up to bf16 rounding."""
    plain, chunked, inputs, labels = _plain_and_chunked(family, head_mode=mode)
    results = []
    for model in (plain, chunked):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(**inputs, labels=labels).loss
        loss.backward()
        results.append((loss, model.get_input_embeddings().weight.grad))
    (ref_loss, ref_grad), (loss, grad) = results
    torch.testing.assert_close(loss, ref_loss, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad, rtol=5e-2, atol=5e-2 * ref_grad.abs().max().item())
