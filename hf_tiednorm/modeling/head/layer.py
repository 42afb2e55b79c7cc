"""The normalized tied output layer: ``TiedNormHead`` scores ``s = (W·h) * scale + bias`` with its mode's (scale,
bias) (head/modes.py) and the learned terms folded in (head/terms.py): one matmul plus O(V) work at decoding, the
scale folded into W's rows in training (O(V·d) instead of O(tokens·V)), no normalized copy of W. What it guarantees
(dead rows, fp32 logits, no stale norms, ``torch.compile``) is in docs/head.md, "What the head guarantees"."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .folded_weight import FoldedHead, fold_scale
from .modes import HeadMode, get_head_mode, unit_rows
from .settings import HeadSettings
from .terms import active_terms, head_terms, term_settings


class NormalizedScoresMixin:
    """What both tied heads (``TiedNormHead``, the adaptive softmax) share: the mode, the learned terms, and column
    terms held fixed during one generation. A head calls ``init_normalized_scores`` and implements
    ``_compute_column_terms``."""

    def init_normalized_scores(self, settings: HeadSettings, hidden_size: int, vocab_size: int, device=None) -> None:
        """Take the head's settings (checked when made) and create its learned terms."""
        self.settings = settings
        self.head_mode = settings.head_mode
        self.mode: HeadMode = get_head_mode(settings.head_mode)  # everything the mode is (head/modes.py)
        self.norm_eps = settings.norm_eps
        # Each learned term is a parameter named as the term, or None where it is off (or a constant).
        self.term_starts = {term.name: term.start_value(settings, hidden_size) for term in head_terms()}
        for term in head_terms():
            shape = term.shape(settings, vocab_size)
            if shape is not None:
                # register_parameter, not setattr: a name the head holds already is refused, never replaced
                value = torch.full(shape, self.term_starts[term.name], device=device)
                self.register_parameter(term.name, nn.Parameter(value))
            elif term.config_fields:  # a built-in term's attribute is always there (None: off)
                setattr(self, term.name, None)
        self._frozen_depth = 0
        self._frozen_terms = None

    def embedding_matrices(self) -> list[torch.Tensor]:
        """The matrices holding the rows w_k the head scores, in token-id order: its weight (V, d)."""
        return [self.weight]

    def check_resizable(self) -> None:
        """Nothing: the per-token terms follow a resize of the tied weight (``match_vocab_size``)."""

    def fold_terms(self, scale, bias, rows: slice, device):
        """The mode's (scale, bias) of the tokens ``rows`` with every learned term folded in (g, b, then added ones)."""
        for term in active_terms(self.settings):
            scale, bias = term.fold_into(self, scale, bias, rows, device)
        return scale, bias

    @contextmanager
    def frozen_column_terms(self) -> Iterator[None]:
        """Inside this block, without gradients, the column terms are computed once (decoding: the weights do not
        change); leaving the outermost block drops them."""
        self._frozen_depth += 1
        try:
            yield
        finally:
            self._frozen_depth -= 1
            if self._frozen_depth == 0:
                self._frozen_terms = None

    def column_terms(self):
        """The fp32 (scale, bias), (V,) each for ``TiedNormHead``: recomputed at every call but in
        ``frozen_column_terms``."""
        if self._frozen_depth == 0 or torch.is_grad_enabled():
            return self._compute_column_terms()
        if self._frozen_terms is None:
            self._frozen_terms = self._compute_column_terms()
        return self._frozen_terms


