"""Cross-entropy of a linear layer (the head's folded weight) computed in chunks of tokens: the fallback fused loss
of ``loss/policy.py`` (every device, every dtype, label smoothing), and the path ``config.loss_chunk_size`` picks.

The plain loss path materializes the (tokens × V) fp32 logits, then ``log_softmax`` and its gradient, each as
large again: at 8k tokens and a 32k vocabulary that is 1 GiB per buffer. Every head mode is ``s = W_s·h + bias``
with the folded weight ``W_s = diag(scale)·W`` (``head/folded_weight.py``), so the loss and its gradients are computed
``chunk_size`` tokens at a time, holding one (chunk × V) block at once:

* a chunk's logits ``z = h_c W_sᵀ + bias``, ``lse = logsumexp(z)``, loss ``= lse − (1−ε) z_y − ε/V Σ_j z_j``;
* d loss / d z ``= softmax(z) − (1−ε) onehot(y) − ε/V`` (0 on ignored tokens), from which ``grad_h = dz W_s``,
  ``grad_W_s += dzᵀ h_c`` and ``grad_bias += Σ_rows dz``.

The loss is a scalar, so each chunk's gradients are computed right after its loss, in the forward pass (only those
of the inputs that need one; none without gradients), and ``backward`` only multiplies them by the incoming scalar
gradient: 3 matmuls in all, as in the plain path, and about half its passes over (tokens × V) memory. No double
backward.

Precision and memory. The three matmuls run in the weight's dtype (autocast's under autocast), as the plain path's
``F.linear`` and its backward do; logits, softmax, loss and the accumulated weight gradient are fp32 (fp64 for fp64
weights). Every buffer is allocated once per call, not per chunk: the (chunk × V) logits in fp32 (and in the matmul
dtype), the (V, d) fp32 gradient accumulator, and for a bf16/fp16 matmul one (V, d) product buffer that each chunk's
``dzᵀ h_c`` is written into (``out=``) and added from (torch has no mixed-dtype ``addmm`` on the CPU).

No host synchronization: ignored tokens are masked, not dropped (no ``nonzero``), the loss and the gradients stay on
the device, and out-of-vocabulary labels are checked with ``torch._assert_async`` off the CPU (the error names them
on the CPU).
"""

from __future__ import annotations

import torch

from .token import out_of_vocabulary_labels

