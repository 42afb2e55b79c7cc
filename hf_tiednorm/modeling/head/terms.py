"""The head's two built-in learned terms, ``HeadTerm`` objects registered at import as an outside term is
(settings.py): the logit scale g and the logit bias b of ``s_i = g·score_i + b_i``.

* ``logit_scale`` (config fields ``logit_scale_kind``, ``logit_scale_init``): ``none``; ``fixed`` (a constant g,
  FixNorm's r², no parameter); ``scalar`` (one learned g, as in Transformers without Tears); ``vector`` (a learned
  g_i per token, as in nGPT). A learned g starts at 1 unless told otherwise, ``fixed`` at √d (layer.py).
* ``logit_bias`` (config field ``logit_bias``): a learned b_i per token, zero at first, added after the scale: where
  a model can keep the unigram prior that a normalized head deletes.

Everything the package does with them (the head's parameters and fold, a resize's new tokens, fp32, a lossless
start, the load checks, the flags, the export and the card) asks these objects, through the ``HeadTerm`` hooks.
Their config fields and state-dict keys (``lm_head.logit_scale``, ``lm_head.logit_bias``) are those of every saved
model.
"""

from __future__ import annotations

import math
import sys
import warnings

import torch

from .settings import LOGIT_SCALES, HeadTerm, add_head_term


def default_logit_scale(logit_scale: str, hidden_size: int) -> float:
    """g when ``logit_scale_init`` is unset: 1 for a learned scale (``scalar``, ``vector``: the head starts as the
    scale-free one and learns the sharpness it needs); √d for ``fixed``, the constant it has always had (a saved
    ``fixed`` model's function depends on it, so it keeps its meaning)."""
    return math.sqrt(hidden_size) if logit_scale == "fixed" else 1.0


