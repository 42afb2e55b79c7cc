"""The token cross-entropy of the plain (materialized-logits) loss path, and the count both loss paths divide by."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                        num_items_in_batch=None, ignore_index: int = -100) -> torch.Tensor:  # fmt: skip
    """Mean token cross-entropy in fp32 (fp64 for fp64 logits), over ``num_items_in_batch`` where the Trainer gives
    it; all labels ignored gives 0 with zero gradients (not 0/0 = nan, which one step would spread everywhere)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits.reshape(-1, logits.shape[-1])  # (tokens, V)
    labels = labels.reshape(-1).to(logits.device)  # (tokens,)
    try:
        total = F.cross_entropy(logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                reduction="sum")  # fmt: skip
    except IndexError as error:  # nothing is checked unless the loss failed ("Target 9000 is out of bounds.")
        raise IndexError(out_of_vocabulary_labels(labels, logits.shape[-1], ignore_index)) from error
    return total / token_count(labels, num_items_in_batch, ignore_index)


def out_of_vocabulary_labels(labels: torch.Tensor, vocab_size: int, ignore_index: int = -100) -> str:
    """Why a loss over ``vocab_size`` classes rejected ``labels``: the first one outside, and how many."""
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))
    first = int(labels[bad][0]) if bool(bad.any()) else None
    return (
        f"label {first} ({int(bad.sum())} out of range in all) is outside the vocabulary of {vocab_size} tokens "
        f"(ids 0..{vocab_size - 1}; {ignore_index} marks no target): the labels were made with another tokenizer"
    )


def token_count(labels: torch.Tensor, num_items_in_batch=None, ignore_index: int = -100) -> torch.Tensor:
    """What a summed token loss is divided by: ``num_items_in_batch`` or the batch's target tokens, at least 1."""
    if num_items_in_batch is None:
        count = (labels != ignore_index).sum()
    else:
        count = torch.as_tensor(num_items_in_batch, device=labels.device)
    return count.clamp_min(1)


__all__ = ["out_of_vocabulary_labels", "token_count", "token_cross_entropy"]