# Default tokens per chunk: a (chunk × V) fp32 block of about 2**23 elements (32 MiB), at least 16 tokens.
_CHUNK_ELEMENTS = 1 << 23


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk when none is configured: a (chunk × V) fp32 logits block of about 32 MiB."""
    return max(16, _CHUNK_ELEMENTS // max(1, vocab_size))


def check_labels_in_vocabulary(labels: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """Refuse a label outside [0, V) that is not ``ignore_index``: by name on the CPU, by a device-side assert
    elsewhere (no host synchronization in a training step)."""
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))
    if labels.device.type == "cpu":
        if bool(bad.any()):
            raise IndexError(out_of_vocabulary_labels(labels, vocab_size, ignore_index))
    elif not torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), f"a label is outside the vocabulary of {vocab_size} tokens")


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum over non-ignored tokens of the (label-smoothed) cross-entropy of ``hidden Wᵀ + bias``.

    Inputs: hidden (N, d), weight (V, d) (the head's folded weight), bias (V,) or None, labels (N,) int64, then
    chunk_size, label_smoothing, ignore_index. Returns a 0-dim fp32 tensor (fp64 for fp64 weights): the sum; divide
    it by the token count yourself.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index):
        device_type = hidden.device.type
        autocast = torch.is_autocast_enabled(device_type)
        matmul_dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
        with torch.autocast(device_type, enabled=False):
            return ChunkedLinearCrossEntropy._forward(
                ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index, matmul_dtype
            )

    @staticmethod
    def _forward(ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index, matmul_dtype):
        needs = ctx.needs_input_grad
        need_h, need_w, need_b = needs[0], needs[1], needs[2] and bias is not None
        compute = torch.promote_types(weight.dtype, torch.float32)
        n, vocab = hidden.shape[0], weight.shape[0]
        check_labels_in_vocabulary(labels, vocab, ignore_index)
        w = weight.to(matmul_dtype)  # no copy without autocast
        h = hidden.to(matmul_dtype)
        bias_c = None if bias is None else bias.to(compute)
        valid = labels != ignore_index  # (N,)
        targets = torch.where(valid, labels, torch.zeros_like(labels))  # gather-safe
        valid_c = valid.to(compute)
        chunk = min(chunk_size, max(n, 1))
        z_buf = torch.empty((chunk, vocab), dtype=compute, device=h.device)  # logits, then softmax, then dz
        mm_buf = z_buf if matmul_dtype == compute else torch.empty((chunk, vocab), dtype=matmul_dtype, device=h.device)
        acc_w = torch.zeros(weight.shape, dtype=compute, device=h.device) if need_w else None
        product = None if not need_w or matmul_dtype == compute else torch.empty_like(w)
        acc_b = torch.zeros(vocab, dtype=compute, device=h.device) if need_b else None
        grad_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=h.device) if need_h else None
        losses = torch.empty(n, dtype=compute, device=h.device)
        fused = need_h or need_w or need_b
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            rows = stop - start
            h_c, y_c, v_c = h[start:stop], targets[start:stop], valid_c[start:stop]
            z, z_mm = z_buf[:rows], mm_buf[:rows]
            if matmul_dtype == compute:
                if bias_c is None:
                    torch.mm(h_c, w.t(), out=z)
                else:
                    torch.addmm(bias_c, h_c, w.t(), out=z)
            else:
                torch.mm(h_c, w.t(), out=z_mm)
                z.copy_(z_mm)
                if bias_c is not None:
                    z.add_(bias_c)
            z_y = z.gather(1, y_c[:, None]).squeeze(1)
            z_sum = z.sum(dim=1) if label_smoothing else None
            z_max = z.amax(dim=1, keepdim=True)
            p = z.sub_(z_max).exp_()  # one exp pass serves logsumexp and softmax
            total = p.sum(dim=1, keepdim=True)
            loss = (z_max + total.log()).squeeze(1) - (1.0 - label_smoothing) * z_y
            if label_smoothing:
                loss -= (label_smoothing / vocab) * z_sum
            losses[start:stop] = loss * v_c
            if not fused:
                continue
            dz = p.div_(total / v_c[:, None])  # softmax, 0 on ignored tokens (p / inf): one pass
            dz.scatter_add_(1, y_c[:, None], ((label_smoothing - 1.0) * v_c)[:, None])
            if label_smoothing:
                dz.sub_((label_smoothing / vocab) * v_c[:, None])
            if need_b:  # Σ_rows dz as a matrix-vector product (a column sum is a slow strided reduction)
                acc_b.addmv_(dz.t(), v_c)
            if matmul_dtype != compute:
                z_mm.copy_(dz)  # one cast for both matmuls
                dz = z_mm
            if need_w:  # (V, d): Σ_i dz_ij h_i, accumulated in fp32
                if product is None:
                    acc_w.addmm_(dz.t(), h_c)
                else:
                    torch.mm(dz.t(), h_c, out=product)
                    acc_w += product
            if need_h:
                if grad_h.dtype == dz.dtype:
                    torch.mm(dz, w, out=grad_h[start:stop])
                else:
                    grad_h[start:stop] = dz @ w
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        ctx.grads = (grad_h, acc_w, acc_b)
        return losses.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        grad_h, acc_w, acc_b = ctx.grads  # computed with the loss, in the forward
        del ctx.grads
        go = grad_output.float() if grad_output.dtype != torch.float64 else grad_output
        out_h = None if grad_h is None else grad_h.mul_(go.to(grad_h.dtype))
        out_w = None if acc_w is None else acc_w.mul_(go).to(ctx.weight_dtype)
        out_b = None if acc_b is None else acc_b.mul_(go).to(ctx.bias_dtype)
        return out_h, out_w, out_b, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The summed token cross-entropy of ``hidden Wᵀ + bias`` (hidden (N, d), labels (N,)), chunk by chunk."""
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0])
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return ChunkedLinearCrossEntropy.apply(
        hidden, weight, bias, labels, chunk_size, float(label_smoothing), ignore_index
    )


__all__ = [
    "ChunkedLinearCrossEntropy",
    "check_labels_in_vocabulary",
    "chunked_linear_cross_entropy",
    "default_chunk_size",
]
