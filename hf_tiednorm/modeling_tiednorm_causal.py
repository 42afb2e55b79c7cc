"""A Llama-style decoder-only LM whose output layer is the normalized tied head.

What differs from ``transformers``' Llama: token embeddings are ``TiedNormEmbedding`` (unit rows are looked up
in l2 mode), ``lm_head`` is ``TiedNormHead`` and ties to them by default, and the loss applies
``config.label_smoothing``. Attention (SDPA), RoPE, KV cache and generation are Llama's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel

from .configuration_tiednorm import TiedNormCausalConfig
from .modeling_common import TiedNormLMMixin, build_embedding, build_head, token_cross_entropy


class TiedNormCausalPreTrainedModel(LlamaPreTrainedModel):
    config_class = TiedNormCausalConfig
    config: TiedNormCausalConfig


class TiedNormCausalModel(TiedNormCausalPreTrainedModel, LlamaModel):
    """Llama's decoder stack with an embedding that can look up l2-normalized rows."""

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.embed_tokens = build_embedding(config, config.vocab_size, config.hidden_size)
        self.post_init()


class TiedNormForCausalLM(TiedNormLMMixin, TiedNormCausalPreTrainedModel, GenerationMixin):
    # Press & Wolf (2017): the output embedding is the input embedding ({target: source}).
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.model = TiedNormCausalModel(config)
        self.vocab_size = config.vocab_size
        self.lm_head = build_head(config, config.hidden_size, config.vocab_size)
        self.post_init()

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        past_key_values=None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> CausalLMOutputWithPast:
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs,
        )
        hidden_states = outputs.last_hidden_state  # (batch, seq, d)
        # Generation needs only the last position's logits: logits_to_keep=1 skips the rest of the head.
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        logits = self.lm_head(hidden_states[:, kept, :])  # (batch, kept, V)
        loss = None
        if labels is not None:
            # labels are input_ids: position t predicts token t+1 (HF convention); the pad marks "no target".
            next_tokens = F.pad(labels, (0, 1), value=-100)[:, 1:]
            loss = token_cross_entropy(logits, next_tokens, self.config.label_smoothing, num_items_in_batch)
        return CausalLMOutputWithPast(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )


__all__ = ["TiedNormCausalModel", "TiedNormCausalPreTrainedModel", "TiedNormForCausalLM"]
