"""What both model families add to their HF parent: building, initializing, re-attaching and training the
normalized tied head. The head math itself lives in ``normalized_head.py``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init

from .normalized_head import TiedNormEmbedding, TiedNormHead


def build_embedding(config, num_embeddings: int, embedding_dim: int) -> TiedNormEmbedding:
    """Token embedding that looks up unit rows in l2 mode (Liu et al. eq. 19) and plain rows otherwise."""
    return TiedNormEmbedding(
        num_embeddings,
        embedding_dim,
        config.pad_token_id,
        normalize=config.head_mode == "l2",
        norm_eps=config.norm_eps,
    )


def build_head(config, hidden_size: int, vocab_size: int) -> TiedNormHead:
    return TiedNormHead(
        hidden_size,
        vocab_size,
        head_mode=config.head_mode,
        logit_scale=config.logit_scale,
        logit_scale_init=config.logit_scale_init,
        norm_eps=config.norm_eps,
    )


def token_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
    ignore_index: int = -100,
) -> torch.Tensor:
    """Mean token cross-entropy in fp32; with ``num_items_in_batch`` (passed by the Trainer under gradient
    accumulation) the sum is divided by the token count of the whole accumulated batch instead."""
    logits = logits.float().reshape(-1, logits.shape[-1])  # (tokens, V)
    labels = labels.reshape(-1).to(logits.device)  # (tokens,)
    if num_items_in_batch is None:
        return F.cross_entropy(logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing)
    total = F.cross_entropy(
        logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing, reduction="sum"
    )
    if torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(total.device)
    return total / num_items_in_batch


class TiedNormLMMixin:
    """Methods shared by ``TiedNormForConditionalGeneration`` and ``TiedNormForCausalLM``."""

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, TiedNormHead) and module.logit_scale is not None:
            init.constant_(module.logit_scale, module.logit_scale_init)

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        if isinstance(new_embeddings, TiedNormHead):
            self.lm_head = new_embeddings
            return
        # HF's resize builds a plain nn.Linear for an untied head: adopt its weight and keep the scoring mode.
        self.lm_head.weight = new_embeddings.weight
        self.lm_head.match_vocab_size()

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        # register_for_auto_class maps one Auto class per model class; map AutoModel to the bare model (same code
        # file) too, so that AutoModel.from_pretrained(folder, trust_remote_code=True) also works.
        base_model = type(self.model)
        module = base_model.__module__.rsplit(".", 1)[-1]
        self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), "AutoModel": f"{module}.{base_model.__name__}"}
        super().save_pretrained(save_directory, *args, **kwargs)

    def resize_token_embeddings(self, *args, **kwargs) -> nn.Embedding:
        embeddings = super().resize_token_embeddings(*args, **kwargs)
        self.lm_head.match_vocab_size()  # the tied weight was resized in place; resize the per-token scale too
        return embeddings
