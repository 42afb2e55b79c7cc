"""The Llama-style causal family: Llama's body with ``TiedNormEmbedding`` lookups (unit rows in l2 mode) and the
normalized tied head as ``lm_head`` (``TiedNormCausalLMMixin``); attention, RoPE, KV cache and generation are Llama's.
"""

from __future__ import annotations

from transformers import GenerationMixin
from transformers.models.llama.modeling_llama import LlamaModel, LlamaPreTrainedModel

from ..code_writer import SavesItsCode
from ..engine_checks import EngineChecksMixin
from .common import TiedNormCausalLMMixin
from .configuration_causal import TiedNormCausalConfig
from .embeddings import build_embedding


class TiedNormCausalPreTrainedModel(EngineChecksMixin, SavesItsCode, LlamaPreTrainedModel):
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
    # The tie is declared in families/tie_topology.py, loading checked by WeightChecksMixin; the forward (label shift,
    # loss) is TiedNormCausalLMMixin's, the base a causal family subclasses (families/common.py).
    _tp_plan = {"lm_head": "replicate"}  # as the embedding it is tied to (TiedNormCausalModel._tp_plan)

    def __init__(self, config: TiedNormCausalConfig):
        super().__init__(config)
        self.model = TiedNormCausalModel(config)
        self.vocab_size = config.vocab_size
        self.add_tied_norm_head(config.hidden_size)  # lm_head, and Press & Wolf's P where the config asks for it
        self.post_init()


__all__ = ["TiedNormCausalModel", "TiedNormCausalPreTrainedModel", "TiedNormForCausalLM"]
