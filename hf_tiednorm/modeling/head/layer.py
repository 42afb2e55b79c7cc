"""The normalized tied output head: a ``TiedNormHead`` scores with the mode of ``head/modes.py``.

With weight tying (Press & Wolf, 2017) the output layer reuses the input embedding matrix W (rows w_i). The head asks
its mode (``head_modes.get_head_mode(head_mode)``, the one description of each mode: baseline, l2, square, distance,
cosine and any registered one) for the vocabulary-sized (scale, bias) of ``s = (W·h) * scale + bias``, and adds the
learned terms every mode shares: a logit scale g and a logit bias b. That keeps the cost of any mode at one matmul plus
O(V) work at decoding (O(V·d) for a training batch, whose scale is folded into the rows of W instead of applied to
the (tokens × V) logits), lets the chunked loss reuse it, and means no normalized copy of W is kept.

What the head guarantees where real training puts it:

* **Dead rows.** A row with ‖w_i‖ ≤ ``norm_eps`` (HF initialization zeroes the padding row; released checkpoints
  keep it zero) counts as the zero vector in the normalized modes: it scores 0 (as ``baseline`` and ``distance``
  score w_i = 0), l2 lookups return 0, and the normalization passes it **no gradient**. The direction
  w/‖w‖ of a zero vector is undefined and its gradient grows as 1/‖w‖, so a floored norm (1/eps ≈ 1e6) made the
  padding row's gradient dominate the whole model's (max/median row gradient 5e4–4e9 at step 0, i.e. gradient
  clipping shrank every other update ~1000×). A dead row stays dead: the padding token is never a target.
* **Dtypes.** Norms, scales and biases are computed in fp32; the scale is folded into W in fp32 and only the unit
  rows are cast back, so fp16/bf16 weights never overflow (1/eps would). Logits are fp32 (fp64 for fp64 weights)
  in every mode, also under autocast.
* **No stale norms.** The (scale, bias) vectors are recomputed at every forward (O(V·d), small beside the
  (tokens × V × d) matmul), except inside ``frozen_column_terms()`` — which ``generate()`` enters — where the
  weights cannot change and the first step's vectors are reused. Nothing is keyed on storage pointers or version
  counters, which ``.data`` writes, PEFT merges and FSDP/ZeRO-3 refills do not bump; and the forward has no
  data-dependent Python branch, so ``torch.compile(fullgraph=True)`` traces it.

An optional logit scale g multiplies the scores, because bounded scores limit how sharp the softmax can get:
``fixed`` (FixNorm's r²), ``scalar`` (one learned g, as in Transformers without Tears) or ``vector``
(one learned g_i per token, as in nGPT). A learned g starts at 1 unless told otherwise: these heads normalize the
rows of W but keep the norm of h, so their scores already have the scale of plain ones; a start at √d (the g a
score with *both* sides unit-norm needs) makes a new model's step-0 logits √d× too sharp (docs/evidence.md).

An optional learned per-token **logit bias** b (``logit_bias=True``, zero at initialization) is added last,
``s_i = g·score_i + b_i``: the row norms of a tied matrix carry the unigram prior (Kobayashi et al. 2023; Oyama et al.
2023), which a normalized head deletes, and b is where a model can keep it (HF Marian's ``final_logits_bias`` is a
buffer, not a parameter). Being one more (V,) bias of the affine map, it costs O(V) and reaches the chunked loss
through ``column_terms()`` like the mode's own bias.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .folded_weight import fold_scale
from .modes import HeadMode, hold_head_mode, unit_rows
from .settings import HEAD_NAME_SOURCES, HeadSettings, head_terms


class NormalizedScoresMixin:
    """What both tied heads (``TiedNormHead`` and the adaptive softmax) share: the mode and logit-scale fields, the
    learned logit-scale parameter, and column terms that are held fixed during one generation.

    A head calls ``init_normalized_scores`` in its ``__init__`` and implements ``_compute_column_terms``.
    """

    def init_normalized_scores(self, settings: HeadSettings, hidden_size: int, vocab_size: int, device=None) -> None:
        """Take the head's settings (checked when ``settings`` was made) and create its learned g and b."""
        self.settings = settings
        self.head_mode = settings.head_mode
        self.mode: HeadMode = settings.mode  # everything the mode is (head/modes.py)
        hold_head_mode(self)  # its name keeps this definition while the head lives (head/modes.py)
        self.norm_eps = settings.norm_eps
        # The learned terms (head/settings.HeadTerm: the built-in g and b, terms.py, and any registered one),
        # each a parameter named as the term, or None where ``settings`` leave it off (or it is a constant).
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

    def __setstate__(self, state) -> None:
        super().__setstate__(state)
        if "mode" in state:  # a copy (copy.deepcopy, pickle) of a head holds its mode as the head does
            hold_head_mode(self)

    def fold_terms(self, scale, bias, rows: slice, device):
        """The mode's (scale, bias) of the tokens ``rows`` with every learned term folded in, in registry order (g,
        then b, then the registered ones): ``s_i = g·score_i + b_i``, then each registered term's fold."""
        for term in self.settings.active_terms():
            scale, bias = term.fold_into(self, scale, bias, rows, device)
        return scale, bias

    @contextmanager
    def frozen_column_terms(self) -> Iterator[None]:
        """Inside this block (and without gradients) the column terms are computed once and reused.

        For decoding, where the weights cannot change between steps; leaving the outermost block drops them.
        """
        self._frozen_depth += 1
        try:
            yield
        finally:
            self._frozen_depth -= 1
            if self._frozen_depth == 0:
                self._frozen_terms = None

    def column_terms(self):
        """The mode's fp32 (scale, bias) vectors — for ``TiedNormHead`` (V,) each, with logits = (W·h) * scale + bias
        — recomputed at every call except inside ``frozen_column_terms`` without gradients."""
        if self._frozen_depth == 0 or torch.is_grad_enabled():
            return self._compute_column_terms()
        if self._frozen_terms is None:
            self._frozen_terms = self._compute_column_terms()
        return self._frozen_terms


