"""A Llama-style decoder-only LM whose output layer is the normalized tied head.

What differs from ``transformers``' Llama: token embeddings are ``TiedNormEmbedding`` (unit rows are looked up
in l2 mode), ``lm_head`` is ``TiedNormHead`` and ties to them by default, and the loss applies
``config.label_smoothing``. Attention (SDPA), RoPE, KV cache and generation are Llama's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import GenerationMixin
from transformers.models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from ..head.scoring_guard import own_scoring
from ..weight_checks import WeightChecksMixin
from .causal_lm_names import recognise_as_causal_lm
from .common import TiedNormLMMixin, build_head, build_output_projection
from .configuration import TiedNormCausalConfig
from .embeddings import build_embedding
from .outputs import CACHE_FIELD, TiedNormCausalLMOutput


class TiedNormCausalPreTrainedModel(LlamaPreTrainedModel):
    config_class = TiedNormCausalConfig
    config: TiedNormCausalConfig


class TiedNormCausalModel(TiedNormCausalPreTrainedModel, LlamaModel):
    """Llama's decoder stack with an embedding that can look up l2-normalized rows."""

    # Tensor parallelism keeps the embedding whole (transformers would shard it on the vocabulary): it is the tied
    # head's matrix, which scores with per-row norms and per-token terms, and a tie is sharded both sides or neither.
    _tp_plan = {"embed_tokens": "replicate"}

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.embed_tokens = build_embedding(config, config.vocab_size, config.hidden_size)
        self.post_init()


class TiedNormForCausalLM(WeightChecksMixin, TiedNormLMMixin, TiedNormCausalPreTrainedModel, GenerationMixin):
    # The tie (Press & Wolf, 2017: output embedding = input embedding) is declared in families/tie_topology.py; loading
    # is
    # checked by WeightChecksMixin (finite weights, head tensors), resizing by families/head_host.py (special tokens
    # kept).
    _tp_plan = {"lm_head": "replicate"}  # as the embedding it is tied to (TiedNormCausalModel._tp_plan)

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.model = TiedNormCausalModel(config)
        self.vocab_size = config.vocab_size
        self.output_projection = build_output_projection(config, config.hidden_size)  # Press & Wolf's P, or None
        self.lm_head = build_head(config, config.hidden_size, config.vocab_size)
        self.post_init()

    @own_scoring  # scores with the model's own head: what the scoring guard lets run (head/scoring_guard.py)
    @can_return_tuple  # return_dict=False (argument or config) gives the output's tuple, as HF's LMs do
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool | None = None,  # the Trainer's: a fused loss may serve evaluation too
        **kwargs: Unpack[TransformersKwargs],
    ) -> TiedNormCausalLMOutput:
        """``labels`` (batch, length) are the input ids (position t predicts token t+1, shifted here);
        ``shift_labels`` (batch, length), already aligned with the positions, replace them where given (sequence and
        context parallel training shift before sharding, as HF's ``ForCausalLMLoss`` reads them). It is read from
        ``kwargs`` as HF's LMs do: a named ``shift_labels`` argument would make the Trainer take it for a second label
        column (``find_labels`` reads the signature) and skip the evaluation loss of every batch without it."""
        shift_labels = kwargs.pop("shift_labels", None)
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=use_cache,
            **kwargs | {"return_dict": True},  # the body's output object; can_return_tuple makes the tuple
        )
        # Generation needs only the last position's logits: logits_to_keep=1 skips the rest of the head.
        kept = slice(-logits_to_keep, None) if isinstance(logits_to_keep, int) else logits_to_keep
        hidden_states = outputs.last_hidden_state[:, kept, :]  # (batch, kept, d)
        # labels are input_ids: position t predicts token t+1 (HF convention); the pad marks "no target".
        next_tokens = None if labels is None else F.pad(labels, (0, 1), value=-100)[:, 1:]
        if shift_labels is not None:
            next_tokens = shift_labels
        # (b, kept, V); None when a fused loss computed the loss
        logits, loss, loss_terms = self.score_and_loss(hidden_states, next_tokens, num_items_in_batch, skip_logits)
        return TiedNormCausalLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            **loss_terms,
        )


# The Trainer's label smoother shifts the labels of the causal LMs it knows by class name (families/causal_lm_names.py).
recognise_as_causal_lm(TiedNormCausalConfig.model_type, TiedNormForCausalLM.__name__)


__all__ = ["TiedNormCausalModel", "TiedNormCausalPreTrainedModel", "TiedNormForCausalLM"]
