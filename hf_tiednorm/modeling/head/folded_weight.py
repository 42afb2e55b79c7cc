"""The head's O(V·d) work on W in four passes per training step (``FoldedHead``): ‖w_i‖² and ``W_s = diag(scale)·W``
forward; from ``M = ∂L/∂W_s``, ``w_i·M_i`` and ``diag(scale)·M + diag(2·∂L/∂‖w‖²)·W`` (over M) backward. Products in
fp32, rounded once; no fp32 copy of a bf16 W (blocks of rows through small fp32 buffers). Why: docs/code_notes.md."""

from __future__ import annotations

import contextlib

import torch

# Elements per fp32 block: 16 MiB (few blocks: each op has a fixed cost), 64 MiB on an accelerator; ≤ 1/8 of the rows.
_BLOCK_ELEMENTS = 1 << 22
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 24
_MIN_BLOCKS = 8
_GIVEN_NORMS = "_tiednorm_squared_row_norms"  # on FoldedHead's alias of W: its norms, for squared_row_norms


def _row_blocks(rows: int, width: int, block_elements: int = _BLOCK_ELEMENTS) -> tuple[range, int]:
    """The first row of each block of rows, and the block's height."""
    step = max(1, min(block_elements // max(1, width), -(-rows // _MIN_BLOCKS)))
    return range(0, rows, step), step


class _Blocks:
    """The blocks of rows of a (V, d) weight, each with ``buffers`` fp32 (fp64) buffers of the block's shape."""

    def __init__(self, weight: torch.Tensor, buffers: int):
        self.compute = _compute_dtype(weight)
        elements = _BLOCK_ELEMENTS if weight.device.type == "cpu" else _ACCELERATOR_BLOCK_ELEMENTS
        (self.starts, self.step), self.rows = _row_blocks(*weight.shape, elements), weight.shape[0]
        shape = (min(self.step, self.rows), weight.shape[1])
        self.buffers = [torch.empty(shape, dtype=self.compute, device=weight.device) for _ in range(buffers)]

    def __iter__(self):
        for start in self.starts:
            stop = min(start + self.step, self.rows)
            yield slice(start, stop), [buffer[: stop - start] for buffer in self.buffers]


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, torch.float32)


def _without_autocast(device: torch.device):
    """Autocast off (its fp32 list would copy a bf16 W to fp32 for a norm), where the device has one."""
    return torch.autocast(device.type, enabled=False) if torch.amp.is_autocast_available(device.type) else (
        contextlib.nullcontext())


def _mixed_on_cpu(weight: torch.Tensor) -> bool:
    """W is bf16/fp16 on the CPU, where a mixed-dtype op would copy it to fp32 whole."""
    return weight.device.type == "cpu" and weight.dtype != _compute_dtype(weight)


def _one_kernel(weight: torch.Tensor) -> bool:
    """W is fp32/fp64 on the CPU: passes 3 and 4 are one kernel each (else blocks: no fp32 copy of W, no TF32)."""
    return weight.device.type == "cpu" and weight.dtype == _compute_dtype(weight)


def _squared_norms(weight: torch.Tensor, blocks: _Blocks | None = None) -> torch.Tensor:
    """Pass 1: ‖w_i‖² of every row, (V,) in fp32 (fp64 for fp64 rows), accumulated in fp32."""
    compute = _compute_dtype(weight)
    if not _mixed_on_cpu(weight):  # one kernel (on CUDA it reads bf16 and accumulates in fp32)
        return torch.linalg.vector_norm(weight, dim=-1, dtype=compute).square()
    norms = torch.empty(weight.shape[0], dtype=compute, device=weight.device)
    for rows, (buffer,) in blocks or _Blocks(weight, 1):
        torch.linalg.vector_norm(buffer.copy_(weight[rows]), dim=-1, out=norms[rows])
    return norms.square_()


def _scaled_rows(weight: torch.Tensor, scale: torch.Tensor, blocks: _Blocks | None = None) -> torch.Tensor:
    """Pass 2: diag(scale)·W in W's dtype, each product in fp32 and rounded once. ``scale``: (V,)."""
    if not _mixed_on_cpu(weight):  # one kernel: products in fp32 registers, stored in W's dtype
        return torch.mul(weight, scale.unsqueeze(-1), out=torch.empty_like(weight))
    out = torch.empty_like(weight)
    for rows, (buffer,) in blocks or _Blocks(weight, 1):
        out[rows].copy_(buffer.copy_(weight[rows]).mul_(scale[rows].unsqueeze(-1)))
    return out


def _row_dots(weight: torch.Tensor, other: torch.Tensor, blocks: _Blocks | None) -> torch.Tensor:
    """Pass 3: w_i·m_i of every row, (V,) in fp32 (fp64), each product in fp32."""
    if _one_kernel(weight):  # a batched (1 × d)·(d × 1) product: no (V, d) temporary
        return torch.einsum("vd,vd->v", weight, other)
    dots = torch.empty(weight.shape[0], dtype=blocks.compute, device=weight.device)
    for rows, (a, b) in blocks:
        torch.sum(a.copy_(weight[rows]).mul_(b.copy_(other[rows])), dim=-1, out=dots[rows])
    return dots


def _combine_rows(grad, alpha: torch.Tensor | None, weight, beta: torch.Tensor | None, out, blocks) -> torch.Tensor:
    """Pass 4: ``out = diag(alpha)·grad + diag(beta)·W`` (alpha None: 1; beta None: 0), each row computed in fp32
    and rounded once into W's dtype; ``out`` may be ``grad`` itself."""
    if _one_kernel(weight):
        if alpha is not None:
            torch.mul(grad, alpha.unsqueeze(-1), out=out)
        elif out is not grad:
            out.copy_(grad)
        return out if beta is None else out.addcmul_(weight, beta.unsqueeze(-1))
    for rows, (a, b) in blocks:
        a.copy_(grad[rows])
        if alpha is not None:
            a.mul_(alpha[rows].unsqueeze(-1))
        if beta is not None:
            a.addcmul_(b.copy_(weight[rows]), beta[rows].unsqueeze(-1))
        out[rows].copy_(a)
    return out


def _own_buffer(grad: torch.Tensor) -> bool:
    """A gradient nobody else holds (a matmul's fresh output), which we may overwrite: torch's ``InputBuffer`` test."""
    use_count = getattr(grad, "_use_count", None)
    return use_count is not None and use_count() == 1 and not grad._is_view() and grad.is_contiguous()


class SquaredRowNorms(torch.autograd.Function):
    """‖w_i‖² of every row of W (V, d), (V,) fp32 (fp64 for an fp64 W), saving W only: outside ``FoldedHead``."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _squared_norms(weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_norms: torch.Tensor) -> torch.Tensor:
        (weight,) = ctx.saved_tensors
        return _scaled_rows(weight, 2 * grad_norms)  # d‖w_i‖²/dw_i = 2·w_i, in W's dtype


def squared_row_norms(weight: torch.Tensor) -> torch.Tensor:
    """‖w_i‖² of every row of ``weight`` (V, d) (or (..., d)): shape (V,) (or (...,)), fp32 (fp64 for fp64 rows), with
    no fp32 copy of a bf16/fp16 W in the forward or the backward. Inside ``FoldedHead``, the norms of its pass 1."""
    given = getattr(weight, _GIVEN_NORMS, None)
    if given is not None:
        return given()
    if weight.dim() != 2:  # looked-up rows (tokens, ..., d): O(tokens·d), nothing to save
        return torch.linalg.vector_norm(weight, dim=-1, dtype=_compute_dtype(weight)).square()
    if torch.is_grad_enabled() and weight.requires_grad:
        return SquaredRowNorms.apply(weight)
    return _squared_norms(weight)


class FoldedHead(torch.autograd.Function):
    """``(W_s, bias)``, ``W_s = diag(scale)·W``, of ``column_terms`` (a function of W returning the head's fp32 (V,)
    (scale, bias), each or None), W (V, d) and every tensor ``column_terms`` reads that may need a gradient (the head's
    learned terms). W_s is in W's dtype (W itself when the scale is None), the bias (V,) fp32 or None."""

    @staticmethod
    def forward(ctx, column_terms, weight, *terms):
        ctx.set_materialize_grads(False)
        with _without_autocast(weight.device):
            blocks = _Blocks(weight, 1) if _mixed_on_cpu(weight) else None
            # The (V,) computation recorded on the norms of pass 1, from an alias of W that carries them.
            alias, norms = weight.detach().requires_grad_(weight.requires_grad), []
            def squared():  # pass 1, when a term first asks (the baseline never does): a leaf of the (V,) graph
                if not norms:
                    norms.append(_squared_norms(weight.detach(), blocks).requires_grad_(weight.requires_grad))
                return norms[0]
            setattr(alias, _GIVEN_NORMS, squared)
            with torch.enable_grad():
                scale, bias = column_terms(alias)
            folded = weight if scale is None else _scaled_rows(weight, scale.detach(), blocks)
        ctx.save_for_backward(weight)
        ctx.graph = (norms[0] if norms else None, alias, scale, bias, terms)
        return folded, None if bias is None else bias.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_folded, grad_bias):
        (weight,) = ctx.saved_tensors
        squared, alias, scale, bias, terms = ctx.graph
        with _without_autocast(weight.device):
            blocks = None if _one_kernel(weight) else _Blocks(weight, 2)
            # c_i = ∂L/∂scale_i (pass 3) and ∂L/∂bias_i, taken back through the (V,) computation by autograd.
            outputs, grads = [], []
            if scale is not None and scale.requires_grad and grad_folded is not None:
                outputs.append(scale)
                grads.append(_row_dots(weight, grad_folded, blocks))
            if bias is not None and bias.requires_grad and grad_bias is not None:
                outputs.append(bias)
                grads.append(grad_bias.float() if grad_bias.dtype != bias.dtype else grad_bias)
            inputs = [t for t in (squared, alias, *terms) if t is not None and t.requires_grad]
            got = dict.fromkeys(map(id, inputs))
            if outputs and inputs:
                # retain_graph: (V,) vectors only, freed with this node; a retained outer graph may call us again.
                found = torch.autograd.grad(outputs, inputs, grads, allow_unused=True, retain_graph=True)
                got = {id(t): g for t, g in zip(inputs, found)}
            grad_weight = None
            if ctx.needs_input_grad[1]:
                # Pass 4: diag(scale)·M + diag(2·∂L/∂‖w‖²)·W, written over M when it is a buffer of our own.
                grad_squared, grad_alias = got.get(id(squared)), got.get(id(alias))
                beta = None if grad_squared is None else 2 * grad_squared
                alpha = None if scale is None or grad_folded is None else scale.detach()
                grad_weight = grad_folded  # no scale, no norms (the baseline): W_s is W
                if alpha is not None or beta is not None:
                    source = grad_folded if grad_folded is not None else torch.zeros_like(weight)
                    out = source if grad_folded is None or _own_buffer(grad_folded) else torch.empty_like(weight)
                    grad_weight = _combine_rows(source, alpha, weight, beta, out, blocks)
                if grad_alias is not None:  # a mode reading W otherwise than through its norms
                    grad_weight = grad_alias if grad_weight is None else grad_weight + grad_alias
        term_grads = [got.get(id(t)) if t.requires_grad else None for t in terms]
        return None, grad_weight, *term_grads


def fold_scale(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``diag(scale)·weight`` (V, d) in its dtype, no gradients (export, decoding); ``weight`` if ``scale`` is None."""
    if scale is None:
        return weight
    if scale.shape != weight.shape[:1]:
        raise ValueError(f"the head's scale has shape {tuple(scale.shape)}, its weight {tuple(weight.shape)}: "
                         "a mode's column_terms must return one scale per row (V,)")
    return _scaled_rows(weight, scale)


__all__ = ["FoldedHead", "SquaredRowNorms", "fold_scale", "squared_row_norms"]
