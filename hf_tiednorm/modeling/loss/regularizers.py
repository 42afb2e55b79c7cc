"""The two loss regularizers of the tied embedding, each returned as its own number.

Projection regularization (Press & Wolf, 2017, "Using the Output Embedding to Improve Language Models", §4):
a matrix P ∈ R^{H×H} is inserted between the decoder output and the tied output embedding, so the logits are
W·(P·h), and λ‖P‖ is added to the loss (the paper uses λ = 0.15). P is initialized to the identity, so a fresh
model scores exactly as without it.

Which norm: the paper writes ‖P‖₂ and calls it the L2 norm; the authors' released TensorFlow code
(ofirpress/UsingTheOutputEmbedding, ``ptb_word_lm_WT_PR.py``) penalizes ``tf.nn.l2_loss(P)``, i.e. the L2 norm
of P's entries. We use that entry-wise reading, unsquared: the Frobenius norm ‖P‖_F. Unsquared, its gradient
λ·P/‖P‖_F has norm λ whatever the width H, so the paper's λ = 0.15 keeps its meaning at any model size
(the squared form would put 0.15·H/2 nats on the identity init: 19 nats at H = 256). It is also cheap
(no SVD per step, unlike the spectral norm) and differentiable everywhere except P = 0.

Weight-norm regularization (Herold, Gao & Ney, 2018, "Improving Neural Language Models with Weight Norm
Initialization and Regularization"): ρ·Σ_k (‖w_k‖ − ν)² over the rows w_k of the output (tied) embedding,
paper values ρ = 1e-3, ν = 2.0. It pulls every row norm towards ν, i.e. it limits the frequency bias that
row norms carry in a tied softmax.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn


@dataclass
class LossTerms:
    """The terms of a model's ``loss`` (their sum), carried next to it by the model outputs (which inherit these
    fields) and logged one by one by the Trainer. Each is the share of this batch in the accumulated batch, like the
    Trainer-scaled loss; a regularizer that is off is None.

    cross_entropy: the token cross-entropy; projection_penalty / weight_norm_penalty: the two regularizers.
    """

    cross_entropy: torch.FloatTensor | None = None
    projection_penalty: torch.FloatTensor | None = None
    weight_norm_penalty: torch.FloatTensor | None = None


# The loss-term names, in field order: what the Trainer logs and evaluation ignores.
LOSS_TERMS: tuple[str, ...] = tuple(field.name for field in fields(LossTerms))


class OutputProjection(nn.Linear):
    """Press & Wolf's projection P (H×H, no bias) applied to the decoder output before the tied head.

    Initialized to the identity (by ``reset_parameters`` and by the model's ``_init_weights``).
    """

    def __init__(self, hidden_size: int, device=None, dtype=None) -> None:
        super().__init__(hidden_size, hidden_size, bias=False, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        nn.init.eye_(self.weight)


def projection_penalty(projection: torch.Tensor, strength: float) -> torch.Tensor:
    """λ·‖P‖_F in fp32 (see the module docstring for the choice of norm)."""
    return strength * torch.linalg.matrix_norm(projection.float(), ord="fro")


def weight_norm_penalty(weights: list[torch.Tensor], strength: float, target_norm: float) -> torch.Tensor:
    """ρ·Σ_k (‖w_k‖ − ν)² in fp32, summed over the rows of every matrix in ``weights``.

    ``weights`` is the output embedding split in one or more matrices (one per band with adaptive softmax);
    rows may have different widths across matrices. A zero row (the padding row) has a zero subgradient.
    """
    total = sum(
        (torch.linalg.vector_norm(w.float(), dim=-1) - target_norm).square().sum() for w in weights
    )
    return strength * total


__all__ = ["LOSS_TERMS", "LossTerms", "OutputProjection", "projection_penalty", "weight_norm_penalty"]
