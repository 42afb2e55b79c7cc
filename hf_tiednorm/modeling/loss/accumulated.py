"""A wrapped model's loss as its share of a gradient-accumulated batch: the Trainer passes ``num_items_in_batch`` and
expects sum/num_items, but transformers' encoder-decoders return a plain mean, so the wrapper rescales the wrapped
model's mean by (this micro-batch's targets) / num_items_in_batch. (docs/code_notes.md)"""

from __future__ import annotations

import torch


def target_count(labels: torch.Tensor, shifted: bool, shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens the wrapped model's loss averages over, a 0-dim integer tensor: ``labels`` (batch, length) != -100,
    without each row's first position for a causal LM (``shifted``), or ``shift_labels`` where given."""
    targets = shift_labels if shift_labels is not None else labels[..., 1:] if shifted else labels
    return (targets != -100).sum()


def share_of_accumulated_batch(outputs, labels, num_items_in_batch, shifted: bool, shift_labels=None):
    """``outputs`` of the wrapped model (computed without ``num_items_in_batch``) with its mean loss rescaled in place
    to this micro-batch's share: loss · target_count / num_items_in_batch (a new tuple for tuple outputs)."""
    if num_items_in_batch is None or labels is None:
        return outputs
    loss = outputs[0] if isinstance(outputs, tuple) else getattr(outputs, "loss", None)
    if loss is None or loss.dim() != 0:
        return outputs
    count = target_count(labels, shifted, shift_labels).to(loss.device, torch.float32)
    total = torch.as_tensor(num_items_in_batch, device=loss.device, dtype=torch.float32)
    loss = loss * (count / total).to(loss.dtype)
    if isinstance(outputs, tuple):
        return (loss, *outputs[1:])
    outputs.loss = loss
    return outputs


__all__ = ["share_of_accumulated_batch", "target_count"]
