"""Hosting a normalized tied head, written once for hf_tiednorm's own families (``modeling_common.TiedNormLMMixin``)
and for the wrapper around any transformers model (``modeling_tiednorm_wrapped``).

A model that scores with a ``TiedNormHead`` (or an ``AdaptiveSoftmaxHead``) needs five things that transformers'
``PreTrainedModel`` does not do for it: accepting a new output layer without losing the scoring mode, generating
with the head's column terms computed once (the weights cannot change during one ``generate``), resizing the
vocabulary with the head's per-token terms resized too, saving a folder that serves the translation pipeline, and
naming the matrices whose rows are the output embedding. Hooks say where a model keeps its head and how it
resizes: ``_output_head``, ``_place_output_head`` and ``_resize_embeddings``. ``generate`` is transformers' own, run
on the model itself (its forward, its compiled call, its cache), the wrapper's too. A caller that replaces the
model's forward (TRL's fused LM head) is served the head as the plain linear layer it computes, or refused by name
(head/scoring_guard.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..head.adaptive import AdaptiveSoftmaxHead, embedding_matrices
from ..head.layer import TiedNormHead
from ..head.lossless_start import start_resized_tokens
from ..head.peft_guard import check_head_once
from ..head.scoring_guard import FoldedLinear, install_scoring_guard, is_serving_folded_head, serve_replaced_forward
from ..head.settings import head_terms, learned_terms
from ..translation_pipeline import add_translation_pipeline
from ..weight_checks import check_resize_keeps_special_tokens


@contextmanager
def _gathered_for_generation(model: nn.Module) -> Iterator[None]:
    """Keep an FSDP2-sharded encoder-decoder's root parameters gathered while it generates: FSDP2 gathers a group's
    parameters in its module's forward hooks, but generation runs the encoder (and its root-group parameters:
    positions, layer norms) outside the root's forward. (The Seq2SeqTrainer passes synced_gpus, so ranks generating
    different lengths stay in step.)"""
    if not (isinstance(model, FSDPModule) and model.config.is_encoder_decoder):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def fp32_term_names() -> list[str]:
    """The head terms kept fp32 under a bf16/fp16 load or cast (``HeadTerm.keep_fp32``), as parameter names."""
    return [term.name for term in head_terms() if term.keep_fp32]


def keep_head_terms_fp32(model: nn.Module) -> None:
    """Put the head's learned terms that stay fp32 (``HeadTerm.keep_fp32``) back in fp32 after a cast of the whole
    model (``model.to(torch.bfloat16)``), in place, as ``from_pretrained`` keeps them."""
    kept = fp32_term_names()
    for name, param in model.named_parameters():
        if name.rpartition(".")[2] in kept and param.dtype != torch.float32:
            param.data = param.data.float()


class TiedNormHeadHostMixin:
    """Put before the ``PreTrainedModel`` class in the bases of a model whose ``get_output_embeddings()`` is a
    ``TiedNormHead`` (or an ``AdaptiveSoftmaxHead``)."""

    # The head's learned per-token terms stay fp32 under every load dtype (transformers' strict keep-in-fp32 list:
    # from_pretrained(dtype=torch.bfloat16 / float16) casts everything else): in bf16, a step of a small learning
    # rate rounds away on g_i ~ 1 (bf16 has 8 mantissa bits), so g and b would never train.
    # The built-in ones here; finish_head_hosting names those the model has, registered ones included.
    _keep_in_fp32_modules_strict = fp32_term_names()

    def __setattr__(self, name: str, value) -> None:
        if name == "forward":  # TRL's add_fused_lm_head served exactly, any other one judged (head/scoring_guard.py)
            value = serve_replaced_forward(self, value)
        super().__setattr__(name, value)

    def finish_head_hosting(self) -> None:
        """The end of ``post_init`` for a model that hosts the head (called by the one ``post_init`` of its bases:
        ``TiedEmbeddingsMixin``'s for the families, the wrapper's own)."""
        # Only the learned terms this model has (its config may create neither): HF checks each name it is given.
        head = self.get_output_embeddings()
        terms = learned_terms()
        self._keep_in_fp32_modules_strict = {
            *(name for name in self._keep_in_fp32_modules_strict or () if name not in terms),
            *(name for name in fp32_term_names() if getattr(head, name, None) is not None),
        }
        install_scoring_guard(self)  # on the backbone every forward runs (the last post_init call sees the built one)

    def _output_head(self) -> nn.Module:
        """The model's output layer (our families keep it as ``lm_head``)."""
        return self.lm_head

    def _place_output_head(self, head: nn.Module) -> None:
        """Make ``head`` the model's output layer (our families keep it as ``lm_head``)."""
        self.lm_head = head

    def get_output_embeddings(self) -> nn.Module:
        """The output layer; inside a fused call of TRL's LM head, the same head as the plain linear layer it
        computes (``FoldedLinear``: W_s = diag(scale)·W (·P) and the bias), which TRL's kernel scores exactly."""
        head = self._output_head()
        if is_serving_folded_head(self):
            return FoldedLinear(head, getattr(self, "output_projection", None))
        return head

    def _resize_embeddings(self, *args, **kwargs) -> nn.Embedding:
        """The resize itself (transformers' ``resize_token_embeddings``); the head's per-token terms follow."""
        return super().resize_token_embeddings(*args, **kwargs)

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        if isinstance(new_embeddings, TiedNormHead):
            self._place_output_head(new_embeddings)
            return
        # HF's resize builds a plain nn.Linear for an untied head: adopt its weight and keep the scoring mode.
        head = self.get_output_embeddings()
        head.weight = new_embeddings.weight
        head.match_vocab_size()

    def output_embedding_weights(self) -> list[torch.Tensor]:
        """The matrices whose rows are the output embedding w_k, in token-id order: the head's weight (V, d), or
        one (n_i, d_i) matrix per band of an adaptive softmax. Tied models share them with the input embedding."""
        return embedding_matrices(self.get_output_embeddings())

    def _extra_auto_map(self) -> dict[str, str]:
        """More ``auto_map`` entries ``save_pretrained`` writes into the config (our families: the bare model)."""
        return {}

    def generate(self, *args, **kwargs):
        check_head_once(self)  # before the head is used here: PEFT may have wrapped it
        # The weights cannot change while one generation runs: compute the head's norms once for all its steps.
        with self.get_output_embeddings().frozen_column_terms(), _gathered_for_generation(self):
            return super().generate(*args, **kwargs)

    def resize_token_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        """transformers' resize, refusing a size that drops a special token (modeling/weight_checks.py), with the head's
        per-token terms following the new vocabulary (new tokens of a lossless start by its map)."""
        check_resize_keeps_special_tokens(self, new_num_tokens, pad_to_multiple_of)
        if isinstance(self.get_output_embeddings(), AdaptiveSoftmaxHead):
            raise ValueError(
                "resize_token_embeddings is not supported with adaptive_cutoffs: the bands are tied to the "
                "frequency order of the vocabulary; build a new model with a new vocabulary and cutoffs"
            )
        first_new = self.get_output_embeddings().weight.shape[0]
        embeddings = self._resize_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.get_output_embeddings().match_vocab_size()  # the tied weight was resized in place: the per-token scale too
        start_resized_tokens(self, first_new)  # a lossless start's map for the new tokens (head/lossless_start.py)
        return embeddings

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        # An encoder-decoder's folder alone then serves pipeline("tiednorm-translation", model=folder,
        # trust_remote_code=True): the config names the pipeline, which the folder's generated modeling_tiednorm.py
        # defines (modeling/auto_map.py).
        if self.config.is_encoder_decoder:
            add_translation_pipeline(self.config)
        extra = self._extra_auto_map()
        if extra:
            self.config.auto_map = {**(getattr(self.config, "auto_map", None) or {}), **extra}
        super().save_pretrained(save_directory, *args, **kwargs)  # the folder's code: TwoFileModelCodeMixin


__all__ = ["TiedNormHeadHostMixin", "fp32_term_names", "keep_head_terms_fp32"]
