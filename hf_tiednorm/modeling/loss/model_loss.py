"""The loss of hf_tiednorm's own families, assembled in one place (``TiedNormLossMixin.score_and_loss``): Press &
Wolf's projection P, the normalized head, the token cross-entropy (the plain path, or the chunked one with
``config.loss_chunk_size``: ``head_cross_entropy``), the enabled penalties (``penalty_terms``) and their sum
(``compose_loss``). The target tokens are counted once per step: the cross-entropy divides by that count, and under
gradient accumulation the penalties take this micro-batch's share of it.

The pieces it assembles: ``token_loss`` (the token cross-entropy and the count), ``chunked_loss`` (the kernel of the
chunked path), ``regularizers`` (the penalties' formulas, the projection P and the loss-term fields). A wrapped model
(``modeling_tiednorm_wrapped``) trains with its architecture's own loss and has none of this.
"""

from __future__ import annotations

import torch

from .head_loss import head_linear_cross_entropy
from .policy import choose_loss_path, refuse_fused_loss_scored_outside
from .regularizers import projection_penalty, weight_norm_penalty
from .token import token_count, token_cross_entropy


def head_cross_entropy(
    head: torch.nn.Module,
    hidden_states: torch.Tensor,
    targets: torch.Tensor,
    count: torch.Tensor,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
    implementation: str | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor]:
    """The head's token cross-entropy, divided by ``count`` (``token_count``).

    Args:
        head: the output layer (a ``TiedNormHead``; an adaptive softmax on the plain path only).
        hidden_states: (batch, length, d), what the head scores (after P).
        targets: (batch, length) token ids, -100 = no target.
        count: the divisor, ``token_count(targets, num_items_in_batch)``.
        chunk_size: tokens per chunk of the chunked path (None: its default; with ``implementation`` None, a
            chunk size picks the chunked path and None the plain one).
        implementation: ``config.loss_implementation`` (``fused_loss.LOSS_IMPLEMENTATIONS``).

    Returns:
        logits (batch, length, V), None on a fused path (which never materializes them), and the loss.
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
    """The loss methods of hf_tiednorm's own families (``modeling_common.TiedNormLMMixin``). The model has
    ``config`` (the techniques' fields), ``lm_head``, ``output_projection`` (P or None) and
    ``output_embedding_weights()``."""

    def score_and_loss(
        self,
        hidden_states: torch.Tensor,
        targets: torch.Tensor | None,
        num_items_in_batch=None,
        skip_logits: bool | None = None,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, dict[str, torch.Tensor]]:
        """The one loss path of every family: Press & Wolf's projection P, the normalized head, the token
        cross-entropy and the regularizer terms.

        Args:
            hidden_states: (batch, length, d), the decoder's last hidden states.
            targets: (batch, length) token ids aligned with ``hidden_states`` (already shifted), -100 = no target;
                None for inference.
            num_items_in_batch: target tokens of the whole accumulated batch (passed by the Trainer).
            skip_logits: the Trainer's request (``use_liger_kernel`` with ``prediction_loss_only``): True lets a
                fused path compute an evaluation loss too; None: fused paths serve training only.

        Returns:
            logits (batch, length, V) — None when a fused path (``config.loss_implementation``, training with
            targets) never materializes them —, the loss (None without targets) and its terms by name.
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
        logits, cross_entropy = head_cross_entropy(
            self.lm_head,
            hidden_states,
            targets,
            count,
            self.config.label_smoothing,
            self.config.loss_chunk_size,
            implementation,
        )
        loss, terms = self.compose_loss(cross_entropy, targets, num_items_in_batch, count)
        return logits, loss, terms

    def compose_loss(
        self,
        cross_entropy: torch.Tensor,
        targets: torch.Tensor,
        num_items_in_batch: int | torch.Tensor | None = None,
        count: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The training loss (cross-entropy + enabled regularizers) and its terms, keyed by ``LOSS_TERMS`` names.

        Under gradient accumulation (``num_items_in_batch``: target tokens of the accumulated batch) each micro-batch
        adds its token share of the penalties, so they count once per optimizer step, as the cross-entropy does.
        ``count``: ``token_count(targets, num_items_in_batch)`` when the caller has it already.
        """
        share = 1.0
        if num_items_in_batch is not None:
            count = token_count(targets, num_items_in_batch) if count is None else count
            share = (targets != -100).sum().to(cross_entropy.device) / count
        terms = {"cross_entropy": cross_entropy, **self.penalty_terms(share)}
        return sum(terms.values()), terms

    def refuse_loss_scored_outside(self) -> None:
        """Raise ``ValueError`` when a training step's loss is scored from the logits outside the model while a
        regularizer is configured. The Trainer's label smoother (``TrainingArguments(label_smoothing_factor=...)``)
        and a ``compute_loss_func`` take the labels away and pass only ``num_items_in_batch``: the penalties, which
        only the model's own loss adds, would be dropped without a word."""
        config = self.config
        refuse_fused_loss_scored_outside(config)
        penalties = [
            f"{name}={getattr(config, name)}"
            for name in ("projection_regularization", "weight_norm_regularization")
            if getattr(config, name, None)
        ]
        if penalties:
            raise ValueError(
                "the Trainer scores this training step's logits itself (TrainingArguments(label_smoothing_factor=...)"
                f" or compute_loss_func), so the model's regularizer penalties ({', '.join(penalties)}) would be "
                "dropped: set label_smoothing_factor=0 and smooth with the model config's own label_smoothing field "
                "instead (config.label_smoothing=0.1), which keeps the penalties in the loss"
            )

    def penalty_terms(self, share: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """The enabled regularizers at the current weights (``projection_penalty``, ``weight_norm_penalty``; they
        depend on the weights only), each times ``share``: a micro-batch's token share of the accumulated batch, 1
        for a whole batch (an evaluation loss)."""
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
