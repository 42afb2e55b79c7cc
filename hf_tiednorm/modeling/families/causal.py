"""A Llama-style decoder-only LM whose output layer is the normalized tied head.

What differs from ``transformers``' Llama: token embeddings are ``TiedNormEmbedding`` (unit rows are looked up
in l2 mode), ``lm_head`` is ``TiedNormHead`` and ties to them by default, and the loss applies
``config.label_smoothing``. Attention (SDPA), RoPE, KV cache and generation are Llama's.
"""

from __future__ import annotations

from transformers import GenerationMixin
from transformers.models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel

from ..auto_map import TwoFileModelCodeMixin
from ..engine_checks import EngineChecksMixin
from .causal_lm_names import recognise_as_causal_lm
from .common import TiedNormCausalLMMixin
from .configuration import TiedNormCausalConfig
from .embeddings import build_embedding


class TiedNormCausalPreTrainedModel(EngineChecksMixin, TwoFileModelCodeMixin, LlamaPreTrainedModel):
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


class TiedNormForCausalLM(TiedNormCausalLMMixin, TiedNormCausalPreTrainedModel, GenerationMixin):
    # The tie (Press & Wolf, 2017: output embedding = input embedding) is declared in families/tie_topology.py;
    # loading is checked by WeightChecksMixin (finite weights, head tensors), resizing by families/head_host.py
    # (special tokens kept); the forward (label shift, loss) is TiedNormCausalLMMixin's, the base a causal family
    # subclasses (families/common.py).
    _tp_plan = {"lm_head": "replicate"}  # as the embedding it is tied to (TiedNormCausalModel._tp_plan)

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.model = TiedNormCausalModel(config)
        self.vocab_size = config.vocab_size
        self.add_tied_norm_head(config.hidden_size)  # lm_head, and Press & Wolf's P where the config asks for it
        self.post_init()


# The Trainer's label smoother shifts the labels of the causal LMs it knows by class name (families/causal_lm_names.py).
recognise_as_causal_lm(TiedNormCausalConfig.model_type, TiedNormForCausalLM.__name__)


__all__ = ["TiedNormCausalModel", "TiedNormCausalPreTrainedModel", "TiedNormForCausalLM"]
