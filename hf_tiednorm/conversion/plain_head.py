"""The normalized head as the plain layers a plain export writes: every head mode scores ``s = (W·h)·scale + bias``
with vocabulary-sized (scale, bias) (the mode's, with the logit scale g, the logit bias b and any added term folded
in), so the output layer is the linear layer ``diag(scale)·W`` with bias ``bias``, and the input embedding looks up
what the mode looks up (ŵ_i in l2 mode, w_i otherwise).
"""

from __future__ import annotations

import torch

from ..modeling.head.modes import HeadMode, unit_rows


def plain_input_weight(mode: HeadMode, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The matrix (V, d) a plain ``nn.Embedding`` must hold to look up what ``mode`` looks up: ŵ for a mode that
    normalizes the input lookups, W itself otherwise; in ``weight``'s dtype."""
    return unit_rows(weight, eps) if mode.normalizes_input_lookups else weight


@torch.no_grad()
def plain_output_layer(head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain linear layer computing ``head``'s logits (a ``TiedNormHead``): weight diag(scale)·W (V, d) and bias
    (V,) or None, both fp32, with (scale, bias) the head's effective column terms."""
    scale, bias = head.column_terms()
    weight = head.weight.float() if scale is None else head.weight.float() * scale.unsqueeze(-1)
    return weight, bias


__all__ = ["plain_input_weight", "plain_output_layer"]
