"""Weight-norm initialization (Herold, Gao & Ney, 2018, "Improving Neural Language Models with Weight Norm
Initialization and Regularization"): give every output-embedding row the norm σ·log(c_k), with c_k the unigram
count of token k in the training data, keeping its random direction:

    w_k ← σ · log(c_k) · w_k / ‖w_k‖

A tied softmax favours long rows, so starting the norms at log-frequency starts the model near the unigram
distribution instead of the uniform one.

Rare tokens: log(0) is undefined and log(1) = 0 would zero the row (a zero row has no direction left to learn
from and, in the normalized modes, divides by the norm's lower bound). Counts are therefore raised to ``min_count``
= 2 before the log: tokens never seen in training (special tokens included) and singletons all get the norm
σ·log 2, the smallest norm the formula gives a repeated token. Rows that are exactly zero (the padding row, which
HF initializes to zero) have no direction to rescale and are left at zero.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ..modeling.head.modes import get_head_mode

# Counts below this are raised to it before the log (see the module docstring).
MIN_COUNT = 2


def weight_norm_targets(counts: torch.Tensor | Sequence[int], sigma: float, min_count: int = MIN_COUNT) -> torch.Tensor:
    """σ·log(max(c_k, min_count)) for every token: the (V,) fp32 row norms the initialization sets."""
    counts = torch.as_tensor(counts)
    if counts.dim() != 1 or counts.is_floating_point() and not torch.equal(counts, counts.round()):
        raise ValueError(f"counts must be a 1-d sequence of integer token counts, got shape {tuple(counts.shape)}")
    if (counts < 0).any():
        raise ValueError("counts must be >= 0")
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if min_count < 2:
        raise ValueError(f"min_count must be >= 2 so that no row gets norm log(1) = 0, got {min_count}")
    return sigma * counts.double().clamp_min(min_count).log().float()


@torch.no_grad()
def weight_norm_init_(model, counts: torch.Tensor | Sequence[int] | None, sigma: float, min_count: int = MIN_COUNT):
    """Rescale the rows of ``model``'s output (tied) embedding to norms σ·log(c_k), in place; returns ``model``.

    ``counts``: (V,) unigram counts of the training data in token-id order (``hf_tiednorm.training.data.token_counts``).
    Works on both model families and on adaptive softmax bands; records σ in ``model.config.weight_norm_init_sigma``.
    """
    if counts is None:
        raise ValueError("weight-norm initialization needs the training data's token counts; got counts=None")
    if not get_head_mode(model.config.head_mode).keeps_row_norms:
        raise ValueError(
            f"weight-norm initialization sets row norms, which head_mode={model.config.head_mode!r} ignores everywhere"
        )
    weights = model.output_embedding_weights()  # [(V, d)] or one (n_i, d_i) per adaptive band
    vocab_size = sum(w.shape[0] for w in weights)
    targets = weight_norm_targets(counts, sigma, min_count)
    if targets.shape[0] != vocab_size:
        raise ValueError(f"counts has {targets.shape[0]} entries but the output embedding has {vocab_size} rows")
    for weight, target in zip(weights, targets.split([w.shape[0] for w in weights])):
        norms = torch.linalg.vector_norm(weight.float(), dim=-1)  # (n,)
        factor = torch.where(norms > 0, target.to(norms.device) / norms, torch.zeros_like(norms))
        weight.mul_(factor.unsqueeze(-1).to(weight.dtype))
    model.config.weight_norm_init_sigma = float(sigma)
    return model


__all__ = ["MIN_COUNT", "weight_norm_init_", "weight_norm_targets"]
