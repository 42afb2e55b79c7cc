"""Which linear cross-entropy computes the head's training loss (``config.loss_implementation``): every mode scores
``s = W_s·h + bias`` with the folded weight ``W_s = diag(scale)·W``, so liger-kernel's fused loss (CUDA), torch's
``F.linear_cross_entropy`` (where exact: fp32/fp64 without label smoothing), the chunked loop (every device and
dtype) or the plain materialized logits compute it. A fused path returns no logits. (docs/code_notes.md)"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F

from ..head.layer import TiedNormHead

LOSS_IMPLEMENTATIONS = ("auto", "fused", "chunked", "plain")
# "auto" takes a fused path from this many logits on (tokens × V: 64M, 256 MiB of fp32 logits, about 0.75 GiB with
# their softmax and gradient): an LLM fine-tune (V = 49k at 2k tokens, 128k at 8k) takes it; a Multi30k-sized
# model (V = 8k, about 2k tokens a batch) keeps the plain path on every batch, not one path or the other by length.
AUTO_MIN_LOGITS = 1 << 26


def liger_installed() -> bool:
    """liger-kernel (the ``gpu`` extra) can be imported."""
    return importlib.util.find_spec("liger_kernel") is not None


def torch_linear_cross_entropy_available() -> bool:
    """torch has ``F.linear_cross_entropy`` with chunking options (torch ≥ 2.13)."""
    return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")


def fused_kernel(device: torch.device, matmul_dtype: torch.dtype, label_smoothing: float) -> str:
    """The fused kernel for this device, matmul dtype and label smoothing: ``"liger"``, ``"torch"`` or
    ``"chunked"`` (see the module docstring)."""
    if device.type == "cuda" and liger_installed():
        return "liger"
    exact_in_torch = matmul_dtype in (torch.float32, torch.float64) and not label_smoothing
    if device.type == "cuda" and exact_in_torch and torch_linear_cross_entropy_available():
        return "torch"
    # On the CPU the chunked loop is faster than torch's op at the sizes measured (docs/benchmarks.md).
    return "chunked"


def choose_loss_path(
    requested: str,
    head: torch.nn.Module,
    tokens: int,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> str:
    """``"liger"``, ``"torch"``, ``"chunked"`` or ``"plain"``: what computes the loss of ``head`` over ``tokens``
    scored tokens (hidden states on the head's device) for ``config.loss_implementation = requested``. A head
    without a single weight matrix (the adaptive softmax) has the plain path only."""
    if requested not in LOSS_IMPLEMENTATIONS:
        raise ValueError(f"loss_implementation must be one of {LOSS_IMPLEMENTATIONS}, got {requested!r}")
    if requested == "plain" or not isinstance(head, TiedNormHead):
        return "plain"
    if requested == "chunked" or (requested == "auto" and chunk_size is not None):
        return "chunked"
    weight = head.weight
    if requested == "auto" and (tokens * weight.shape[0] < AUTO_MIN_LOGITS or tokens <= weight.shape[1]):
        return "plain"
    device = weight.device
    autocast = torch.is_autocast_enabled(device.type)
    matmul_dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
    return fused_kernel(device, matmul_dtype, label_smoothing)


def liger_drops_head_gradients(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether liger-kernel's fused linear cross-entropy would silently give the head no gradient: it computes the
    weight and bias gradients only when the hidden states require grad (liger-kernel 0.8.5,
    ``ops/fused_linear_cross_entropy.py``), so head-only training with a frozen body got ∇W = ∇g = 0 and ∇b = None
    where the plain and chunked paths give the true ones. ``head_linear_cross_entropy`` runs the chunked loop then."""
    head_trains = weight.requires_grad or (bias is not None and bias.requires_grad)
    return torch.is_grad_enabled() and head_trains and not hidden.requires_grad


def refuse_fused_loss_scored_outside(config) -> None:
    """Raise ``ValueError`` naming ``label_smoothing_factor`` when a training step's logits are scored outside the
    model (the Trainer's label smoother or a ``compute_loss_func`` pass no labels) while ``config`` asks for a fused
    loss by name: the model would have to return the (tokens × V) logits the fused path exists to avoid."""
    implementation = getattr(config, "loss_implementation", "auto")
    if implementation in ("fused", "chunked"):
        raise ValueError(
            f"loss_implementation={implementation!r}: the Trainer scores this training step's logits itself "
            "(TrainingArguments(label_smoothing_factor=...) or compute_loss_func), so the model would have to return "
            "the (tokens × V) logits its fused loss never materializes. Set label_smoothing_factor=0 and smooth with "
            "the model config's own label_smoothing field (config.label_smoothing=0.1, which the fused path "
            "computes), or set loss_implementation='auto' / 'plain' to let the Trainer score the logits"
        )


__all__ = [
    "AUTO_MIN_LOGITS",
    "LOSS_IMPLEMENTATIONS",
    "choose_loss_path",
    "fused_kernel",
    "liger_drops_head_gradients",
    "liger_installed",
    "refuse_fused_loss_scored_outside",
    "torch_linear_cross_entropy_available",
]
