"""The Marian-style encoder-decoder family: Marian's body and parent classes with what both encoder-decoder families
share (families/encoder_decoder.py): embeddings tied per ``config.tie_topology``, the normalized tied head, the loss.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import GenerationMixin
from transformers.models.marian.modeling_marian import (
    MarianModel,
    MarianPreTrainedModel,
    MarianSinusoidalPositionalEmbedding,
)

from ..code_writer import SavesItsCode
from ..engine_checks import EngineChecksMixin
from .configuration_seq2seq import TiedNormSeq2SeqConfig
from .encoder_decoder import TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqModelMixin


class TiedNormSeq2SeqPreTrainedModel(EngineChecksMixin, SavesItsCode, MarianPreTrainedModel):
    config_class = TiedNormSeq2SeqConfig
    config: TiedNormSeq2SeqConfig
    # Marian declares none; the layers are what FSDP's transformer-based wrapping (and device_map) should keep whole.
    _no_split_modules = ["MarianEncoderLayer", "MarianDecoderLayer"]


class SinusoidalPositions(MarianSinusoidalPositionalEmbedding):
    """Marian's sinusoidal position table (positions, d) as a non-persistent buffer computed when the model is built,
    not a frozen parameter, so it is never saved, loaded or offloaded (docs/code_notes.md).

    Args:
        num_positions: the longest sequence (``config.max_position_embeddings``).
        embedding_dim: d (``config.d_model``).
    """

    def __init__(self, num_positions: int, embedding_dim: int) -> None:
        super().__init__(num_positions, embedding_dim)
        del self.weight
        self.register_buffer("weight", torch.empty(num_positions, embedding_dim), persistent=False)
        if not self.weight.is_meta:
            self.weight.copy_(self.create_weight())
            self.weight._is_hf_initialized = True  # computed: Marian's _init_weights need not compute it again

    def create_weight(self) -> torch.Tensor:
        """Marian's table (sin features in the first half, cos in the second), computed as its ``create_weight``
        does, in fp64, but with array operations: the same values, without its loop over every position and
        feature (1.9 s for 512 x 512)."""
        n_pos, dim = self.weight.shape
        position_enc = np.arange(n_pos)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)  # (n_pos, dim)
        out = torch.empty(n_pos, dim, dtype=self.weight.dtype)
        sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
        out[:, 0:sentinel] = torch.FloatTensor(np.sin(position_enc[:, 0::2]))
        out[:, sentinel:] = torch.FloatTensor(np.cos(position_enc[:, 1::2]))
        return out


class TiedNormSeq2SeqModel(TiedNormSeq2SeqModelMixin, TiedNormSeq2SeqPreTrainedModel, MarianModel):
    """Marian's encoder-decoder body with embeddings that can look up l2-normalized rows, and its position tables
    computed buffers (``SinusoidalPositions``)."""

    def __init__(self, config: TiedNormSeq2SeqConfig):
        super().__init__(config)
        for stack in (self.encoder, self.decoder):
            stack.embed_positions = SinusoidalPositions(*stack.embed_positions.weight.shape)


class TiedNormForConditionalGeneration(TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqPreTrainedModel, GenerationMixin):
    """Marian with the normalized tied head."""

    model_class = TiedNormSeq2SeqModel


__all__ = [
    "SinusoidalPositions",
    "TiedNormForConditionalGeneration",
    "TiedNormSeq2SeqModel",
    "TiedNormSeq2SeqPreTrainedModel",
]
