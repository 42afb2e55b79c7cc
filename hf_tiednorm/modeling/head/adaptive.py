"""Adaptive input tied with an adaptive softmax (Baevski & Auli 2019), scored in a head mode: the frequency-ordered
vocabulary is split by ``cutoffs`` into bands of width d // k^i; with tied projections a band scores a token exactly
as plain tying scores it against its input embedding, and the mode normalizes each band's rows. The head returns the
exact log-probabilities of all V tokens as its logits. (docs/code_notes.md)"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .layer import NormalizedScoresMixin, out_of_vocabulary_message
from .modes import unit_rows
from .settings import HeadSettings
from .terms import term_settings


def band_edges(vocab_size: int, cutoffs: Sequence[int]) -> list[int]:
    """[0, c_1, …, c_{n-1}, V]: band i holds the token ids in [edges[i], edges[i+1])."""
    return [0, *cutoffs, vocab_size]


def band_dims(hidden_size: int, num_bands: int, div_value: float) -> list[int]:
    """d_i = d // k^i, the width of band i (as ``torch.nn.AdaptiveLogSoftmaxWithLoss`` sizes its tails)."""
    return [int(hidden_size // (div_value**i)) for i in range(num_bands)]


class AdaptiveInput(nn.Module):
    """Adaptive input embedding: band i looks its rows up in R^{d_i} (unit rows in l2 mode) and projects them to R^d."""

    def __init__(self, vocab_size: int, hidden_size: int, cutoffs: Sequence[int], div_value: float = 4.0,
                 padding_idx: int | None = None, normalize: bool = False, norm_eps: float = 1e-6) -> None:  # fmt: skip
        super().__init__()
        self.edges = band_edges(vocab_size, cutoffs)
        self.hidden_size = hidden_size
        self.normalize = normalize
        self.norm_eps = norm_eps
        dims = band_dims(hidden_size, len(self.edges) - 1, div_value)
        bands, projections = [], []
        for (lo, hi), dim in zip(zip(self.edges[:-1], self.edges[1:]), dims):
            band_padding = padding_idx - lo if padding_idx is not None and lo <= padding_idx < hi else None
            bands.append(nn.Embedding(hi - lo, dim, padding_idx=band_padding))
            projections.append(nn.Linear(dim, hidden_size, bias=False))  # P_i, weight (d, d_i)
        self.bands = nn.ModuleList(bands)
        self.projections = nn.ModuleList(projections)

    @property
    def num_embeddings(self) -> int:
        return self.edges[-1]

    def extra_repr(self) -> str:
        return f"edges={self.edges}, normalize={self.normalize}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Without a host sync (a GPU would wait for every band's data-dependent selection): every band looks up every
        # token, its id clamped into the band, and a mask keeps the band's own tokens. The ids are not clamped below
        # the first band nor above the last, so an id outside [0, V) fails that band's lookup as in an nn.Embedding
        # (IndexError on CPU, a device-side assert on CUDA); nothing else is checked on the way. Each token costs
        # every band's lookup and projection (sum of d_i ≤ 4/3·d), as the head already scores every band.
        try:
            return self._embed(input_ids)
        except IndexError as error:
            raise IndexError(out_of_vocabulary_message(input_ids, self.num_embeddings)) from error

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)  # (tokens,)
        weight = self.projections[0].weight
        out = torch.zeros(flat.shape[0], self.hidden_size, dtype=weight.dtype, device=weight.device)
        last = len(self.bands) - 1
        bands = zip(self.edges[:-1], self.edges[1:], self.bands, self.projections)
        for i, (lo, hi, band, projection) in enumerate(bands):
            local = flat - lo  # (tokens,): the band's own ids, the others clamped into it
            if i > 0:
                local = local.clamp(min=0)
            if i < last:
                local = local.clamp(max=hi - lo - 1)
            rows = band(local)  # (tokens, d_i)
            if self.normalize:
                rows = unit_rows(rows, self.norm_eps)
            inside = ((flat >= lo) & (flat < hi)).unsqueeze(-1)  # (tokens, 1)
            out = torch.where(inside, projection(rows).to(out.dtype), out)  # (tokens, d)
        return out.view(*input_ids.shape, self.hidden_size)


def embedding_matrices(embedding: nn.Module) -> list[torch.Tensor]:
    """The matrices holding the rows w_k of an input embedding or an output layer, in token-id order: its (V, d)
    weight, or one (n_i, d_i) matrix per band of an ``AdaptiveInput`` or ``AdaptiveSoftmaxHead``."""
    if isinstance(embedding, (AdaptiveInput, AdaptiveSoftmaxHead)):
        return [band.weight for band in embedding.bands]
    return [embedding.weight]


class AdaptiveSoftmaxHead(NormalizedScoresMixin, nn.Module):
    """Adaptive softmax whose band rows (and projections) are tied to an ``AdaptiveInput``'s by parameter name;
    ``forward`` returns log-probabilities."""

    def __init__(self, hidden_size: int, vocab_size: int, cutoffs: Sequence[int], div_value: float = 4.0, *,
                 settings: HeadSettings | None = None) -> None:  # fmt: skip
        """``settings``: the head's settings as one value (``HeadSettings``); None: the defaults."""
        super().__init__()
        if settings is not None and settings.extra_terms:
            raise ValueError(f"head terms {list(settings.extra_terms)} are not supported by the adaptive softmax")
        self.init_normalized_scores(settings or HeadSettings(), hidden_size, vocab_size)
        self.edges = band_edges(vocab_size, cutoffs)
        num_bands = len(self.edges) - 1
        dims = band_dims(hidden_size, num_bands, div_value)
        sizes = [hi - lo for lo, hi in zip(self.edges[:-1], self.edges[1:])]
        self.bands = nn.ModuleList(nn.Linear(dim, size, bias=False) for dim, size in zip(dims, sizes))
        self.projections = nn.ModuleList(nn.Linear(dim, hidden_size, bias=False) for dim in dims)
        self.cluster = nn.Linear(hidden_size, num_bands - 1, bias=False)  # logits of bands 1.. in the head softmax

    def extra_repr(self) -> str:
        return f"edges={self.edges}, head_mode={self.head_mode!r}, {term_settings(self.settings)}"

    @staticmethod
    def tied_parameter_names(num_bands: int, tie_projections: bool) -> list[str]:
        """Names, relative to the head and to the ``AdaptiveInput``, of the parameters they share."""
        names = [f"bands.{i}.weight" for i in range(num_bands)]
        return names + ([f"projections.{i}.weight" for i in range(num_bands)] if tie_projections else [])

    def embedding_matrices(self) -> list[torch.Tensor]:
        """One (n_i, d_i) matrix per band, in token-id order."""
        return [band.weight for band in self.bands]

    def check_resizable(self) -> None:
        raise ValueError("resize_token_embeddings is not supported with adaptive_cutoffs: the bands are tied to the "
                         "frequency order of the vocabulary; build a new model with a new vocabulary and cutoffs")

    def _compute_column_terms(self) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Per band, the fp32 (n_i,) vectors (scale, bias) of the mode's affine map."""
        terms = []
        for lo, hi, band in zip(self.edges[:-1], self.edges[1:], self.bands):
            scale, bias = self.mode.column_terms(band.weight, self.norm_eps)  # (n_i,) each or None
            terms.append(self.fold_terms(scale, bias, slice(lo, hi), self.cluster.weight.device))  # g, b folded in
        return terms

    def band_scores(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        """Normalized scores of every band's tokens: a list of (..., n_i) fp32 tensors."""
        scores = []
        for band, projection, (scale, bias) in zip(self.bands, self.projections, self.column_terms()):
            reduced = F.linear(hidden_states, projection.weight.t())  # (..., d) @ Q_i -> (..., d_i)
            band_scores = F.linear(reduced, band.weight).float()  # (..., n_i)
            if scale is not None:
                band_scores = band_scores * scale
            if bias is not None:
                band_scores = band_scores + bias
            scores.append(band_scores)
        return scores

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> exact log-probabilities (..., V), fp32
        scores = self.band_scores(hidden_states)
        head = torch.cat([scores[0], self.cluster(hidden_states).float()], dim=-1)  # (..., n_0 + bands - 1)
        head_log_probs = F.log_softmax(head, dim=-1)
        shortlist = self.edges[1]
        log_probs = [head_log_probs[..., :shortlist]]
        for i, band_scores in enumerate(scores[1:]):
            cluster_log_prob = head_log_probs[..., shortlist + i : shortlist + i + 1]  # (..., 1)
            log_probs.append(cluster_log_prob + F.log_softmax(band_scores, dim=-1))
        return torch.cat(log_probs, dim=-1)


__all__ = ["AdaptiveInput", "AdaptiveSoftmaxHead", "band_dims", "band_edges", "embedding_matrices"]
