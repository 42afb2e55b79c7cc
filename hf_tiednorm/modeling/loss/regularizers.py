"""The two regularizers of the tied embedding, each its own term of the loss: Press & Wolf's projection P (λ·‖P‖_F,
P = I at first) and Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)². (docs/code_notes.md)"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn


@dataclass
class LossTerms:
    """The terms of a model's ``loss`` (their sum), fields of the model outputs, logged one by one by the Trainer;
    a regularizer that is off is None."""

    cross_entropy: torch.FloatTensor | None = None
    projection_penalty: torch.FloatTensor | None = None
    weight_norm_penalty: torch.FloatTensor | None = None


# The loss-term names, in field order: what the Trainer logs and evaluation ignores.
LOSS_TERMS: tuple[str, ...] = tuple(field.name for field in fields(LossTerms))


class OutputProjection(nn.Linear):
    """Press & Wolf's projection P (H×H, no bias) before the tied head, the identity at first."""

    def __init__(self, hidden_size: int, device=None, dtype=None) -> None:
        super().__init__(hidden_size, hidden_size, bias=False, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        nn.init.eye_(self.weight)


def projection_penalty(projection: torch.Tensor, strength: float) -> torch.Tensor:
    """λ·‖P‖_F in fp32: unsquared, so λ keeps its meaning at any width (docs/code_notes.md)."""
    return strength * torch.linalg.matrix_norm(projection.float(), ord="fro")


def weight_norm_penalty(weights: list[torch.Tensor], strength: float, target_norm: float) -> torch.Tensor:
    """ρ·Σ_k (‖w_k‖ − ν)² in fp32 over the rows of every matrix of the output embedding (one per adaptive band)."""
    return strength * sum((torch.linalg.vector_norm(w.float(), dim=-1) - target_norm).square().sum() for w in weights)


__all__ = ["LOSS_TERMS", "LossTerms", "OutputProjection", "projection_penalty", "weight_norm_penalty"]
