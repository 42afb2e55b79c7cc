"""The Marian-style encoder-decoder family: Marian's body and parent classes with what both encoder-decoder families
share (families/encoder_decoder.py): embeddings tied per ``config.tie_topology``, the normalized tied head, the loss.
"""

from __future__ import annotations

from transformers import GenerationMixin
from transformers.models.marian.modeling_marian import MarianModel, MarianPreTrainedModel

from ..code_writer import SavesItsCode
from ..engine_checks import EngineChecksMixin
from .configuration_seq2seq import TiedNormSeq2SeqConfig
from .encoder_decoder import TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqModelMixin


class TiedNormSeq2SeqPreTrainedModel(EngineChecksMixin, SavesItsCode, MarianPreTrainedModel):
    config_class = TiedNormSeq2SeqConfig
    config: TiedNormSeq2SeqConfig
    # Marian declares none; the layers are what FSDP's transformer-based wrapping (and device_map) should keep whole.
    _no_split_modules = ["MarianEncoderLayer", "MarianDecoderLayer"]


class TiedNormSeq2SeqModel(TiedNormSeq2SeqModelMixin, TiedNormSeq2SeqPreTrainedModel, MarianModel):
    """Marian's encoder-decoder body with embeddings that can look up l2-normalized rows."""

    # Marian's sinusoidal position tables are computed, not stored (the LM's list, without its "model." prefix).
    _keys_to_ignore_on_load_missing = ["encoder.embed_positions.weight", "decoder.embed_positions.weight"]
    _keys_to_ignore_on_save = ["encoder.embed_positions.weight", "decoder.embed_positions.weight"]


class TiedNormForConditionalGeneration(TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqPreTrainedModel, GenerationMixin):
    """Marian with the normalized tied head."""

    model_class = TiedNormSeq2SeqModel
    # Marian's sinusoidal position tables are computed, not stored.
    _keys_to_ignore_on_load_missing = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]
    _keys_to_ignore_on_save = ["model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"]


__all__ = ["TiedNormForConditionalGeneration", "TiedNormSeq2SeqModel", "TiedNormSeq2SeqPreTrainedModel"]
