"""Hosting a normalized tied head, written once for the package's families and the wrapper: a new output layer keeps the
scoring mode, ``generate`` computes the head's column terms once (the weights do not change while it runs), a resize
resizes the head's per-token terms too, and ``output_embedding_weights`` names the output embedding's matrices. A caller
that replaces the model's forward (TRL's fused LM head) is served or refused (head/scoring_guard.py)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from ..head.adaptive import AdaptiveSoftmaxHead, embedding_matrices
from ..head.layer import TiedNormHead
from ..head.modes import get_head_mode
from ..head.peft_guard import check_head_once
from ..head.scoring_guard import FoldedLinear, install_scoring_guard, is_serving_folded_head, serve_replaced_forward
from ..head.settings import HEAD_TERMS, HeadSettings
from ..head.terms import head_terms, learned_terms, start_lossless_rows
from ..weight_checks import check_resize_keeps_special_tokens


@contextmanager
def _gathered_for_generation(model: nn.Module) -> Iterator[None]:
    """Keep an FSDP2-sharded encoder-decoder's root parameters gathered while it generates: generation runs the encoder
    outside the root's forward, where FSDP2 would gather them."""
    if not (isinstance(model, FSDPModule) and model.config.is_encoder_decoder):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def fp32_term_names() -> list[str]:
    """The head terms kept fp32 under a bf16/fp16 load or cast (``HeadTerm.keep_fp32``)."""
    return [term.name for term in head_terms() if term.keep_fp32]


@torch.no_grad()
def start_resized_tokens(model: nn.Module, first_new: int) -> None:
    """After a resize of a lossless-started ``model``, start the new tokens' terms (ids ``first_new`` and up) by their
    mode's lossless map, so they take the probability mass they take in the source's same resize."""
    head = model.get_output_embeddings()
    if getattr(model.config, "lossless_start", False) and head.weight.shape[0] > first_new:
        start_lossless_rows(head, first_new)


def check_mode_settings(config) -> None:
    """``ValueError`` for settings the head mode's math rules out (the configuration checks names and ranges only): a
    weight-norm technique where the mode removes the row norms, a recorded lossless start the mode has not or whose
    terms are off."""
    mode = get_head_mode(config.head_mode)
    row_norms = getattr(config, "weight_norm_regularization", 0) or getattr(config, "weight_norm_init_sigma", None)
    if row_norms and not mode.keeps_row_norms:
        raise ValueError("weight_norm_regularization / weight_norm_init_sigma act on row norms, which "
                         f"head_mode={config.head_mode!r} removes from both the input lookups and the scores; use "
                         "another head_mode or leave them unset")
    if getattr(config, "lossless_start", False):
        settings = HeadSettings.from_config(config)
        off = [name for name in mode.lossless_start or () if HEAD_TERMS[name].shape(settings, 2) != (2,)]
        if mode.lossless_start is None or off:
            lacks = "has no lossless start" if mode.lossless_start is None else f"with these settings lacks {off}"
            raise ValueError(f"config.json records lossless_start=True, but head_mode={config.head_mode!r} {lacks}: "
                             "the head terms a lossless start sets are per-token; set lossless_start=False or restore "
                             "them")


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
        """The end of ``post_init`` for a model hosting the head (``TiedEmbeddingsMixin``'s, or the wrapper's own)."""
        check_mode_settings(self.config)
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
        """The output layer; inside a fused call of TRL's LM head, the same head as the plain linear layer it computes
        (``FoldedLinear``), which TRL's kernel scores exactly."""
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
        """The matrices whose rows are the output embedding w_k, in token-id order: the head's weight (V, d), or one
        (n_i, d_i) per adaptive band."""
        return embedding_matrices(self.get_output_embeddings())

    def generate(self, *args, **kwargs):
        check_head_once(self)  # before the head is used here: PEFT may have wrapped it
        # The weights cannot change while one generation runs: compute the head's norms once for all its steps.
        with self.get_output_embeddings().frozen_column_terms(), _gathered_for_generation(self):
            return super().generate(*args, **kwargs)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:  # fmt: skip
        """transformers' resize, refusing a size that drops a special token; the head's per-token terms follow."""
        check_resize_keeps_special_tokens(self, new_num_tokens, pad_to_multiple_of)
        if isinstance(self.get_output_embeddings(), AdaptiveSoftmaxHead):
            raise ValueError("resize_token_embeddings is not supported with adaptive_cutoffs: the bands are tied to "
                             "the frequency order of the vocabulary; build a new model with a new vocabulary and "
                             "cutoffs")
        first_new = self.get_output_embeddings().weight.shape[0]
        embeddings = self._resize_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.get_output_embeddings().match_vocab_size()  # the tied weight was resized in place: the per-token scale too
        start_resized_tokens(self, first_new)  # a lossless start's map for the new tokens
        return embeddings


__all__ = ["TiedNormHeadHostMixin", "check_mode_settings", "fp32_term_names", "start_resized_tokens"]
