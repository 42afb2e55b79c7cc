"""The loss of the package's own families, assembled in one place (``TiedNormLossMixin.score_and_loss``): Press &
Wolf's projection P, the normalized head's token cross-entropy (on the path ``config.loss_implementation`` picks), the
enabled penalties and their sum. The target tokens are counted once per step: the cross-entropy divides by that
count, and under gradient accumulation the penalties take this micro-batch's share of it."""

from __future__ import annotations

import torch

from .head_loss import head_linear_cross_entropy
from .policy import choose_loss_path, refuse_fused_loss_scored_outside
from .regularizers import projection_penalty, weight_norm_penalty
from .token import token_count, token_cross_entropy


def head_cross_entropy(head: torch.nn.Module, hidden_states: torch.Tensor, targets: torch.Tensor, count: torch.Tensor,
                       label_smoothing: float = 0.0, chunk_size: int | None = None,
                       implementation: str | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
    """The head's token cross-entropy, divided by ``count`` (``token_count``).

    Args:
        head: the output layer (a ``TiedNormHead``; an adaptive softmax on the plain path only).
        hidden_states: (batch, length, d), what the head scores (after P); targets: (batch, length), -100 = none.
        chunk_size: tokens per chunk of the chunked path; implementation: ``config.loss_implementation`` (None: the
            chunked path if a chunk size is given, else the plain one).

    Returns:
        logits (batch, length, V) (None on a fused path) and the loss.
    """
    if implementation is None:
        implementation = "plain" if chunk_size is None else "chunked"
    tokens = hidden_states.numel() // hidden_states.shape[-1]
    path = choose_loss_path(implementation, head, tokens, label_smoothing, chunk_size)
    if path != "plain":
        hidden = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, d)
        labels = targets.reshape(-1).to(hidden.device)  # (N,)
        total = head_linear_cross_entropy(head, hidden, labels, path, label_smoothing, chunk_size)
        return None, total / count.to(total.device)
    logits = head(hidden_states)
    return logits, token_cross_entropy(logits, targets, label_smoothing, count)


class TiedNormLossMixin:
    """The loss methods of the package's families: the model has ``config``, ``lm_head``, ``output_projection`` (P or
    None) and ``output_embedding_weights()``."""

    def score_and_loss(self, hidden_states: torch.Tensor, targets: torch.Tensor | None, num_items_in_batch=None,
                       skip_logits: bool | None = None):  # fmt: skip
        """The one loss path of every family: P, the normalized head, the token cross-entropy, the penalties.

        Args:
            hidden_states: (batch, length, d), the decoder's last hidden states.
            targets: (batch, length) token ids aligned with them (shifted already), -100 = no target; None: inference.
            num_items_in_batch: the target tokens of the whole accumulated batch (the Trainer's).
            skip_logits: the Trainer's; True lets a fused path compute an evaluation loss too.

        Returns:
            logits (batch, length, V) (None on a fused path), the loss (None without targets), its terms by name.
        """
        if self.output_projection is not None:
            hidden_states = self.output_projection(hidden_states)  # P·h (Press & Wolf, 2017)
        implementation = getattr(self.config, "loss_implementation", "auto")
        if targets is None:
            if self.training and num_items_in_batch is not None:
                self.refuse_loss_scored_outside()
            return self.lm_head(hidden_states), None, {}
        count = token_count(targets, num_items_in_batch)  # the one count of this step
        fused_allowed = self.training if skip_logits is None else bool(skip_logits)
        if not fused_allowed:
            implementation = "plain"
        config = self.config
        logits, cross_entropy = head_cross_entropy(self.lm_head, hidden_states, targets, count, config.label_smoothing,
                                                   config.loss_chunk_size, implementation)  # fmt: skip
        loss, terms = self.compose_loss(cross_entropy, targets, num_items_in_batch, count)
        return logits, loss, terms

    def compose_loss(self, cross_entropy: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None,
                     count: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
        """The loss (cross-entropy + penalties) and its terms (``LOSS_TERMS``); under gradient accumulation each
        micro-batch adds its token share of the penalties, so they count once per optimizer step."""
        share = 1.0
        if num_items_in_batch is not None:
            count = token_count(targets, num_items_in_batch) if count is None else count
            share = (targets != -100).sum().to(cross_entropy.device) / count
        terms = {"cross_entropy": cross_entropy, **self.penalty_terms(share)}
        return sum(terms.values()), terms

    def refuse_loss_scored_outside(self) -> None:
        """``ValueError`` when the Trainer scores a training step's logits itself (its label smoother, a
        ``compute_loss_func``) while a penalty, which only the model's own loss adds, is configured."""
        config = self.config
        refuse_fused_loss_scored_outside(config)
        names = ("projection_regularization", "weight_norm_regularization")
        penalties = [f"{name}={getattr(config, name)}" for name in names if getattr(config, name, None)]
        if penalties:
            raise ValueError(
                "the Trainer scores this training step's logits itself (TrainingArguments(label_smoothing_factor=...)"
                f" or compute_loss_func), so the model's regularizer penalties ({', '.join(penalties)}) would be "
                "dropped: set label_smoothing_factor=0 and smooth with the model config's own label_smoothing field "
                "instead (config.label_smoothing=0.1), which keeps the penalties in the loss"
            )

    def penalty_terms(self, share: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """The enabled penalties at the current weights, each times ``share`` (a micro-batch's token share)."""
        config = self.config
        terms = {}
        if config.projection_regularization:
            terms["projection_penalty"] = share * projection_penalty(
                self.output_projection.weight, config.projection_regularization
            )
        if config.weight_norm_regularization:
            terms["weight_norm_penalty"] = share * weight_norm_penalty(
                self.output_embedding_weights(), config.weight_norm_regularization, config.weight_norm_target
            )
        return terms


__all__ = ["TiedNormLossMixin", "head_cross_entropy"]
