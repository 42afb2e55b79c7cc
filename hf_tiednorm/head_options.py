"""The five settings of the normalized tied head, as one value: ``HeadOptions``.

A head is built from a config (``HeadOptions.from_config``), from the converter's arguments or CLI, or directly; each
path builds one ``HeadOptions``, which checks every setting once when it is made, and passes it whole to the head
(``TiedNormHead(..., options=...)``), the wrapper's config (``as_config_fields``) and the lossless start
(``with_lossless_start``). A new head option is one field here plus its config field (configuration_tiednorm.py)
and the head code that reads it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal, get_args

from .head_modes import DEFAULT_HEAD_MODE, HeadMode, get_head_mode

# Configs annotate their logit_scale field with this type (``@strict`` checks it).
LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: tuple[str, ...] = get_args(LogitScale)


# The head's learned per-token terms, named as their config fields (logit_scale, logit_bias) and as the head's
# parameters: what the load checks, the lossless start, the converter, the export and the card read.
LEARNED_TERMS: tuple[str, ...] = ("logit_scale", "logit_bias")


@dataclass(frozen=True, kw_only=True)
class HeadOptions:
    """The head's settings, keyword-only; the config fields of the same names (``TiedNormHeadConfigMixin``) document
    them, and every check of them is here (a config validates through ``HeadOptions.from_config``).

    Attributes:
        head_mode: a registered mode (head_modes.py).
        logit_scale: ``none``, ``fixed`` (a constant g), ``scalar`` (one learned g) or ``vector`` (a learned g_i).
        logit_scale_init: g for ``fixed``, the initial g for ``scalar``/``vector``; None: 1 for a learned g, √d
            for ``fixed``.
        logit_bias: a learned per-token bias b added to the scores, zero at initialization.
        norm_eps: a row with ‖w_i‖ ≤ norm_eps is dead (scores 0, no gradient through its norm).
    """

    head_mode: str = DEFAULT_HEAD_MODE
    logit_scale: str = "none"
    logit_scale_init: float | None = None
    logit_bias: bool = False
    norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        get_head_mode(self.head_mode)  # ValueError naming the mode and the registered ones
        if self.logit_scale not in LOGIT_SCALES:
            raise ValueError(f"logit_scale must be one of {LOGIT_SCALES}, got {self.logit_scale!r}")
        if self.logit_scale_init is not None:
            if not 0 < self.logit_scale_init < math.inf:
                raise ValueError(f"logit_scale_init must be > 0 and finite, got {self.logit_scale_init}")
            if self.logit_scale == "none":
                raise ValueError(
                    f"logit_scale_init={self.logit_scale_init} is set but logit_scale='none'; choose a logit_scale "
                    "among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset"
                )
        if not isinstance(self.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {self.logit_bias!r}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @property
    def mode(self) -> HeadMode:
        """The mode object (head_modes.py): column terms, input lookups, lossless start, texts."""
        return get_head_mode(self.head_mode)

    @classmethod
    def from_config(cls, config) -> HeadOptions:
        """The options a config (any hf_tiednorm config: the fields of ``TiedNormHeadConfigMixin``) holds."""
        return cls(**{name: getattr(config, name) for name in cls.field_names()})

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(field.name for field in dataclasses.fields(cls))

    def as_config_fields(self) -> dict:
        """The config fields (``head_mode=...``, ...) of these options."""
        return dataclasses.asdict(self)

    def with_lossless_start(self) -> HeadOptions:
        """The options a lossless start of ``head_mode`` needs (its ``HeadMode.lossless_start`` terms switched on),
        or ``ValueError`` naming the option that makes it impossible (lossless_start.py)."""
        mode = self.mode
        if mode.lossless_start is None:
            raise ValueError(mode.lossless_refusal)
        logit_scale = self.logit_scale
        if "logit_scale" in mode.lossless_start:
            if logit_scale not in ("none", "vector"):
                raise ValueError(
                    f"lossless_start for head_mode {self.head_mode!r} sets a per-token logit scale "
                    f"(logit_scale='vector'); logit_scale={logit_scale!r} cannot give back the source's logits: "
                    "leave logit_scale unset or 'vector'"
                )
            if self.logit_scale_init is not None:
                # The start sets every g_i (and a resize's new tokens) from the rows: an explicit initial g would be
                # dropped while config.json recorded it.
                raise ValueError(
                    f"logit_scale_init={self.logit_scale_init} (--logit-scale-init) cannot be combined with "
                    f"lossless_start (--lossless-start): for head_mode {self.head_mode!r} the lossless start sets "
                    "every per-token logit scale g_i itself, to the value that gives back the source's logits "
                    f"({mode.equation}), so logit_scale_init would be ignored; leave it unset, or convert without "
                    "lossless_start"
                )
            logit_scale = "vector"
        elif logit_scale != "none":
            raise ValueError(
                f"lossless_start for head_mode {self.head_mode!r} needs no logit scale ({mode.equation}; its start "
                f"sets {' and '.join(mode.lossless_start) or 'nothing'}); logit_scale={logit_scale!r} would multiply "
                "the scores: leave logit_scale='none'"
            )
        logit_bias = self.logit_bias or "logit_bias" in mode.lossless_start
        return dataclasses.replace(self, logit_scale=logit_scale, logit_bias=logit_bias)


__all__ = ["LEARNED_TERMS", "LOGIT_SCALES", "HeadOptions", "LogitScale"]
