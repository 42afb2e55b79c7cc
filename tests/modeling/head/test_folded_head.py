"""The head's fold as one op (folded_weight.FoldedHead): the gradients of W and of every learned term equal those of
autograd's composition (a norm op, the (V,) terms, W·scale) in fp64 over every mode and term; a training step makes
one or two (V, d) tensors beyond the baseline head's (the norm and fold ops made four, in every mode);
the fold rounds once in bf16 and keeps W and (V,) vectors only; a caller's gradient buffer is never written."""

from __future__ import annotations

import pytest
import torch
from testing_utils import HEAD_VARIANTS, variant_head
from torch.utils._python_dispatch import TorchDispatchMode

import hf_tiednorm.modeling.head.folded_weight as folded_weight
from hf_tiednorm.modeling.head.folded_weight import FoldedHead, fold_scale, squared_row_norms
from hf_tiednorm.modeling.loss.head_loss import head_linear_cross_entropy
from hf_tiednorm.modeling.loss.token import token_cross_entropy


def _composed(head):
    """(W_s, bias) through autograd's composition: what the fold computes, written the plain way."""
    scale, bias = head._compute_column_terms()
    return (head.weight if scale is None else head.weight * scale[:, None]), bias


def _grads(head, fold, probe_w, probe_b):
    head.zero_grad(set_to_none=True)
    weight, bias = fold(head)
    loss = (weight * probe_w).sum() + (0 if bias is None else (bias * probe_b).sum())
    loss.backward()
    return {name: p.grad.clone() for name, p in head.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("blocked", [False, True], ids=["one-kernel", "blocks"])
@pytest.mark.parametrize(("head_mode", "logit_scale", "logit_bias"), HEAD_VARIANTS)
def test_the_fold_has_the_gradients_of_the_composition_in_fp64(head_mode, logit_scale, logit_bias, blocked,
                                                               monkeypatch):
    if blocked:  # the accelerator's way for the row dots and the combination: blocks, the last one short
        monkeypatch.setattr(folded_weight, "_one_kernel", lambda weight: False)
        monkeypatch.setattr(folded_weight, "_ACCELERATOR_BLOCK_ELEMENTS", 3 * 8)
        monkeypatch.setattr(folded_weight, "_BLOCK_ELEMENTS", 3 * 8)
    head = variant_head(head_mode, logit_scale, logit_bias)
    generator = torch.Generator().manual_seed(3)
    probe_w = torch.randn(head.weight.shape, generator=generator, dtype=torch.float64)
    probe_b = torch.randn(head.weight.shape[0], generator=generator, dtype=torch.float64)
    expected = _grads(head, _composed, probe_w, probe_b)
    got = _grads(head, lambda h: h.folded_weight_and_bias(), probe_w, probe_b)
    assert got.keys() == expected.keys() and "weight" in got
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")
    with torch.no_grad():  # evaluation: the same values without autograd
        for got_value, value in zip(head.folded_weight_and_bias(), _composed(head)):
            torch.testing.assert_close(got_value, value) if value is not None else None


def test_the_fold_passes_gradcheck_and_refuses_a_scale_of_another_shape():
    # fp64 terms written here (a head's terms are fp32 by design): a cosine scale g/‖w‖ and a distance-like bias.
    def column_terms(weight, g, b):
        squared = squared_row_norms(weight)
        return g * squared.rsqrt(), b - 0.5 * g * squared

    generator = torch.Generator().manual_seed(4)
    weight, g, b = (torch.randn(shape, generator=generator, dtype=torch.float64, requires_grad=True)
                    for shape in ((9, 4), (9,), (9,)))
    assert torch.autograd.gradcheck(
        lambda w, g, b: FoldedHead.apply(lambda alias: column_terms(alias, g, b), w, g, b), (weight, g, b)
    )
    with pytest.raises(ValueError, match=r"one scale per row \(V,\)"):
        fold_scale(weight, torch.ones(3, dtype=torch.float64))


def test_a_callers_gradient_buffer_is_not_overwritten():
    head = variant_head("cosine", "vector", True)
    weight, bias = head.folded_weight_and_bias()
    grad_w, grad_b = torch.randn_like(weight), torch.randn_like(bias)
    kept = grad_w.clone()
    torch.autograd.grad((weight, bias), (head.weight, head.logit_scale), (grad_w, grad_b))
    assert torch.equal(grad_w, kept)


def test_the_fold_rounds_once_and_saves_w_and_vectors_only_in_bf16():
    head = variant_head("cosine", "vector", True, vocab=40, dim=16, dtype=torch.bfloat16)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        folded, _ = head.folded_weight_and_bias()
    scale, _ = head._compute_column_terms()
    assert folded.dtype == torch.bfloat16
    assert torch.equal(folded, (head.weight.float() * scale[:, None]).to(torch.bfloat16))  # one rounding
    wide = [(t.dtype, tuple(t.shape)) for t in saved if t.dim() > 1]
    assert wide == [(torch.bfloat16, (40, 16))] and all(t.dim() <= 1 for t in saved if t is not head.weight)


class NewVByD(TorchDispatchMode):
    """Counts the (V, d) tensors ops create in new storage (not views, not in-place results)."""

    def __init__(self, shape):
        super().__init__()
        self.shape, self.count = tuple(shape), 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in (*args, *(kwargs or {}).values())
                  if isinstance(t, torch.Tensor)}
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape
                    and t.untyped_storage().data_ptr() not in inputs):
                self.count += 1
        return out


def _plain(head, hidden, labels):
    return token_cross_entropy(head(hidden), labels)


def _chunked(head, hidden, labels):
    return head_linear_cross_entropy(head, hidden, labels, "chunked", 0.0, 16)


@pytest.mark.parametrize("loss", [_plain, _chunked], ids=["plain", "chunked"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_normalized_step_makes_one_v_by_d_tensor_beyond_the_baselines(loss, dtype):
    vocab, dim, tokens = 96, 16, 40  # tokens > d: the scale is folded into W's rows
    hidden = torch.randn(tokens, dim).to(dtype).requires_grad_(True)
    labels = torch.randint(1, vocab, (tokens,))
    counts = {}
    for mode in ("baseline", "l2", "square", "distance", "cosine"):
        normalized = mode != "baseline"
        head = variant_head(mode, "vector" if normalized else "none", normalized, vocab=vocab, dim=dim, dtype=dtype)
        with NewVByD((vocab, dim)) as seen:
            loss(head, hidden, labels).backward()
        counts[mode] = seen.count
    # The folded weight W_s, which the loss's matmul keeps for its backward; the norms' and the fold's gradients of
    # W are written into the loss's gradient of W_s where it is a buffer of its own (the chunked loop's), else into
    # one new tensor (F.linear hands it over as a view of its matmul's output). The composition made four.
    extra = {"plain": 2, "chunked": 1}[loss.__name__.strip("_")]
    assert all(count == counts["baseline"] + extra for mode, count in counts.items() if mode != "baseline"), counts


def test_a_bf16_w_of_32k_by_512_goes_through_the_cpu_in_eight_blocks():
    # Each op costs a fixed time on top of its work (a CPU's threads meet at its end): 16 blocks of 2,048 rows made
    # about 220 ops per step, bf16↔fp32 conversions included; 8 of 4,000 rows (1/8 of W, 8 MiB of fp32) halve that.
    starts, rows = folded_weight._row_blocks(32_000, 512)
    assert (len(starts), rows) == (8, 4_000)
