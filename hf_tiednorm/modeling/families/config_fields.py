"""What the configs' fields are made of: the field types and validators (``@strict`` runs them whenever a field is
set) and ``script_flag``, the metadata that makes a config field a training script's flag."""

import math
from typing import Literal, get_args

from huggingface_hub.dataclasses import as_validated_field
from transformers.utils.type_validators import interval, positive_int_field

from ..head.modes import get_head_mode

TieTopology = Literal["untied", "decoder", "three_way"]
LossImplementation = Literal["auto", "fused", "chunked", "plain"]  # fused_loss.LOSS_IMPLEMENTATIONS
TIE_TOPOLOGIES: tuple[str, ...] = get_args(TieTopology)


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


@as_validated_field
def head_mode_field(value: str) -> None:
    """A registered head mode (head_modes.py); the error names the value and the modes this code defines."""
    get_head_mode(value)


def script_flag(help: str, *, finetune: bool = False, new_model_only: bool = False, choices=None) -> dict:
    """The metadata of a config field that the training scripts offer as a flag: its ``help`` text, and whether
    fine-tuning a saved model may change it (``finetune``: a loss weight, which changes no parameter) or only a new
    model takes it (``new_model_only``: applied when the model is built). The one place a field is described:
    ``hf_tiednorm.training.arguments`` derives the scripts' flags and their fine-tuning rules from it. ``choices``:
    the values the flag accepts, for a field whose type is no ``Literal`` (a live sequence such as ``HEAD_MODES`` is
    read when the flag is parsed)."""
    metadata = {"help": help, "finetune": finetune, "new_model_only": new_model_only}
    if choices is not None:
        metadata["choices"] = choices
    return metadata


# Widths and vocabularies must be >= 1 (a zero fails much later, e.g. with ZeroDivisionError), layer counts >= 0.
size_field = positive_int_field
layer_count_field = interval(min=0)


__all__ = [
    "LossImplementation", "TIE_TOPOLOGIES", "TieTopology", "head_mode_field", "layer_count_field",
    "non_negative_field", "positive_finite_field", "script_flag", "size_field",
]  # fmt: skip
