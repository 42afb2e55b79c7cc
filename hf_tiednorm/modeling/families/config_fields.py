"""The configs' field types and validators, which ``@strict`` runs whenever a field is set."""

import math
from typing import Literal

from huggingface_hub.dataclasses import as_validated_field
from transformers.utils.type_validators import interval, positive_int_field

from ..head.settings import check_head_mode

LossImplementation = Literal["auto", "fused", "chunked", "plain"]  # loss/policy.LOSS_IMPLEMENTATIONS


@as_validated_field
def positive_finite_field(value: float | None) -> None:
    """> 0 and finite, or None (unset): an inf scale or eps makes the loss nan (inf · 0) or the softmax uniform."""
    if value is not None and not 0 < value < math.inf:
        raise ValueError(f"Value must be > 0 and finite, got {value}")


@as_validated_field
def non_negative_field(value: float | None) -> None:
    """>= 0, or None (unset)."""
    if value is not None and not value >= 0:
        raise ValueError(f"Value must be >= 0, got {value}")


head_mode_field = as_validated_field(check_head_mode)  # a registered head mode, or an error naming the known ones
# Widths and vocabularies must be >= 1 (a zero fails much later, e.g. with ZeroDivisionError), layer counts >= 0.
size_field = positive_int_field
layer_count_field = interval(min=0)


__all__ = [
    "LossImplementation", "head_mode_field", "layer_count_field", "non_negative_field", "positive_finite_field",
    "size_field",
]  # fmt: skip
