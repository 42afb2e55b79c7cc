"""A BART-style encoder-decoder whose output layer is the normalized tied head: the family BART checkpoints
convert to 1:1 (``hf_tiednorm.convert``).

Everything of the Marian-based family (``families/seq2seq.py``) applies; only the body differs. What differs
from ``transformers``' BART: token embeddings are ``TiedNormEmbedding`` that keep BART's in-module scaling
(``BartScaledWordEmbedding``: lookup × sqrt(d) when ``scale_embedding``, the unit rows in l2 mode); ``lm_head`` is
``TiedNormHead`` without BART's ``final_logits_bias``; the tie topology comes from ``config.tie_topology``.
Learned positions, ``layernorm_embedding``, attention, KV cache and generation are BART's.
"""

from __future__ import annotations

import math

from transformers import GenerationMixin
from transformers.models.bart.modeling_bart import BartModel, BartPreTrainedModel

from ..auto_map import TwoFileModelCodeMixin
from ..engine_checks import EngineChecksMixin
from .configuration import TiedNormBartConfig
from .seq2seq import TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqModelMixin


class TiedNormBartPreTrainedModel(EngineChecksMixin, TwoFileModelCodeMixin, BartPreTrainedModel):
    config_class = TiedNormBartConfig
    config: TiedNormBartConfig


class TiedNormBartModel(TiedNormSeq2SeqModelMixin, TiedNormBartPreTrainedModel, BartModel):
    """BART's encoder-decoder body with embeddings that can look up l2-normalized rows."""

    def lookup_scale(self, config: TiedNormBartConfig) -> float:
        # BART scales inside the embedding module (its encoder/decoder do not), by 1.0 when not scale_embedding.
        return math.sqrt(config.d_model) if config.scale_embedding else 1.0


class TiedNormBartForConditionalGeneration(TiedNormSeq2SeqLMMixin, TiedNormBartPreTrainedModel, GenerationMixin):
    """BART with the normalized tied head."""

    model_class = TiedNormBartModel


__all__ = ["TiedNormBartForConditionalGeneration", "TiedNormBartModel", "TiedNormBartPreTrainedModel"]
