"""Cross-entropy of the normalized tied head, computed in chunks of tokens (opt-in: ``config.loss_chunk_size``).

The plain loss path materializes the (tokens × V) fp32 logits, then ``log_softmax`` and its gradient, each as
large again: at 8k tokens and a 32k vocabulary that is 1 GiB per buffer. Every head mode is an affine map of the
raw scores (``s = (W·h) * scale + bias``, see ``normalized_head.py``), so the loss and its gradients can be
computed ``chunk_size`` tokens at a time, holding one (chunk × V) block at once:

* the scale is folded into the weight once, ``W_s = W * scale`` (V, d), so a chunk's logits are one ``addmm``:
  ``z = h_c W_sᵀ + bias`` (fp32), ``lse = logsumexp(z)``, loss ``= lse − (1−ε) z_y − ε/V Σ_j z_j``;
* d loss / d z ``= softmax(z) − (1−ε) onehot(y) − ε/V`` (ignored tokens are dropped up front), from which
  ``grad_h = dz W_s`` and ``G += dzᵀ h_c`` (V, d); at the end ``grad_W = scale * G``,
  ``grad_scale_j = w_j · G_j`` (= Σ_i dz_ij (h_i·w_j)) and ``grad_bias = Σ_rows dz``.

The (V,) vectors ``scale``/``bias`` are inputs of the ``autograd.Function``; their gradients flow back through
``TiedNormHead.column_terms()`` (row norms → W, learned logit scale) by ordinary autograd outside it.

The loss is a scalar, so each chunk's gradients are computed right after its loss, in the forward pass (only those
of the inputs that need one; none without gradients), and ``backward`` only multiplies them by the incoming scalar
gradient. Each chunk's logits are computed once: 3 matmuls in all, as in the plain path, and about half its passes
over (tokens × V) memory. Tokens whose label is ``ignore_index`` are dropped before any matmul. No double backward.

Under autocast the three matmuls run in autocast's dtype, as the plain path's ``F.linear`` and its backward do, and
everything else (logits, softmax, loss, the accumulated weight gradient) in fp32: autocast itself is switched off
inside, because it would also lower the ``addmm`` with the bias and the in-place softmax to bf16.
"""

from __future__ import annotations

import torch

from .token_loss import out_of_vocabulary_labels, token_count


def _chunk_logits(h_c, weight_mm, bias, compute_dtype):
    """z = h_c (W * scale)ᵀ + bias, the chunk's logits (c, V) in ``compute_dtype``. ``h_c`` and ``weight_mm``
    (= W * scale) come in the matmul dtype: autocast's, or the compute dtype itself."""
    if bias is not None and weight_mm.dtype == compute_dtype:
        return torch.addmm(bias, h_c, weight_mm.t())
    z = (h_c @ weight_mm.t()).to(compute_dtype)  # no copy without autocast
    return z if bias is None else z.add_(bias)


def _chunk_loss_and_softmax(z, y_c, label_smoothing):
    """Per-token loss (c,) and logsumexp (c,) of the chunk's logits z (c, V); z is overwritten with softmax(z)."""
    z_y = z.gather(1, y_c[:, None]).squeeze(1)
    z_sum = z.sum(dim=1) if label_smoothing else None
    z_max = z.amax(dim=1)
    p = z.sub_(z_max[:, None]).exp_()  # one exp pass serves logsumexp and softmax
    total = p.sum(dim=1)
    lse = z_max + total.log()
    p.mul_(total.reciprocal_()[:, None])
    loss = lse - (1.0 - label_smoothing) * z_y
    if label_smoothing:
        loss -= (label_smoothing / z.shape[1]) * z_sum
    return loss, lse


def _chunk_backward(p, h_c, y_c, weight_mm, label_smoothing, need, grads, hidden_dtype):
    """From the chunk's softmax p (overwritten with d loss / d z), accumulates Σ dzᵀ h_c and Σ dz into ``grads``
    (compute dtype); returns d loss / d h_c in ``hidden_dtype`` (or None). ``h_c``, ``weight_mm``: matmul dtype."""
    dz = p
    dz.scatter_add_(1, y_c[:, None], torch.full((dz.shape[0], 1), label_smoothing - 1.0, dtype=dz.dtype))
    if label_smoothing:
        dz -= label_smoothing / dz.shape[1]
    if need["bias"]:
        grads["bias"] += dz.sum(dim=0)
    dz_mm = dz.to(weight_mm.dtype)  # one cast for both matmuls; none without autocast
    if need["weight"] or need["scale"]:  # (V, d): Σ_i dz_ij h_i
        if dz_mm.dtype == grads["dzT_h"].dtype:
            grads["dzT_h"].addmm_(dz_mm.t(), h_c)
        else:
            grads["dzT_h"] += dz_mm.t() @ h_c
    return (dz_mm @ weight_mm).to(hidden_dtype) if need["hidden"] else None


