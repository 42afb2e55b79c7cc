"""The row norms of the head's weight (folded_weight.SquaredRowNorms, issue 49): the plain path of every mode with a
bf16 W creates no fp32 (V, d) tensor in forward or backward (``torch.linalg.vector_norm(W, dtype=fp32)`` and its
backward made 8 per step for cosine and square, where baseline made none), and its bf16 gradients of W, g and b are
as close to the fp64 reference as those of that autograd path."""

from __future__ import annotations

import pytest
import torch
from testing_utils import head_loss_and_grads, variant_head
from torch.utils._python_dispatch import TorchDispatchMode

import hf_tiednorm.modeling.head.folded_weight as folded_weight
from hf_tiednorm.modeling.head.folded_weight import SquaredRowNorms, squared_row_norms
from hf_tiednorm.modeling.loss.token import token_cross_entropy

MODES = ("baseline", "l2", "square", "distance", "cosine")


class WideFp32Tensors(TorchDispatchMode):
    """Records every fp32 tensor an op creates with rows of width d and more than ``max_rows`` rows."""

    def __init__(self, width: int, max_rows: int):
        super().__init__()
        self.width, self.max_rows, self.seen = width, max_rows, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if (isinstance(t, torch.Tensor) and t.dtype == torch.float32 and t.dim() >= 2
                    and t.shape[-1] == self.width and t.numel() > self.max_rows * self.width):
                self.seen.append(f"{func}: {tuple(t.shape)}")
        return out


def _batch(n: int, dim: int, vocab: int, dtype=torch.bfloat16, seed: int = 2):
    generator = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, dim, generator=generator).to(dtype)
    labels = torch.randint(1, vocab, (n,), generator=generator)
    labels[::5] = -100
    return hidden, labels


def _plain_loss(head, hidden, labels):
    return token_cross_entropy(head(hidden), labels)


@pytest.mark.parametrize("tokens", [24, 96])  # tokens ≤ d: the logits are scaled; tokens > d: W's rows are
@pytest.mark.parametrize("head_mode", MODES)
def test_the_plain_path_of_a_bf16_head_makes_no_fp32_copy_of_w(head_mode, tokens):
    vocab, dim = 256, 32
    # The blocks of the fp32 products are 1/8 of the rows at most (and 16 MiB of fp32 at most at real sizes).
    assert folded_weight._row_blocks(vocab, dim)[1] == vocab // folded_weight._MIN_BLOCKS == 32
    head = variant_head(head_mode, "vector", True, vocab=vocab, dim=dim, dtype=torch.bfloat16)
    hidden, labels = _batch(tokens, dim, vocab)
    with WideFp32Tensors(width=dim, max_rows=32) as mode:
        grads = head_loss_and_grads(head, hidden, labels, _plain_loss)
    assert not mode.seen, f"{head_mode}: fp32 tensors of more than one block of W's rows: {mode.seen}"
    assert grads["W"].dtype == torch.bfloat16 and torch.isfinite(grads["W"].float()).all()


def _vector_norm_column_terms(mode_name: str, weight: torch.Tensor, eps: float):
    """The mode's (scale, bias) through ``torch.linalg.vector_norm(W, dtype=fp32)`` and autograd (the code before
    issue 49), written out here as the accuracy yardstick."""
    norms = torch.linalg.vector_norm(weight, dim=-1, dtype=torch.float32)
    if mode_name == "distance":
        return None, -0.5 * norms.square()
    power = 2 if mode_name == "square" else 1
    inverse = norms.clamp_min(eps).pow(-power)
    return torch.where(norms > eps, inverse, torch.zeros_like(inverse)), None


@pytest.mark.parametrize("head_mode", MODES[1:])
def test_bf16_gradients_are_as_close_to_fp64_as_autograds_vector_norm(head_mode, monkeypatch):
    vocab, dim, tokens = 300, 48, 160
    head = variant_head(head_mode, "vector", True, vocab=vocab, dim=dim, dtype=torch.bfloat16)
    with torch.no_grad():
        head.weight.mul_(torch.rand(vocab, 1) * 3)  # rows of many norms, the dead row 0 kept
    hidden, labels = _batch(tokens, dim, vocab)
    got = head_loss_and_grads(head, hidden, labels, _plain_loss)

    reference_head = variant_head(head_mode, "vector", True, vocab=vocab, dim=dim, dtype=torch.float64)
    reference_head.load_state_dict({k: v.double() for k, v in head.state_dict().items()})  # the same bf16 values
    reference = head_loss_and_grads(reference_head, hidden.double(), labels, _plain_loss)

    mode = head.mode
    monkeypatch.setattr(type(mode), "column_terms", lambda self, w, eps: _vector_norm_column_terms(self.name, w, eps))
    before = head_loss_and_grads(head, hidden, labels, _plain_loss)
    for name in ("W", "g", "b"):
        error = (got[name].double() - reference[name]).norm() / reference[name].norm()
        yardstick = (before[name].double() - reference[name]).norm() / reference[name].norm()
        assert error <= 1.05 * yardstick + 1e-6, f"{head_mode} grad {name}: {error:.3g} vs {yardstick:.3g} before"
        assert error < 2e-2, f"{head_mode} grad {name}: relative error {error:.3g} against fp64"
    if head_mode != "distance":  # (distance divides by no norm: its dead row scores w_0·h and learns)
        assert got["W"][0].abs().max() == 0  # a dead row gets no gradient through its norm


def test_squared_row_norms_have_fp64_gradients_and_save_only_w(monkeypatch):
    monkeypatch.setattr(folded_weight, "_BLOCK_ELEMENTS", 3 * 4)  # several blocks, the last one short
    weight = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(SquaredRowNorms.apply, (weight,))
    torch.testing.assert_close(squared_row_norms(weight), (weight * weight).sum(-1))
    bf16 = torch.randn(7, 4).to(torch.bfloat16).requires_grad_(True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        norms = squared_row_norms(bf16)
    assert norms.dtype == torch.float32 and saved == [bf16]
    torch.testing.assert_close(norms, bf16.double().square().sum(-1).float())  # fp32 accumulation
    norms.sum().backward()
    assert bf16.grad.dtype == torch.bfloat16 and torch.equal(bf16.grad, (2 * bf16.float()).to(torch.bfloat16))
