"""What a plain export (``export.py``) checks before it writes anything: whether the output layer may stay tied to
the input embedding, that every baked tensor is finite, and that the export's logits are the model's within a stated
tolerance.

Issue 40: the tie used to be kept when the baked rows equalled the lookups "up to 8 roundings of the weight dtype",
which in bf16 is 6 %: a trained logit scale of 1.05 was dropped (S2). A NaN weight exported with rc 0 and a card
saying "exactly" (S3). Now the tie needs an effective fp32 scale of 1 (``TIE_RTOL``), and every export refuses
non-finite weights (``refuse_non_finite``) and a logit difference above ``logit_tolerance`` (``check_logits``).
"""

from __future__ import annotations

import math

import torch

# How far (relative, element-wise) the fp32 output rows may lie from the fp32 lookups for the tie to be kept: 2 fp32
# ulps, the rounding of an effective scale of 1 computed in fp32 (‖w_i‖·(1/‖w_i‖) is 1 or 1 − 2⁻²⁴) and of its
# product with w_i. Compared in fp32 before the rows are cast to the weight dtype: in bf16, "equal up to the
# rounding of the weight dtype" let a trained scale of 1.05 pass as 1 (issue 40, S2).
TIE_RTOL = 2 * torch.finfo(torch.float32).eps


def rows_are_lookups(rows: torch.Tensor, lookups: torch.Tensor) -> bool:
    """Whether the fp32 effective output rows are the fp32 lookups, i.e. every effective scale is 1 (``TIE_RTOL``)."""
    return rows.shape == lookups.shape and bool(((rows - lookups).abs() <= TIE_RTOL * lookups.abs()).all())


def logit_tolerance(dtype: torch.dtype, largest_logit: float) -> float:
    """The largest |logit difference| an export may show against its model: the rounding of the baked rows to the
    weight dtype, ``max(1e-4, 2·eps(dtype))`` relative to the largest |logit| (at least 1): 1e-4 in fp32, 2e-3 in
    fp16, 1.6e-2 in bf16. A row scale dropped by a wrong tie (5 % in bf16) or a lost bias lies above it."""
    return max(1e-4, 2 * torch.finfo(dtype).eps) * max(1.0, largest_logit)


def refuse_non_finite(state: dict) -> None:
    """``ValueError`` naming each baked tensor that holds NaN or inf (a NaN weight, a mode dividing by a zero norm)."""
    bad = {}
    for name, tensor in state.items():
        if tensor.is_floating_point():
            finite = torch.isfinite(tensor)
            if not finite.all():
                where = (~finite).nonzero()[0].tolist()
                bad[name] = f"{int((~finite).sum())} of {tensor.numel()} values, first at index {where}"
    if bad:
        listed = "; ".join(f"{name}: {what}" for name, what in bad.items())
        raise ValueError(
            f"the baked weights are not finite ({listed}): the model's own weights or its head mode's column terms "
            "(e.g. a division by a zero-norm row) give NaN/inf, which the export would ship; nothing was written"
        )


@torch.no_grad()
def differing_tensors(source: torch.nn.Module, target: torch.nn.Module, state: dict) -> list[str]:
    """What the export ``target`` holds differently from what it was given: each parameter or persistent buffer whose
    value is not its baked tensor in ``state``, and each buffer (RoPE's ``inv_freq``, a causal mask, ...) whose dtype
    or value differs from the same-named buffer of ``source`` (the model's exported body). A ``model.to(dtype)`` casts
    buffers that ``from_pretrained`` keeps in fp32: the export, built as ``from_pretrained`` builds it, then computes
    other scores than the model. One line per tensor, naming it and both dtypes."""
    found = []
    for name, tensor in target.state_dict().items():
        if name in state and not torch.equal(state[name].to(tensor.dtype), tensor):
            found.append(f"{name} (the export holds other values than the baked {state[name].dtype} tensor)")
    own = dict(source.named_buffers())
    for name, buffer in target.named_buffers():
        theirs = own.get(name)
        if theirs is None or theirs.shape != buffer.shape:
            continue
        if theirs.dtype != buffer.dtype or not torch.equal(theirs.to(buffer.dtype), buffer):
            what = "values" if theirs.dtype == buffer.dtype else "dtype"
            found.append(
                f"buffer {name} ({what}: the model's is {str(theirs.dtype).removeprefix('torch.')}, the export's, as "
                f"from_pretrained builds it, {str(buffer.dtype).removeprefix('torch.')})"
            )
    return found


def check_logits(difference: float, largest: float, dtype: torch.dtype, suspects=None) -> float:
    """The tolerance (``logit_tolerance``) that ``difference``, the largest |export − model logit| on random ids,
    met; ``ValueError`` when a logit is not finite or the difference exceeds it. ``largest``: the largest |model
    logit|; ``dtype``: the weights'; ``suspects``: called on a refusal, the tensors that differ between the model and
    its export (``differing_tensors``), which the message names instead of the baked output layer."""
    if not math.isfinite(largest):
        raise ValueError(
            "the model's own logits on random token ids are not finite (NaN/inf): it cannot be exported; check its "
            "weights and head mode"
        )
    tolerance = logit_tolerance(dtype, largest)
    if not difference <= tolerance:  # also NaN
        found = suspects() if suspects is not None else []
        cause = (
            f"these tensors differ between the model and its export: {'; '.join(found)}. A model cast with "
            ".to(dtype) casts buffers that from_pretrained keeps in float32; load the model with "
            "from_pretrained(folder, dtype=...) (or export its folder)"
            if found else "the baked output layer does not compute the model's scores"
        )
        raise ValueError(
            f"the export's logits differ from the model's by {difference:.3g} on random token ids (largest |logit| "
            f"{largest:.3g}), above the tolerance {tolerance:.3g} for {str(dtype).removeprefix('torch.')} "
            f"(logit_tolerance): {cause}; nothing was written"
        )
    return tolerance


__all__ = ["TIE_RTOL", "check_logits", "differing_tensors", "logit_tolerance", "refuse_non_finite", "rows_are_lookups"]
