"""The token embeddings the families build (``build_embedding``): a ``TiedNormEmbedding`` (unit rows in l2 mode) or an
adaptive input, optionally scaling its lookups in the module (BART's scaled embedding)."""

from __future__ import annotations

import torch

from ..head.adaptive import AdaptiveInput
from ..head.layer import TiedNormEmbedding
from ..head.modes import get_head_mode


class ScaledLookupMixin:
    """Multiplies the lookup by a constant ``embed_scale`` inside the embedding module, as BART's
    ``BartScaledWordEmbedding`` does (Marian multiplies in its encoder/decoder instead). In l2 mode the unit rows
    ŵ_i are scaled, just as Marian scales them."""

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed_scale = embed_scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale:.6g}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


class TokenEmbedding(TiedNormEmbedding):
    """The token embedding the families build: a ``TiedNormEmbedding`` under a name without "Norm", because
    accelerate's FSDP2 wrapping takes the last child of the body whose class name contains "Norm" for the final
    norm and groups it with the input embedding: the encoder-decoders' ``model.shared`` would be listed twice."""


class ScaledTokenEmbedding(ScaledLookupMixin, TokenEmbedding):
    """``TokenEmbedding`` whose lookups are multiplied by ``embed_scale``."""


class ScaledAdaptiveInput(ScaledLookupMixin, AdaptiveInput):
    """``AdaptiveInput`` whose lookups are multiplied by ``embed_scale``."""


def build_embedding(config, num_embeddings: int, embedding_dim: int,
                    embed_scale: float | None = None) -> TiedNormEmbedding | AdaptiveInput:  # fmt: skip
    """The token embedding of ``config``: unit rows in a mode that normalizes the input lookups, an adaptive input with
    ``adaptive_cutoffs``, lookups times ``embed_scale`` when given."""
    common = {"normalize": get_head_mode(config.head_mode).normalizes_input_lookups, "norm_eps": config.norm_eps}
    if embed_scale is not None:
        common["embed_scale"] = embed_scale
    if config.adaptive_cutoffs is not None:
        adaptive = AdaptiveInput if embed_scale is None else ScaledAdaptiveInput
        return adaptive(num_embeddings, embedding_dim, config.adaptive_cutoffs, div_value=config.adaptive_div_value,
                        padding_idx=config.pad_token_id, **common)
    plain = TokenEmbedding if embed_scale is None else ScaledTokenEmbedding
    return plain(num_embeddings, embedding_dim, config.pad_token_id, **common)


__all__ = [
    "ScaledAdaptiveInput",
    "ScaledLookupMixin",
    "ScaledTokenEmbedding",
    "TokenEmbedding",
    "build_embedding",
]
