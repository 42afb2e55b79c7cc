"""What a source must be for ``tiednorm-convert`` / ``normalize_tied_head`` (convert.py): a tied causal LM or
encoder-decoder that transformers' Auto classes build, whose output layer is a bias-free linear layer holding its input
embedding matrix, and, for the l2 mode, whose embedding modules look up through ``nn.Embedding.forward``. Each check
raises ``ValueError`` naming what is wrong and what to do instead.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel

from .modeling_tiednorm_wrapped import shared_embedding_modules, unit_lookups
from .normalized_head import TiedNormHead, unit_rows

SUPPORTED_TEXT = (
    "any transformers causal LM (AutoModelForCausalLM) or encoder-decoder (AutoModelForSeq2SeqLM) whose output layer "
    "is tied to its input embedding"
)


def _auto_class(config) -> type:
    """The Auto class that builds the LM of ``config``: seq2seq for encoder-decoders, causal otherwise."""
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    if type(config) not in auto._model_mapping:
        raise ValueError(
            f"cannot convert this checkpoint: {auto.__name__} has no model for model_type {config.model_type!r}. "
            f"Supported: {SUPPORTED_TEXT}."
        )
    return auto


def check_convertible(config) -> type:
    """Refuse, before any weight is loaded, what the config alone shows cannot convert; return the Auto class."""
    if config.model_type.startswith("tiednorm"):
        raise ValueError(
            f"this is an hf_tiednorm model already (model_type {config.model_type!r}): its head is normalized; "
            "change head_mode in its config instead of converting it"
        )
    auto = _auto_class(config)
    if not getattr(config, "tie_word_embeddings", False):
        raise ValueError(
            f"the {config.model_type} checkpoint has untied output embeddings (tie_word_embeddings=False): the "
            "normalized head scores tokens with the shared input embedding, so converting would drop the separate "
            f"output matrix and change the model. Supported: {SUPPORTED_TEXT}."
        )
    return auto


def check_tied(model: PreTrainedModel) -> None:
    """Raise ``ValueError`` unless ``model``'s output layer is a bias-free linear layer holding its input embedding
    matrix: the same tensor, or (a checkpoint that stored both) equal values. (``check_convertible`` checks its
    config.)"""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or isinstance(head, TiedNormHead):
        raise ValueError(
            f"{type(model).__name__} has no plain linear output layer (got {type(head).__name__}); "
            f"pass a model with an LM head ({SUPPORTED_TEXT})"
        )
    embedding = shared_embedding_modules(model)[0]
    if head.bias is not None:
        raise ValueError(f"the output layer of {type(model).__name__} has a bias, which a tied head cannot keep")
    if head.weight is not embedding.weight:
        if head.weight.shape != embedding.weight.shape or not torch.equal(head.weight, embedding.weight):
            difference = (
                f"shapes {tuple(head.weight.shape)} and {tuple(embedding.weight.shape)}"
                if head.weight.shape != embedding.weight.shape
                else f"max |difference| {(head.weight.float() - embedding.weight.float()).abs().max().item():.3g}"
            )
            raise ValueError(
                f"the config says tie_word_embeddings=True but the checkpoint's output matrix differs from its input "
                f"embedding ({difference}): it is untied, and converting would drop the output matrix. Set "
                "tie_word_embeddings=False in its config.json to use it as the untied model it is."
            )


def check_unit_lookups(model: PreTrainedModel, norm_eps: float) -> None:
    """For the l2 mode: check, on a copy of each embedding module holding the shared matrix, that its class looks up
    through ``nn.Embedding.forward``, so that ``unit_lookups`` yields ŵ_i (times one constant, the scale the class
    applies). An architecture whose embedding computes its lookup otherwise is refused, and ``model`` is unchanged."""
    shared = model.get_output_embeddings().weight  # checked: the tied input embedding matrix
    with torch.no_grad():  # rows that have a direction (a padding row may be zero)
        ids = torch.nonzero(torch.linalg.vector_norm(shared.float(), dim=-1) > norm_eps).flatten()[:8]
    for module in shared_embedding_modules(model):
        probe = copy.copy(module)  # shares the weight; only the copy's class changes
        unit_lookups(probe, norm_eps)
        with torch.no_grad():
            looked_up = probe(ids).float()  # (8, d)
        scale = torch.linalg.vector_norm(looked_up, dim=-1, keepdim=True)  # one constant if the lookup is right
        expected = unit_rows(shared[ids].detach().float(), norm_eps) * scale
        if not (torch.allclose(looked_up, expected, atol=1e-5) and torch.allclose(scale, scale[0], rtol=1e-3)):
            raise ValueError(
                f"head_mode 'l2' needs unit-row lookups, but {type(module).__name__} does not look up "
                "through nn.Embedding.forward; use another head_mode for this architecture"
            )


__all__ = ["SUPPORTED_TEXT", "check_convertible", "check_tied", "check_unit_lookups"]
