"""The one entry point of the head's fused training loss, ``head_linear_cross_entropy`` (the families' loss, the
wrapper's and liger-kernel's dispatch through the Trainer call it): every mode scores ``s = W_s·h + bias`` with the
folded weight ``W_s = diag(scale)·W``, so it folds the head's terms once and calls the fused kernel the policy chose."""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F

from ..head.folded_weight import fold_scale
from .chunked import check_labels_in_vocabulary, chunked_linear_cross_entropy
from .policy import liger_drops_head_gradients
from .token import token_count


def _liger_loss(hidden, weight, bias, labels, label_smoothing, ignore_index):
    try:  # an optional extra; in a try block so that remote code does not require it (transformers' get_imports)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise ImportError(
            'the liger path needs liger-kernel: python -m pip install liger-kernel (or the gpu extra, -e ".[gpu]")'
        ) from error

    options = {"ignore_index": ignore_index, "label_smoothing": label_smoothing, "reduction": "sum"}
    if "accum_dtype" in inspect.signature(LigerFusedLinearCrossEntropyLoss).parameters:
        options["accum_dtype"] = torch.float32  # the weight gradient accumulated in fp32
    if bias is not None and not torch.is_autocast_enabled(hidden.device.type):
        bias = bias.to(weight.dtype)  # liger adds the bias in the weight's dtype
    if hidden.dtype != weight.dtype and not torch.is_autocast_enabled(hidden.device.type):
        hidden = hidden.to(weight.dtype)
    loss = LigerFusedLinearCrossEntropyLoss(**options)(weight, hidden, labels, bias)
    return loss.float() if loss.dtype != torch.float64 else loss


def _torch_loss(hidden, weight, bias, labels, ignore_index):
    options = torch.nn.LinearCrossEntropyOptions(acc_policy="accurate")
    if bias is not None:
        bias = bias.to(weight.dtype)
    return F.linear_cross_entropy(
        hidden.to(weight.dtype), weight, labels, linear_bias=bias, reduction="sum", ignore_index=ignore_index,
        options=options,
    )


def head_linear_cross_entropy(head, hidden: torch.Tensor, labels: torch.Tensor, path: str, label_smoothing: float = 0.0,
                              chunk_size: int | None = None, ignore_index: int = -100) -> torch.Tensor:  # fmt: skip
    """The summed token cross-entropy of ``head`` (a ``TiedNormHead``) on hidden (N, d) against labels (N,), by the
    fused ``path`` (``"liger"``, ``"torch"``, ``"chunked"``), never holding the (N × V) logits. Gradients reach W,
    the learned logit scale g and bias b through the head's column terms and the fold."""
    scale, bias = head.column_terms()  # fp32 (V,) each, or None; autograd chains them to W, g and b
    weight = fold_scale(head.weight, scale)  # diag(scale)·W in W's dtype, saving W and scale only
    if path == "chunked":
        return chunked_linear_cross_entropy(hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index)
    if path == "liger" and liger_drops_head_gradients(hidden, weight, bias):  # a frozen body: the chunked loop
        return chunked_linear_cross_entropy(hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index)
    check_labels_in_vocabulary(labels, weight.shape[0], ignore_index)
    if path == "liger":
        return _liger_loss(hidden, weight, bias, labels, float(label_smoothing), ignore_index)
    if path == "torch":
        if label_smoothing:
            raise ValueError("torch's F.linear_cross_entropy is exact only without label smoothing")
        return _torch_loss(hidden, weight, bias, labels, ignore_index)
    raise ValueError(f"no fused loss path {path!r}; expected 'liger', 'torch' or 'chunked'")


def chunked_head_cross_entropy(head, hidden_states: torch.Tensor, labels: torch.Tensor, chunk_size: int | None = None,
                               label_smoothing: float = 0.0, num_items_in_batch=None,
                               ignore_index: int = -100) -> torch.Tensor:  # fmt: skip
    """Same value and gradients as ``token_cross_entropy(head(hidden_states), labels, ...)`` without ever
    holding the (tokens × V) logits. ``head`` is a ``TiedNormHead``; hidden_states (..., d), labels (...)."""
    hidden = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, d)
    labels = labels.reshape(-1).to(hidden.device)  # (N,)
    total = head_linear_cross_entropy(head, hidden, labels, "chunked", label_smoothing, chunk_size, ignore_index)
    return total / token_count(labels, num_items_in_batch, ignore_index).to(total.device)


__all__ = ["chunked_head_cross_entropy", "head_linear_cross_entropy"]
