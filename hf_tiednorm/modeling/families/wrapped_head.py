"""Putting the normalized head into a transformers model, in place: its output layer becomes a ``TiedNormHead`` on the
embedding matrix it is tied to, and, in a mode that normalizes the input lookups (``l2``), every embedding module
holding that matrix looks up unit rows. What the wrapper (wrapped.py) does to the model it wraps, and what the
converter checks a model allows (conversion/convert_checks.py).
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

from ..head.layer import TiedNormEmbedding, TiedNormHead
from ..head.settings import HeadSettings
from .configuration_wrapped import TiedNormWrappedConfig

_UNIT_LOOKUP_CLASSES: dict[type, type] = {}


def unit_lookups(embedding: nn.Embedding, norm_eps: float) -> None:
    """Make ``embedding`` look up ŵ_i = w_i/‖w_i‖ (the l2 mode's input side, Liu et al. eq. 19), in place.

    The module keeps its class's behaviour: its class is replaced by a subclass of it and of ``TiedNormEmbedding``,
    whose lookup the class's own ``forward`` reaches through ``super().forward``, so a scale it applies (Gemma's
    ``embed_scale``) multiplies ŵ_i. Weights and state-dict keys do not change.
    """
    cls = type(embedding)
    if not issubclass(cls, TiedNormEmbedding):
        if cls is nn.Embedding:
            unit_class = TiedNormEmbedding
        else:
            if cls not in _UNIT_LOOKUP_CLASSES:
                _UNIT_LOOKUP_CLASSES[cls] = type(f"TiedNormUnit{cls.__name__}", (cls, TiedNormEmbedding), {})
            unit_class = _UNIT_LOOKUP_CLASSES[cls]
        embedding.__class__ = unit_class
    embedding.normalize = True
    embedding.norm_eps = norm_eps


def shared_embedding_modules(body: PreTrainedModel) -> list[nn.Embedding]:
    """The embedding modules holding the matrix ``body``'s output layer is tied to, that one first.

    The output layer ties to the source of its weight in ``body``'s tie mapping (the decoder embedding of a Marian
    model with two vocabularies), else to the input embedding; the modules tied to that source (one per stack in T5,
    M2M100) are found by the mapping, since under ``from_pretrained`` they are tied only after loading.
    """
    head = body.get_output_embeddings()
    tied = body.get_expanded_tied_weights_keys(all_submodels=True)  # {target: source}, one source per group
    head_name = next((f"{name}.weight" for name, module in body.named_modules() if module is head), None)
    source = tied.get(head_name)
    if source is None:
        embedding = body.get_input_embeddings()
        source = next(f"{name}.weight" for name, module in body.named_modules() if module is embedding)
    names = [source] + sorted(target for target, tied_source in tied.items() if tied_source == source)
    modules = [body.get_submodule(name.rpartition(".")[0]) for name in names]
    return list({id(m): m for m in modules if isinstance(m, nn.Embedding)}.values())


def install_normalized_head(body: PreTrainedModel, config: TiedNormWrappedConfig) -> TiedNormHead:
    """Replace ``body``'s output layer by a ``TiedNormHead`` sharing the embedding matrix it is tied to (and, in a
    mode that normalizes the input lookups, make every embedding module holding that matrix look up unit rows).
    Returns the new head."""
    embeddings = shared_embedding_modules(body)
    weight = embeddings[0].weight  # (V, d)
    # On meta: its (V, d) weight is replaced by the shared one, never allocate a second matrix.
    head = TiedNormHead(weight.shape[1], weight.shape[0], settings=HeadSettings.from_config(config), device="meta",
                        dtype=weight.dtype)
    head.weight = weight  # Press & Wolf: the output embedding is the input embedding
    for name, start in head.term_starts.items():  # the learned terms, created on meta: storage, at their start
        if getattr(head, name, None) is not None:
            setattr(head, name, nn.Parameter(torch.full_like(getattr(head, name), start, device=weight.device)))
    body.set_output_embeddings(head)
    if head.mode.normalizes_input_lookups:
        # Encoder-decoders keep one module per stack (T5, M2M100); all of them share the matrix.
        for module in embeddings:
            unit_lookups(module, config.norm_eps)
    return head


__all__ = ["install_normalized_head", "shared_embedding_modules", "unit_lookups"]
