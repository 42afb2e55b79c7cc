"""The normalized tied output head: the math of Liu, Zhai & Chen in one place.

With weight tying (Press & Wolf, 2017) the output layer reuses the input embedding matrix W (rows w_i),
scoring token i as s_i = w_i·h. Liu, Zhai & Chen ("Normalization of Input-output Shared Embeddings in
Text Generation Models") show that this score is biased by the row norm ‖w_i‖ and propose:

=========== ======================================= =========================================================
head_mode   score s_i                               paper
=========== ======================================= =========================================================
baseline    w_i·h                                   tied embeddings, eq. 1
l2          ŵ_i·h, ŵ_i = w_i/‖w_i‖                  "l2-normalized input embedding", eq. 19; the input
                                                    lookups use ŵ_i as well (see ``TiedNormEmbedding``)
square      w_i·h / ‖w_i‖²                          "square-normalized output embedding", eq. 22
distance    w_i·h − ½‖w_i‖²                         eq. 26; the bias is derived from W, not a parameter
cosine      w_i·h / ‖w_i‖                           eq. 27
=========== ======================================= =========================================================

Every mode is an affine map of the plain scores W·h along the vocabulary axis,
``s = (W·h) * column_scale + column_bias``, with vocabulary-sized vectors derived from the row norms.
That keeps the cost of any mode at one matmul plus O(V) work at decoding (O(V·d) for a training batch, whose
scale is folded into the rows of W instead of applied to the (tokens × V) logits), lets the chunked loss reuse it,
and means no normalized copy of W is kept. The row statistics are computed in fp32 with ``norm_eps`` so zero
rows and fp16/bf16 weights stay finite, and are cached (keyed on the weight's storage and version counter)
whenever no gradient is needed, so decoding does not recompute them at every step.

An optional logit scale g multiplies the scores, because bounded scores limit how sharp the softmax can get:
``fixed`` (FixNorm's r²), ``scalar`` (a learned g ≈ √d as in Transformers without Tears) or ``vector``
(one learned g_i per token, as in nGPT).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HEAD_MODES = ("baseline", "l2", "square", "distance", "cosine")
LOGIT_SCALES = ("none", "fixed", "scalar", "vector")


def row_norms(weight: torch.Tensor, eps: float) -> torch.Tensor:
    """‖w_i‖ of every row, in fp32, clamped below by ``eps`` so that dividing by it stays finite. Shape (V,)."""
    return torch.linalg.vector_norm(weight.float(), dim=-1).clamp_min(eps)


def unit_rows(rows: torch.Tensor, eps: float) -> torch.Tensor:
    """ŵ = w/‖w‖ for each row of ``rows`` (..., d), in the dtype of ``rows`` (norms in fp32, as ``row_norms``)."""
    return rows / row_norms(rows, eps).unsqueeze(-1).to(rows.dtype)


def mode_column_terms(
    weight: torch.Tensor, head_mode: str, eps: float
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(scale, bias) over the vocabulary such that ``s = (W·h) * scale + bias`` is the mode's score.

    ``None`` stands for "multiply by one" / "add zero". Both are fp32 vectors of shape (V,).
    """
    if head_mode == "baseline":
        return None, None
    norms = row_norms(weight, eps)
    if head_mode in ("l2", "cosine"):  # ŵ_i·h = w_i·h / ‖w_i‖
        return norms.reciprocal(), None
    if head_mode == "square":
        return norms.square().reciprocal(), None
    if head_mode == "distance":  # w_i·h − ½‖w_i‖²  (= −½‖w_i − h‖² + ½‖h‖², a nearest-neighbour score)
        # The squared norm is taken unclamped: a zero row has zero bias, as the equation says.
        return None, -0.5 * weight.float().square().sum(dim=-1)
    raise ValueError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")


class _InferenceCache:
    """Remembers a value derived from tensors until one of them changes.

    Used only when no gradient is needed (``torch.no_grad``, frozen weights); the key is each tensor's storage
    pointer, shape, dtype and version counter, so an optimizer step (in-place update), ``.data`` replacement
    (``resize_token_embeddings``), ``.to(dtype)`` or ``load_state_dict`` all invalidate it.
    """

    def __init__(self) -> None:
        self._key: tuple | None = None
        self._value = None

    @staticmethod
    def key(*tensors: torch.Tensor | None) -> tuple:
        return tuple(
            None if t is None else (t.data_ptr(), tuple(t.shape), t.dtype, t.device, t._version) for t in tensors
        )

    def get(self, key: tuple):
        return self._value if key == self._key else None

    def put(self, key: tuple, value):
        self._key, self._value = key, value
        return value


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


