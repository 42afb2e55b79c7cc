"""The two O(V·d) computations of the head on its weight W, as autograd ops that read W in its own dtype, accumulate
in fp32 a block of rows at a time and keep only W (and a (V,) vector) for their backward: the row norms ‖w_i‖² that
every normalized mode's (scale, bias) is made of, and the scale folded into the weight, ``W_s = diag(scale)·W``.

Every head mode scores ``s = (W·h) * scale + bias`` (``head/modes.py``), so ``s = W_s·h + bias`` with the folded
weight W_s: any linear cross-entropy that takes a weight and a bias (liger-kernel's fused one, torch's
``F.linear_cross_entropy``, the chunked loop of ``loss/chunked.py``, a plain ``F.linear``) scores every mode.

W_s is built in W's dtype, each product computed in fp32 and rounded once (a scale can reach 1/eps, a scaled row
cannot), a block of rows at a time: a bf16 W never gets a whole fp32 copy (V·d·4 bytes, 1 GiB at V = 128k,
d = 2048). Autograd would save W_s (or an fp32 W) for the backward of ``W * scale``; this op saves W and the (V,)
scale only and computes both gradients from them:
``grad_W = scale * grad_Ws`` and ``grad_scale_j = w_j · grad_Ws_j`` (fp32 dot products).

The row norms are the same story: ``torch.linalg.vector_norm(W, dtype=torch.float32)`` of a bf16 W casts the whole
matrix to fp32 on the CPU, and its backward builds ``W * (grad / norm)`` as further fp32 (V, d) tensors (8 of them
per step with the fold, issue 49), where the baseline head makes none. ``SquaredRowNorms`` computes ‖w_i‖² with an fp32
accumulation a block at a time, saves W only, and returns ``grad_W = 2·grad_i·w_i`` in W's dtype, each product in
fp32 and rounded once: the bf16 gradient autograd's fp32 path rounded to as well.
"""

from __future__ import annotations

import torch

# Rows per block of the fp32 products: 2**22 elements (16 MiB of fp32) at most, whatever V·d is, and at most 1/8 of
# the rows, so that no fp32 temporary is ever as large as W itself (a small W is 8 blocks: 8 short kernels).
_BLOCK_ELEMENTS = 1 << 22
_MIN_BLOCKS = 8


def _row_blocks(rows: int, width: int) -> tuple[range, int]:
    """The first row of each block of rows, and the block's height."""
    step = max(1, min(_BLOCK_ELEMENTS // max(1, width), -(-rows // _MIN_BLOCKS)))
    return range(0, rows, step), step


def _scaled_rows(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """diag(scale)·weight in weight's dtype, each product in (at least) fp32 and rounded once.

    One mixed-dtype multiply per block into the bf16/fp16 result: on CUDA the kernel reads W in its dtype and
    computes in fp32 with no fp32 tensor at all; on the CPU its fp32 temporaries are one block's."""
    compute = torch.promote_types(weight.dtype, torch.float32)
    if weight.dtype == compute:
        return weight * scale.to(compute).unsqueeze(-1)
    out = torch.empty_like(weight)
    starts, step = _row_blocks(*weight.shape)
    for start in starts:
        block = slice(start, start + step)
        torch.mul(weight[block], scale[block].to(compute).unsqueeze(-1), out=out[block])
    return out


def _row_dots(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(V,) dot products of the rows of a and b, in ``dtype`` (fp32 at least), a block of rows at a time (a whole
    ``vecdot`` would build the (V, d) product, in fp32 for fp32 rows)."""
    out = torch.empty(a.shape[0], dtype=dtype, device=a.device)
    starts, step = _row_blocks(*a.shape)
    for start in starts:
        block = slice(start, start + step)
        out[block] = torch.linalg.vecdot(a[block].to(dtype), b[block].to(dtype))
    return out


class SquaredRowNorms(torch.autograd.Function):
    """‖w_i‖² of every row of W (V, d), as a (V,) vector in fp32 (fp64 for an fp64 W); saves W only."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        # vector_norm with an fp32 dtype reads W in its dtype and accumulates in fp32 (on the CPU, one block's copy).
        compute = torch.promote_types(weight.dtype, torch.float32)
        out = torch.empty(weight.shape[0], dtype=compute, device=weight.device)
        starts, step = _row_blocks(*weight.shape)
        for start in starts:
            block = slice(start, start + step)
            out[block] = torch.linalg.vector_norm(weight[block], dim=-1, dtype=compute)
        return out.square()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_norms: torch.Tensor) -> torch.Tensor:
        (weight,) = ctx.saved_tensors
        return _scaled_rows(weight, 2 * grad_norms)  # d‖w_i‖²/dw_i = 2·w_i, in W's dtype


def squared_row_norms(weight: torch.Tensor) -> torch.Tensor:
    """‖w_i‖² of every row of ``weight`` (V, d) (or (..., d)): shape (V,) (or (...,)), fp32 (fp64 for fp64 rows), with
    no fp32 copy of a bf16/fp16 W in the forward or the backward."""
    if weight.dim() != 2:  # looked-up rows (tokens, ..., d): O(tokens·d), nothing to save
        return torch.linalg.vector_norm(weight, dim=-1, dtype=torch.promote_types(weight.dtype, torch.float32)).square()
    return SquaredRowNorms.apply(weight)


class FoldScale(torch.autograd.Function):
    """``W_s = diag(scale)·W`` (V, d) in W's dtype; saves W and scale, not W_s."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight, scale)
        return _scaled_rows(weight, scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_folded: torch.Tensor):
        weight, scale = ctx.saved_tensors
        grad_weight = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_weight = _scaled_rows(grad_folded, scale).to(weight.dtype)
        if ctx.needs_input_grad[1]:
            compute = torch.promote_types(torch.promote_types(weight.dtype, scale.dtype), torch.float32)
            grad_scale = _row_dots(grad_folded, weight, compute).to(scale.dtype)
        return grad_weight, grad_scale


def fold_scale(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``diag(scale)·weight`` (V, d) in weight's dtype; ``weight`` itself when ``scale`` is None. ``scale``: (V,)."""
    if scale is None:
        return weight
    if scale.shape != weight.shape[:1]:
        raise ValueError(f"the head's scale has shape {tuple(scale.shape)}, its weight {tuple(weight.shape)}: "
                         "a mode's column_terms must return one scale per row (V,)")
    return FoldScale.apply(weight, scale)


__all__ = ["FoldScale", "SquaredRowNorms", "fold_scale", "squared_row_norms"]
