"""The head's learned terms, folded into a mode's (scale, bias): the protocol every term follows (``HeadTerm``), the
built-in logit scale g and logit bias b of ``s_i = g·score_i + b_i``, and ``ExtraHeadTerm``, a term added from outside
(``hf_tiednorm.register_head_term``). The head, a resize and fp32 handling ask a term only these hooks, never its
name, so an added term is a parameter, a fold and a resize as g and b are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from .settings import HEAD_TERMS

# The terms a mode's lossless start sets (``HeadMode.lossless_start``), in the order of its ``lossless_terms``.
MODE_LOSSLESS_TERMS: tuple[str, ...] = ("logit_scale", "logit_bias")


class HeadTerm:
    """A learned term of the head; the defaults are those of a per-token (V,) term switched on by ``extra_terms``.

    Attributes:
        name: the head's parameter (``lm_head.<name>``, a state-dict key).
        help: what it is (its flag's help).
        config_fields: the config fields that set it; () for a term named in ``extra_terms``.
        keep_fp32: kept fp32 under a bf16/fp16 load (a small learning rate's step rounds away in bf16).
        row_scaled: it multiplies or shifts the whole logit (g, b), so a source's output row scale c_i scales it.
        takes_row_scales: a lossless start that sets it absorbs those c_i.
    """

    name: str
    help: str
    config_fields: tuple[str, ...] = ()
    keep_fp32: bool = True
    row_scaled: bool = False
    takes_row_scales: bool = False

    def is_on(self, settings) -> bool:
        """Whether a head with these ``HeadSettings`` holds or applies the term."""
        return self.name in settings.extra_terms

    def setting(self, settings) -> str:
        """The config setting that switches it, as config.json states it."""
        return f"extra_terms={list(settings.extra_terms)!r}"

    def start_value(self, settings, hidden_size: int) -> float:
        """The parameter's first value (and a resized vocabulary's new tokens')."""
        return float(self.init)

    def shape(self, settings, vocab_size: int) -> tuple[int, ...] | None:
        """The parameter's shape; None: the head holds no parameter for it."""
        return (vocab_size,) if self.is_on(settings) else None

    def fold_into(self, head, scale, bias, rows: slice, device):
        """(scale, bias) of the tokens ``rows`` (fp32 (n,) or None) with this term folded in."""
        return self.fold(getattr(head, self.name)[rows].float(), scale, bias)

    def lossless_value(self, head, rows: torch.Tensor, mode_terms: dict):
        """Its value for ``rows`` after a lossless start (``mode_terms``: the mode's g and b, which g and b take), or
        None: left as is."""
        if self.name in MODE_LOSSLESS_TERMS:
            return mode_terms.get(self.name)
        value = getattr(self, "lossless", None)
        return None if value is None else torch.full((rows.shape[0],), float(value), device=rows.device)


@dataclass(frozen=True)
class ExtraHeadTerm(HeadTerm):
    """A learned per-token term t (V,) added from outside: the parameter ``name`` starts at ``init`` and is folded by
    ``fold(t, scale, bias) -> (scale, bias)``; ``card``: its model card line; ``lossless``: its value after a lossless
    start (None: ``init``)."""

    name: str
    help: str
    init: float
    fold: Callable
    card: str
    keep_fp32: bool = True
    lossless: float | None = None


def head_terms() -> tuple[HeadTerm, ...]:
    """Every registered head term, in folding order."""
    return tuple(HEAD_TERMS.values())


def learned_terms() -> tuple[str, ...]:
    """The parameter name of every term a head may hold ('lm_head.<name>')."""
    return tuple(HEAD_TERMS)


def active_terms(settings) -> tuple[HeadTerm, ...]:
    """The terms ``settings`` switch on, in folding order: the built-ins', then ``extra_terms``."""
    built_in = (term for term in head_terms() if term.config_fields and term.is_on(settings))
    return (*built_in, *map(HEAD_TERMS.get, settings.extra_terms))


def term_settings(settings) -> str:
    """The terms' settings as config.json states them (a head's repr)."""
    found = (term.setting(settings) for term in head_terms() if term.config_fields or term.is_on(settings))
    return ", ".join(dict.fromkeys(found))


def default_logit_scale(logit_scale: str, hidden_size: int) -> float:
    """g when ``logit_scale_init`` is unset: 1 for a learned scale (the head starts scale-free), √d for ``fixed``."""
    return math.sqrt(hidden_size) if logit_scale == "fixed" else 1.0


class LogitScaleTerm(HeadTerm):
    """g: ``fixed`` (a constant, FixNorm's r²), a learned ``scalar`` (0-dim) or ``vector`` (V,) (nGPT)."""

    name = "logit_scale"
    help = "the logit scale g: logit_scale_kind 'vector' for a (V,) tensor, 'scalar' for a 0-dim one"
    config_fields = ("logit_scale_kind", "logit_scale_init")
    row_scaled = takes_row_scales = True

    def is_on(self, settings) -> bool:
        return settings.logit_scale_kind != "none"

    def setting(self, settings) -> str:
        return f"logit_scale_kind={settings.logit_scale_kind!r}"

    def start_value(self, settings, hidden_size: int) -> float:
        init = settings.logit_scale_init
        return float(init) if init is not None else default_logit_scale(settings.logit_scale_kind, hidden_size)

    def shape(self, settings, vocab_size: int) -> tuple[int, ...] | None:
        return {"scalar": (), "vector": (vocab_size,)}.get(settings.logit_scale_kind)

    def fold_into(self, head, scale, bias, rows: slice, device):
        # g·(W·h·scale + bias) = W·h·(g·scale) + g·bias; "fixed" is a constant, not a parameter
        if head.settings.logit_scale_kind == "none":
            return scale, bias
        g = head.logit_scale
        g = g.float() if g is not None else torch.tensor(head.term_starts[self.name], device=device)
        g = g[rows] if g.dim() else g.expand(rows.stop - rows.start)  # a single g for every token
        return (g if scale is None else scale * g), (None if bias is None else bias * g)


class LogitBiasTerm(HeadTerm):
    """b: a learned (V,) bias added after the scale, zero at first: where a model keeps the unigram prior that a
    normalized head deletes."""

    name, help, init = "logit_bias", "the learned per-token logit bias b: logit_bias true", 0.0
    config_fields = ("logit_bias",)
    row_scaled = True

    def is_on(self, settings) -> bool:
        return settings.logit_bias

    def setting(self, settings) -> str:
        return f"logit_bias={settings.logit_bias!r}"

    def fold_into(self, head, scale, bias, rows: slice, device):
        if head.logit_bias is None:
            return scale, bias
        learned = head.logit_bias[rows].float()
        return scale, (learned if bias is None else bias + learned)


for _term in (LogitScaleTerm(), LogitBiasTerm()):  # first in the registry: they fold first
    HEAD_TERMS.setdefault(_term.name, _term)


@torch.no_grad()
def start_lossless_rows(head, first: int) -> None:
    """Set every term of ``head`` a lossless start sets (``HeadTerm.lossless_value``) for tokens ``first`` and up."""
    rows = head.weight[first:]
    mode_terms = dict(zip(MODE_LOSSLESS_TERMS, head.mode.lossless_terms(rows, head.norm_eps), strict=True))
    for term in active_terms(head.settings):
        value = term.lossless_value(head, rows, mode_terms)  # (new,) or None: the term is left as it is
        if value is not None:
            getattr(head, term.name)[first:].copy_(value)  # copy_: from any device, as a load does


__all__ = [
    "MODE_LOSSLESS_TERMS", "ExtraHeadTerm", "HeadTerm", "LogitBiasTerm", "LogitScaleTerm", "active_terms",
    "default_logit_scale", "head_terms", "learned_terms", "start_lossless_rows", "term_settings",
]  # fmt: skip