class TiedNormHead(nn.Linear):
    """Output layer scoring hidden states against a (tied) embedding matrix in one of ``HEAD_MODES``.

    It is an ``nn.Linear`` without bias whose ``weight`` (V, d) is the shared embedding matrix when the model
    ties it, so HF's tying, resizing and ``get_output_embeddings()`` treat it like any LM head.
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        head_mode: str = "cosine",
        logit_scale: str = "none",
        logit_scale_init: float | None = None,
        norm_eps: float = 1e-6,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__(hidden_size, vocab_size, bias=False, device=device, dtype=dtype)
        if head_mode not in HEAD_MODES:
            raise ValueError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
        if logit_scale not in LOGIT_SCALES:
            raise ValueError(f"logit_scale must be one of {LOGIT_SCALES}, got {logit_scale!r}")
        self.head_mode = head_mode
        self.logit_scale_kind = logit_scale
        # √d is the scale a unit-norm score needs to reach the sharpness of an unnormalized one.
        self.logit_scale_init = float(logit_scale_init) if logit_scale_init is not None else math.sqrt(hidden_size)
        self.norm_eps = norm_eps
        if logit_scale == "scalar":
            self.logit_scale = nn.Parameter(torch.full((), self.logit_scale_init, device=device))
        elif logit_scale == "vector":
            self.logit_scale = nn.Parameter(torch.full((vocab_size,), self.logit_scale_init, device=device))
        else:  # "fixed" is a constant, not a parameter; "none" has no scale
            self.logit_scale = None
        self._cache = _InferenceCache()

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, head_mode={self.head_mode!r}, logit_scale={self.logit_scale_kind!r}"

    def match_vocab_size(self) -> None:
        """After a resize of the (tied) weight, give new tokens a per-token logit scale at its initial value."""
        vocab_size = self.weight.shape[0]
        self.out_features = vocab_size
        if self.logit_scale_kind == "vector" and self.logit_scale.shape[0] != vocab_size:
            old = self.logit_scale.data
            new = torch.full((vocab_size,), self.logit_scale_init, dtype=old.dtype, device=old.device)
            kept = min(vocab_size, old.shape[0])
            new[:kept] = old[:kept]
            self.logit_scale = nn.Parameter(new)

    def _compute_column_terms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        scale, bias = mode_column_terms(self.weight, self.head_mode, self.norm_eps)
        if self.logit_scale_kind == "none":
            return scale, bias
        g = self.logit_scale.float() if self.logit_scale is not None else torch.tensor(self.logit_scale_init)
        g = g.to(self.weight.device)
        # g·(W·h·scale + bias) = W·h·(g·scale) + g·bias
        scale = g if scale is None else scale * g
        if scale.dim() == 0:  # a single g for every token
            scale = scale.expand(self.weight.shape[0])
        bias = None if bias is None else bias * g
        return scale, bias

    def column_terms(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The fp32 (V,) vectors (scale, bias) with logits = (W·h) * scale + bias; cached at inference."""
        if _needs_grad(self.weight, self.logit_scale):
            return self._compute_column_terms()
        key = _InferenceCache.key(self.weight, self.logit_scale)
        cached = self._cache.get(key)
        return cached if cached is not None else self._cache.put(key, self._compute_column_terms())

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> logits: (..., V); fp32 as soon as a norm term is applied
        scale, bias = self.column_terms()
        tokens = hidden_states.numel() // hidden_states.shape[-1]
        if scale is not None and tokens > hidden_states.shape[-1]:
            # (W·h)·s = (diag(s)·W)·h: scaling the V rows of W costs O(V·d) forward and backward, scaling the
            # logits O(tokens·V) three times (the product, its backward, the gradient of s), so once tokens > d
            # (training batches) scale the rows; decoding (few tokens) scales its few logits.
            logits = F.linear(hidden_states, self.weight * scale.unsqueeze(-1).to(self.weight.dtype))
            logits = logits.to(torch.promote_types(logits.dtype, scale.dtype))  # the dtype logits * scale has
        else:
            logits = F.linear(hidden_states, self.weight)
            if scale is not None:
                logits = logits * scale
        if bias is not None:
            logits = logits + bias
        return logits


class TiedNormEmbedding(nn.Embedding):
    """Token embedding that, for the l2 mode (Liu et al. eq. 19), looks up unit-normalized rows ŵ_i.

    In every other mode it is a plain ``nn.Embedding``: those modes leave the input embedding unchanged.
    """

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
        embeddings = super().forward(input_ids)  # (..., d)
        if not self.normalize:
            return embeddings
        # ŵ_i from the looked-up rows themselves: O(tokens·d) instead of normalizing all V rows, with the same
        # value and gradient, and nothing to cache.
        return unit_rows(embeddings, self.norm_eps)
