"""The BART-style encoder-decoder family (the one BART checkpoints convert to): BART's body (learned positions,
``layernorm_embedding``, in-module scaled embeddings) with what both encoder-decoder families share
(families/encoder_decoder.py)."""

from __future__ import annotations

import math

from transformers import GenerationMixin
from transformers.models.bart.modeling_bart import BartModel, BartPreTrainedModel

from ..code_writer import SavesItsCode
from ..engine_checks import EngineChecksMixin
from .configuration_bart import TiedNormBartConfig
from .encoder_decoder import TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqModelMixin


class TiedNormBartPreTrainedModel(EngineChecksMixin, SavesItsCode, BartPreTrainedModel):
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
