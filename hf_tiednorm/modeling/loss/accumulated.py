"""A wrapped model's loss as its share of an accumulated batch, which the Trainer's gradient accumulation needs.

transformers' ``Trainer`` passes ``num_items_in_batch`` (the target tokens of all micro-batches of one optimizer
step) to a model whose ``forward`` takes ``**kwargs``, and then no longer divides the loss by the accumulation
steps: it expects loss = (sum of this micro-batch's token losses) / num_items_in_batch. The wrapper's ``forward``
takes ``**kwargs`` for any architecture, but the encoder-decoders of transformers (T5, BART, mBART, Marian, M2M100)
compute a plain mean with ``CrossEntropyLoss`` and ignore ``num_items_in_batch``: gradient and logged loss were
multiplied by the accumulation steps. So the wrapper never hands ``num_items_in_batch`` to the wrapped model; it
takes the model's mean over its own targets and rescales it by (this micro-batch's targets) / num_items_in_batch,
which is the sum over the accumulated batch's token mean for every architecture (those that honour the argument,
the causal LMs, compute the same value).
"""

from __future__ import annotations

import torch


def target_count(labels: torch.Tensor, shifted: bool, shift_labels: torch.Tensor | None = None) -> torch.Tensor:
    """The tokens the wrapped model's loss averages over: ``labels`` != -100, without each row's first position
    for a causal LM (it predicts labels[t+1] from position t), or ``shift_labels`` where the caller gives them.

    Args:
        labels: (batch, length) target ids, -100 = no target.
        shifted: True for a causal LM (transformers' ``ForCausalLMLoss`` shifts the labels), False for an
            encoder-decoder (its labels are aligned with the decoder outputs).
        shift_labels: (batch, length) already shifted targets, or None.

    Returns:
        a 0-dim integer tensor.
    """
    targets = shift_labels if shift_labels is not None else labels[..., 1:] if shifted else labels
    return (targets != -100).sum()


def share_of_accumulated_batch(outputs, labels, num_items_in_batch, shifted: bool, shift_labels=None):
    """``outputs`` of the wrapped model (computed without ``num_items_in_batch``) with its mean loss turned into this
    micro-batch's share of the accumulated batch's token mean: loss · target_count / num_items_in_batch.

    Args:
        outputs: a ``ModelOutput`` or tuple whose ``loss`` (first element) is the mean over this micro-batch's
            targets, or has no loss.
        labels: (batch, length) the labels passed to the model, or None.
        num_items_in_batch: the accumulated batch's target tokens (int or 0-dim tensor), or None: nothing to do.
        shifted, shift_labels: as in ``target_count``.

    Returns:
        ``outputs``, its loss rescaled in place (a new tuple for tuple outputs).
    """
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