class ChunkedHeadCrossEntropy(torch.autograd.Function):
    """Sum over non-ignored tokens of the (label-smoothed) cross-entropy of ``(hidden Wᵀ) * scale + bias``.

    Inputs: hidden (N, d), weight (V, d), scale (V,) or None, bias (V,) or None, labels (N,) int64, then
    chunk_size, label_smoothing, ignore_index. Returns a 0-dim fp32 tensor (fp64 for fp64 weights):
    the sum; divide it by the token count yourself.

    The scale is folded into the weight once, ``W_s = W * scale`` (V, d), so a chunk's logits are one
    ``addmm``. With ``G = Σ_chunks dzᵀ h_c`` (V, d) the gradients are ``grad_W = scale * G`` and
    ``grad_scale_j = w_j · G_j`` (since Σ_i dz_ij (h_i·w_j) = w_j·Σ_i dz_ij h_i), and ``grad_h = dz W_s``.
    """

    @staticmethod
    def forward(ctx, hidden, weight, scale, bias, labels, chunk_size, label_smoothing, ignore_index):
        device_type = hidden.device.type
        compute_dtype = torch.promote_types(weight.dtype, torch.float32)
        autocast = torch.is_autocast_enabled(device_type)
        ctx.matmul_dtype = torch.get_autocast_dtype(device_type) if autocast else compute_dtype
        with torch.autocast(device_type, enabled=False):
            return ChunkedHeadCrossEntropy._forward(
                ctx, hidden, weight, scale, bias, labels, chunk_size, label_smoothing, ignore_index
            )

    @staticmethod
    def _forward(ctx, hidden, weight, scale, bias, labels, chunk_size, label_smoothing, ignore_index):
        needs = ctx.needs_input_grad
        need = {
            "hidden": needs[0],
            "weight": needs[1],
            "scale": needs[2] and scale is not None,
            "bias": needs[3] and bias is not None,
        }
        compute_dtype, matmul_dtype = torch.promote_types(weight.dtype, torch.float32), ctx.matmul_dtype
        weight_scaled = weight.to(compute_dtype)
        if scale is not None:
            weight_scaled = weight_scaled * scale.to(compute_dtype)[:, None]
        bias_c = bias.to(compute_dtype) if bias is not None else None
        weight_mm = weight_scaled.to(matmul_dtype)  # cast once for every chunk's matmuls
        keep = (labels != ignore_index).nonzero().squeeze(1)  # (n,) rows that have a target
        h = hidden.index_select(0, keep).to(matmul_dtype)  # (n, d)
        y = labels.index_select(0, keep)  # (n,)
        n, vocab = h.shape[0], weight.shape[0]
        if ((y < 0) | (y >= vocab)).any():
            raise IndexError(out_of_vocabulary_labels(labels, vocab, ignore_index))
        fused = any(need.values())  # without gradients, the loss alone
        grads = _new_grads(weight, compute_dtype, need) if fused else None
        grad_h = hidden.new_zeros(hidden.shape) if fused and need["hidden"] else None
        total = torch.zeros((), dtype=compute_dtype, device=hidden.device)
        for start in range(0, n, chunk_size):
            stop = min(start + chunk_size, n)
            h_c, y_c = h[start:stop], y[start:stop]
            z = _chunk_logits(h_c, weight_mm, bias_c, compute_dtype)
            loss, _ = _chunk_loss_and_softmax(z, y_c, label_smoothing)
            total += loss.sum()
            if fused:
                g = _chunk_backward(z, h_c, y_c, weight_mm, label_smoothing, need, grads, hidden.dtype)
                if g is not None:
                    grad_h.index_copy_(0, keep[start:stop], g)
            del z
        ctx.need = need
        ctx.term_dtypes = (None if scale is None else scale.dtype, None if bias is None else bias.dtype)
        ctx.grads, ctx.grad_h = grads, grad_h
        ctx.save_for_backward(weight, scale)
        return total

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        with torch.autocast(grad_output.device.type, enabled=False):  # a backward called inside autocast
            return ChunkedHeadCrossEntropy._backward(ctx, grad_output)

    @staticmethod
    def _backward(ctx, grad_output):
        need = ctx.need
        weight, scale = ctx.saved_tensors  # the gradients were computed with the loss, in the forward
        grads, grad_h = ctx.grads, ctx.grad_h
        del ctx.grads, ctx.grad_h
        go = grad_output
        scale_dtype, bias_dtype = ctx.term_dtypes
        out_h = grad_h.mul_(go.to(grad_h.dtype)) if need["hidden"] else None
        out_w = out_s = out_b = None
        if need["weight"] or need["scale"]:
            g_mat = grads["dzT_h"].mul_(go)  # (V, d)
            if need["scale"]:  # Σ_i dz_ij raw_ij = w_j · G_j
                out_s = (weight.to(g_mat.dtype) * g_mat).sum(dim=1).to(scale_dtype)
            if need["weight"]:
                out_w = (g_mat * scale.to(g_mat.dtype)[:, None] if scale is not None else g_mat).to(weight.dtype)
        if need["bias"]:
            out_b = grads["bias"].mul_(go).to(bias_dtype)
        return out_h, out_w, out_s, out_b, None, None, None, None


def _new_grads(weight, compute_dtype, need) -> dict:
    grads = {}
    if need["weight"] or need["scale"]:  # accumulated in fp32 whatever the weight's dtype
        grads["dzT_h"] = torch.zeros(weight.shape, dtype=compute_dtype, device=weight.device)
    if need["bias"]:
        grads["bias"] = torch.zeros(weight.shape[0], dtype=compute_dtype, device=weight.device)
    return grads


def chunked_head_cross_entropy(
    head,
    hidden_states: torch.Tensor,
    labels: torch.Tensor,
    chunk_size: int,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Same value and gradients as ``token_cross_entropy(head(hidden_states), labels, ...)`` without ever
    holding the (tokens × V) logits. ``head`` is a ``TiedNormHead``; hidden_states (..., d), labels (...)."""
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, d)
    labels = labels.reshape(-1).to(hidden.device)  # (N,)
    scale, bias = head.column_terms()  # autograd outside the Function chains their grads to W / logit scale
    total = ChunkedHeadCrossEntropy.apply(
        hidden, head.weight, scale, bias, labels, chunk_size, float(label_smoothing), ignore_index
    )
    return total / token_count(labels, num_items_in_batch, ignore_index).to(total.device)


__all__ = ["ChunkedHeadCrossEntropy", "chunked_head_cross_entropy"]