class TiedNormHead(NormalizedScoresMixin, nn.Linear):
    """The output layer scoring hidden states against the (tied) embedding matrix in a head mode: an ``nn.Linear``
    without bias whose ``weight`` (V, d) is the shared matrix, so HF's tying, resizing and
    ``get_output_embeddings()`` treat it as any LM head. ``settings``: a ``HeadSettings`` (None: the defaults);
    ``options``: its name in 0.1 (a FutureWarning)."""

    def __init__(self, hidden_size: int, vocab_size: int, *, settings: HeadSettings | None = None, device=None,
                 dtype=None, options: HeadSettings | None = None) -> None:  # fmt: skip
        if options is not None:
            warnings.warn("TiedNormHead(options=...) is renamed settings=...", FutureWarning, stacklevel=2)
            settings = options
        super().__init__(hidden_size, vocab_size, bias=False, device=device, dtype=dtype)
        self.init_normalized_scores(settings or HeadSettings(), hidden_size, vocab_size, device=device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, head_mode={self.head_mode!r}, {term_settings(self.settings)}"

    def match_vocab_size(self) -> None:
        """After a resize of the (tied) weight, the per-token terms follow: new tokens at the terms' start values."""
        vocab_size = self.weight.shape[0]
        self.out_features = vocab_size
        for term in head_terms():  # a per-token term's new tokens start at the term's start value
            values = getattr(self, term.name, None)
            if values is not None and values.dim() == 1 and values.shape[0] != vocab_size:
                resized = _resized(values.data, vocab_size, self.term_starts[term.name])
                setattr(self, term.name, nn.Parameter(resized))

    def _compute_column_terms(self, weight: torch.Tensor | None = None):
        """The (scale, bias) of ``weight``: the head's W by default; FoldedHead passes an alias carrying its norms."""
        weight = self.weight if weight is None else weight
        scale, bias = self.mode.column_terms(weight, self.norm_eps)
        return self.fold_terms(scale, bias, slice(0, weight.shape[0]), weight.device)

    def folded_weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The linear layer this head computes: W_s = diag(scale)·W (V, d) in W's dtype and the bias (V,) fp32 or None
        (mode and terms folded in); differentiable (head/folded_weight.py). What a training batch's loss scores with."""
        if not torch.is_grad_enabled():  # evaluation, decoding: the (possibly frozen) terms, no autograd
            scale, bias = self.column_terms()
            return fold_scale(self.weight, scale), bias
        terms = tuple(parameter for parameter in self.parameters() if parameter is not self.weight)
        return FoldedHead.apply(self._compute_column_terms, self.weight, *terms)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> logits: (..., V), fp32 (fp64 for fp64 weights) in every mode
        logits_dtype = torch.promote_types(self.weight.dtype, torch.float32)
        tokens = hidden_states.numel() // hidden_states.shape[-1]
        if tokens > hidden_states.shape[-1]:
            # (W·h)·s = (diag(s)·W)·h: scaling W's rows costs O(V·d), the logits O(tokens·V) three times (product,
            # backward, gradient of s), so once tokens > d (training, wide beams) scale the rows: head/folded_weight.py
            weight, bias = self.folded_weight_and_bias()
            logits = F.linear(hidden_states, weight).to(logits_dtype)
        else:
            scale, bias = self.column_terms()
            logits = F.linear(hidden_states, self.weight).to(logits_dtype)
            if scale is not None:
                logits = logits * scale
        # In place: the logits are this forward's own tensor, which no backward needs (a (tokens × V) pass saved).
        return logits if bias is None else logits.add_(bias)


def _resized(values: torch.Tensor, size: int, fill: float) -> torch.Tensor:
    """``values`` (V,) cut or extended to (size,), new entries set to ``fill``."""
    new = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    kept = min(size, values.shape[0])
    new[:kept] = values[:kept]
    return new


def out_of_vocabulary_message(input_ids: torch.Tensor, vocab_size: int) -> str:
    """Why a lookup of ``input_ids`` in a ``vocab_size``-row embedding failed: the first id outside, where, how many."""
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    where = bad.nonzero()[0].tolist() if bad.any() else []
    first = int(input_ids[tuple(where)]) if where else None
    return (f"token id {first} (at position {tuple(where)} of the input ids, {int(bad.sum())} out of range in all) "
            f"is outside the vocabulary of {vocab_size} tokens (ids 0..{vocab_size - 1}): the tokenizer or the data "
            "does not match the model (len(tokenizer) must not exceed config.vocab_size)")


class TiedNormEmbedding(nn.Embedding):
    """A token embedding that looks up unit rows ŵ_i with ``normalize`` (the l2 mode, Liu et al. eq. 19)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, normalize: bool = False,
                 norm_eps: float = 1e-6, **kwargs) -> None:  # fmt: skip
        super().__init__(num_embeddings, embedding_dim, padding_idx, **kwargs)
        self.normalize = normalize
        self.norm_eps = norm_eps

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalize={self.normalize}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            embeddings = super().forward(input_ids)  # (..., d)
        else:
            try:
                embeddings = super().forward(input_ids)
            except IndexError as error:  # nothing is checked unless the lookup failed (CPU; CUDA asserts on device)
                raise IndexError(out_of_vocabulary_message(input_ids, self.num_embeddings)) from error
        if not self.normalize:
            return embeddings
        # ŵ_i from the looked-up rows themselves: O(tokens·d) instead of normalizing all V rows, with the same
        # value and gradient, and nothing to cache.
        return unit_rows(embeddings, self.norm_eps)


__all__ = [
    "NormalizedScoresMixin",
    "TiedNormEmbedding",
    "TiedNormHead",
    "out_of_vocabulary_message",
]