class LogitScaleTerm(HeadTerm):
    """g: multiplies the mode's (scale, bias); a parameter for ``scalar`` (0-dim) and ``vector`` (V,)."""

    name = "logit_scale"
    help = "the logit scale g: logit_scale_kind 'vector' for a (V,) tensor, 'scalar' for a 0-dim one"
    config_fields = ("logit_scale_kind", "logit_scale_init")
    # Its switch was called logit_scale: TRL, vLLM and transformers' Cohere read config.logit_scale as a float.
    renamed_fields = {"logit_scale": "logit_scale_kind"}  # noqa: RUF012
    row_scaled = takes_row_scales = True

    def renamed_value(self, old: str, new: str, value, current, given_as: str = "config field"):
        """``value`` given under the old name with a FutureWarning naming the new one; ``ValueError`` for a value the
        old field never took (``logit_scale=2.0``: the float multiplier of other architectures, which this head's
        settings do not read) or one contradicting ``new`` given too. ``given_as``: ``"config field"`` (config.json,
        a config's keywords) or ``"keyword argument"`` (``HeadSettings``, ``normalize_tied_head``,
        ``convert_checkpoint``), which the warning's advice follows."""
        if not (isinstance(value, str) and value in LOGIT_SCALES):
            raise ValueError(
                f"{old}={value!r}: hf_tiednorm's configs have no {old} field (TRL, vLLM and Cohere read config.{old} "
                f"as a float multiplier of the logits, which this head would not apply); the head's scale is {new}, "
                f"one of {LOGIT_SCALES}, with logit_scale_init for its value"
            )
        if current not in ("none", value):
            raise ValueError(f"{old}={value!r} (the old name of {new}) contradicts {new}={current!r}: give {new} only")
        # Attributed to the first caller outside this package (from_pretrained's, or the user's own line).
        frame, stacklevel = sys._getframe(0), 1
        while frame is not None and frame.f_globals.get("__name__", "").startswith("hf_tiednorm"):
            frame, stacklevel = frame.f_back, stacklevel + 1
        advice = {
            "config field": "Save the config again to store the new name; the old one will stop loading",
            "keyword argument": f"Write {new}={value!r}; the old keyword will stop working",
        }[given_as]
        warnings.warn(
            f"the {given_as} {old!r} is renamed {new!r} (TRL, vLLM and transformers read config.{old} as a float "
            f"multiplier of the logits); reading {old}={value!r} as {new}={value!r}. {advice} in a future release",
            FutureWarning,
            stacklevel=stacklevel,
        )
        return value

    def is_on(self, settings) -> bool:
        return settings.logit_scale_kind != "none"

    def setting(self, settings) -> str:
        return f"logit_scale_kind={settings.logit_scale_kind!r}"

    def check(self, settings) -> None:
        if settings.logit_scale_kind not in LOGIT_SCALES:
            raise ValueError(f"logit_scale_kind must be one of {LOGIT_SCALES}, got {settings.logit_scale_kind!r}")
        if settings.logit_scale_init is not None:
            if not 0 < settings.logit_scale_init < math.inf:
                raise ValueError(f"logit_scale_init must be > 0 and finite, got {settings.logit_scale_init}")
            if settings.logit_scale_kind == "none":
                raise ValueError(
                    f"logit_scale_init={settings.logit_scale_init} is set but logit_scale_kind='none'; choose a "
                    "logit_scale_kind "
                    "among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset"
                )

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

    def lossless_settings(self, settings, mode) -> dict:
        kind = settings.logit_scale_kind
        if "logit_scale" in mode.lossless_start:
            if kind not in ("none", "vector"):
                raise ValueError(
                    f"lossless_start for head_mode {settings.head_mode!r} sets a per-token logit scale "
                    f"(logit_scale_kind='vector'); logit_scale_kind={kind!r} cannot give back the source's "
                    "logits: leave logit_scale_kind unset or 'vector'"
                )
            if settings.logit_scale_init is not None:
                # The start sets every g_i (and a resize's new tokens) from the rows: an explicit initial g would be
                # dropped while config.json recorded it.
                raise ValueError(
                    f"logit_scale_init={settings.logit_scale_init} (--logit-scale-init) cannot be combined with "
                    f"lossless_start (--lossless-start): for head_mode {settings.head_mode!r} the lossless start sets "
                    "every per-token logit scale g_i itself, to the value that gives back the source's logits "
                    f"({mode.equation}), so logit_scale_init would be ignored; leave it unset, or convert without "
                    "lossless_start"
                )
            return {"logit_scale_kind": "vector"}
        if kind != "none":
            raise ValueError(
                f"lossless_start for head_mode {settings.head_mode!r} needs no logit scale ({mode.equation}; its start "
                f"sets {' and '.join(mode.lossless_start) or 'nothing'}); logit_scale_kind={kind!r} would "
                "multiply the scores: leave logit_scale_kind='none'"
            )
        return {}

    def lossless_value(self, head, rows, mode_terms: dict):
        return mode_terms.get(self.name)

    def card_row(self, config, stored, hidden_size: int) -> str:
        """The logit scale as the weights hold it: a learned scale is described by its saved values (``stored(name)``:
        their (min, max); a lossless start sets g_i = ‖w_i‖, not the configured initial value), the initial value
        only when no weights are saved."""
        kind = config.logit_scale_kind
        if kind == "none":
            return "none"
        saved = stored(self.name) if kind != "fixed" else None
        if saved is not None:
            low, high = saved
            if kind == "scalar":
                return f"one learned g (g = {low:.4g} in these weights)"
            return (
                f"a learned g_i per token (g_i in {low:.4g}–{high:.4g} in these weights; a lossless start sets "
                "g_i = ‖w_i‖ of the source)"
            )
        g = self.start_value(config, hidden_size)
        return {
            "fixed": f"fixed g = {g:.4g}",
            "scalar": f"one learned g (initialized to {g:.4g})",
            "vector": f"a learned g_i per token (initialized to {g:.4g})",
        }[kind]


class LogitBiasTerm(HeadTerm):
    """b: a learned (V,) bias added to the scores after the scale, zero at first."""

    name, help, init = "logit_bias", "the learned per-token logit bias b: logit_bias true", 0.0
    config_fields = ("logit_bias",)
    row_scaled = True

    def is_on(self, settings) -> bool:
        return settings.logit_bias

    def setting(self, settings) -> str:
        return f"logit_bias={settings.logit_bias!r}"

    def check(self, settings) -> None:
        if not isinstance(settings.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {settings.logit_bias!r}")

    def fold_into(self, head, scale, bias, rows: slice, device):
        if head.logit_bias is None:
            return scale, bias
        learned = head.logit_bias[rows].float()
        return scale, (learned if bias is None else bias + learned)

    def lossless_settings(self, settings, mode) -> dict:
        return {"logit_bias": settings.logit_bias or "logit_bias" in mode.lossless_start}

    def lossless_value(self, head, rows, mode_terms: dict):
        return mode_terms.get(self.name)

    def card_row(self, config, stored, hidden_size: int) -> str:
        if getattr(config, "logit_bias", False):
            return "a learned b_i per token, added to the scores (zero at initialization)"
        return "none"

    def bias_text(self) -> str:
        return "logit_bias=True (the learned per-token b)"


BUILTIN_TERMS: tuple[HeadTerm, ...] = (add_head_term(LogitScaleTerm()), add_head_term(LogitBiasTerm()))

__all__ = ["BUILTIN_TERMS", "LogitBiasTerm", "LogitScaleTerm", "default_logit_scale"]