class TiedNormHead(NormalizedScoresMixin, nn.Linear):
    """Output layer scoring hidden states against a (tied) embedding matrix in one of ``HEAD_MODES``.

    It is an ``nn.Linear`` without bias whose ``weight`` (V, d) is the shared embedding matrix when the model
    ties it, so HF's tying, resizing and ``get_output_embeddings()`` treat it like any LM head.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        *,
        settings: HeadSettings | None = None,
        device=None,
        dtype=None,
        options: HeadSettings | None = None,
    ) -> None:
        """``settings``: the head's settings as one value (a config's ``HeadSettings.from_config``); None: the
        defaults (``HeadSettings()``). ``options``: its name in 0.1, taken with a FutureWarning for one release."""
        if options is not None:
            warnings.warn("TiedNormHead(options=...) is renamed settings=...", FutureWarning, stacklevel=2)
            settings = options
        super().__init__(hidden_size, vocab_size, bias=False, device=device, dtype=dtype)
        self.init_normalized_scores(settings or HeadSettings(), hidden_size, vocab_size, device=device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, head_mode={self.head_mode!r}, {self.settings.term_settings()}"

    def match_vocab_size(self) -> None:
        """After a resize of the (tied) weight, give new tokens a per-token logit scale at its initial value and a
        zero logit bias."""
        vocab_size = self.weight.shape[0]
        self.out_features = vocab_size
        for term in head_terms():  # a per-token term's new tokens start at the term's start value
            values = getattr(self, term.name, None)
            if values is not None and values.dim() == 1 and values.shape[0] != vocab_size:
                resized = _resized(values.data, vocab_size, self.term_starts[term.name])
                setattr(self, term.name, nn.Parameter(resized))

    def _compute_column_terms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        scale, bias = self.mode.column_terms(self.weight, self.norm_eps)
        return self.fold_terms(scale, bias, slice(0, self.weight.shape[0]), self.weight.device)

    @torch.no_grad()
    def plain_output_layer(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The plain linear layer computing this head's logits, for a plain export: weight diag(scale)·W (V, d) in
        fp32 and bias (V,) fp32 or None, with (scale, bias) the effective column terms (mode, g and b folded in).
        The matching input lookups are ``self.mode.plain_input_weight(W, norm_eps)``."""
        scale, bias = self._compute_column_terms()
        weight = self.weight.float() if scale is None else self.weight.float() * scale.unsqueeze(-1)
        return weight, bias

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> logits: (..., V), fp32 (fp64 for fp64 weights) in every mode
        scale, bias = self.column_terms()
        logits_dtype = torch.promote_types(self.weight.dtype, torch.float32)
        tokens = hidden_states.numel() // hidden_states.shape[-1]
        if scale is not None and tokens > hidden_states.shape[-1]:
            # (W·h)·s = (diag(s)·W)·h: scaling the V rows of W costs O(V·d) forward and backward, scaling the
            # logits O(tokens·V) three times (the product, its backward, the gradient of s), so once tokens > d
            # (training batches, wide beam search) scale the rows. Each product in fp32 (s reaches 1/eps, the scaled
            # rows don't), a block of rows at a time, saving W and s only: no fp32 copy of W (head/folded_weight.py).
            weight = fold_scale(self.weight, scale)
            logits = F.linear(hidden_states, weight).to(logits_dtype)
        else:
            logits = F.linear(hidden_states, self.weight).to(logits_dtype)
            if scale is not None:
                logits = logits * scale
        if bias is not None:
            logits = logits + bias
        return logits


def head_attribute_names() -> frozenset[str]:
    """Every name a ``TiedNormHead`` with every setting on holds (attributes, methods, parameters): a registered head
    option may take none of them (head/settings.register_head_term), since its parameter would replace it."""
    head = TiedNormHead(2, 3, settings=HeadSettings(), device="meta")  # a built-in term's name is held when off too
    return frozenset({*dir(head), *vars(head)})


HEAD_NAME_SOURCES.append(head_attribute_names)


def _resized(values: torch.Tensor, size: int, fill: float) -> torch.Tensor:
    """``values`` (V,) cut or extended to (size,), new entries set to ``fill``."""
    new = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    kept = min(size, values.shape[0])
    new[:kept] = values[:kept]
    return new


def out_of_vocabulary_message(input_ids: torch.Tensor, vocab_size: int) -> str:
    """What is wrong when a lookup of ``input_ids`` in a ``vocab_size``-row embedding failed: the first id outside
    [0, vocab_size), where it is, and how many there are."""
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    where = bad.nonzero()[0].tolist() if bad.any() else []
    first = int(input_ids[tuple(where)]) if where else None
    return (
        f"token id {first} (at position {tuple(where)} of the input ids, {int(bad.sum())} out of range in all) is "
        f"outside the vocabulary of {vocab_size} tokens (ids 0..{vocab_size - 1}): the tokenizer or the data does "
        "not match the model (len(tokenizer) must not exceed config.vocab_size)"
    )


class TiedNormEmbedding(nn.Embedding):
    """Token embedding that, with ``normalize`` (a mode whose ``normalizes_input_lookups``: l2, Liu et al. eq. 19),
    looks up unit-normalized rows ŵ_i; otherwise a plain ``nn.Embedding``."""

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        padding_idx: int | None = None,
        normalize: bool = False,
        norm_eps: float = 1e-6,
        **kwargs,
    ) -> None:
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
    "head_attribute_names",
    "out_of_vocabulary_message",
]
