"""The five settings of the normalized tied head, as one value: ``HeadOptions``.

A head is built from a config (``HeadOptions.from_config``), from the converter's arguments or CLI, or directly; each
path builds one ``HeadOptions``, which checks every setting once when it is made, and passes it whole to the head
(``TiedNormHead(..., options=...)``), the wrapper's config (``as_config_fields``) and the lossless start
(``with_lossless_start``). A new head option is one field here plus its config field (configuration_tiednorm.py)
and the head code that reads it.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from .modes import DEFAULT_HEAD_MODE, HeadMode, get_head_mode

# Configs annotate their logit_scale_kind field with this type (``@strict`` checks it).
LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: tuple[str, ...] = get_args(LogitScale)


# The head's learned per-token terms, named as the head's parameters (state-dict keys such as
# 'lm_head.logit_scale'): what the load checks, the lossless start, the converter, the export and the card read.
LEARNED_TERMS: tuple[str, ...] = ("logit_scale", "logit_bias")
# The config field that switches each learned term on. The scale's is not called ``logit_scale``: TRL, vLLM and
# transformers' Cohere models read ``config.logit_scale`` as a float multiplier of the logits.
TERM_CONFIG_FIELDS: dict[str, str] = {"logit_scale": "logit_scale_kind", "logit_bias": "logit_bias"}
# Config fields renamed since models were saved with them (old name -> new name): config.json and keyword arguments
# under the old name still load, with a FutureWarning (configuration_tiednorm.py).
RENAMED_CONFIG_FIELDS: dict[str, str] = {"logit_scale": "logit_scale_kind"}


def renamed_field_value(old: str, new: str, value, current):
    """The value of field ``new`` given under its old name ``old`` (a config saved before the rename), with a
    FutureWarning; ``ValueError`` for a value the old field never took (``logit_scale=2.0``: the float multiplier of
    other architectures, which this head's options do not read) or one contradicting ``new`` given too."""
    if not (isinstance(value, str) and value in LOGIT_SCALES):
        raise ValueError(
            f"{old}={value!r}: hf_tiednorm's configs have no {old} field (TRL, vLLM and Cohere read config.{old} as "
            f"a float multiplier of the logits, which this head would not apply); the head's scale is {new}, one of "
            f"{LOGIT_SCALES}, with logit_scale_init for its value"
        )
    if current not in ("none", value):
        raise ValueError(f"{old}={value!r} (the old name of {new}) contradicts {new}={current!r}: give {new} only")
    # Attributed to the first caller outside this package (from_pretrained's, or the user's own line).
    frame, stacklevel = sys._getframe(0), 1
    while frame is not None and frame.f_globals.get("__name__", "").startswith("hf_tiednorm"):
        frame, stacklevel = frame.f_back, stacklevel + 1
    warnings.warn(
        f"the config field {old!r} is renamed {new!r} (TRL, vLLM and transformers read config.{old} as a float "
        f"multiplier of the logits); loading {old}={value!r} as {new}={value!r}. Save the config again to store "
        f"the new name; the old one will stop loading in a future release",
        FutureWarning,
        stacklevel=stacklevel,
    )
    return value


def renamed_fields_set(config, kwargs: dict) -> dict:
    """Set on ``config`` each field that ``kwargs`` (a config's extra keywords: config.json, from_pretrained) gives
    under its old name (``RENAMED_CONFIG_FIELDS``, with a FutureWarning); returns the other keywords."""
    for old, new in RENAMED_CONFIG_FIELDS.items():
        if old in kwargs:
            kwargs = dict(kwargs)
            setattr(config, new, renamed_field_value(old, new, kwargs.pop(old), getattr(config, new)))
    return kwargs


@dataclass(frozen=True)
class HeadOption:
    """A head option added from outside the package (``register_head_option``): a learned per-token term t (V,),
    a parameter of the head named ``name``, started at ``init`` and folded into the column terms by ``fold(t, scale,
    bias) -> (scale, bias)`` (so the plain export bakes it like g and b). A model switches it on with
    ``HeadOptions(extra_terms=(name,))``; its config records the names (``extra_terms``), and a process where the
    option is not registered refuses the model by name, as it refuses an unknown head mode."""

    name: str
    help: str
    init: float
    fold: Callable
    card: str  # the model card's line for it


HEAD_OPTIONS: dict[str, HeadOption] = {}


def register_head_option(option: HeadOption) -> HeadOption:
    """Make ``option`` available to every head, config, converter flag (``--<name>``), export and card.

    Its name becomes a parameter of the head (``lm_head.<name>``), a key of the state dict and a converter flag, so
    it must be a Python identifier (no dash, dot or empty name) not starting with ``_``, and must not shadow
    anything the head already holds (``HEAD_NAME_SOURCES``: ``norm_eps``, ``weight``, ``options``, ...): a
    parameter set over ``norm_eps`` changed the logits by 1.77 at its neutral init, with no error.
    """
    if not isinstance(option, HeadOption):
        raise TypeError(f"register_head_option takes a HeadOption, got {type(option).__name__}")
    name = option.name
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(
            f"head option name {name!r} (register_head_option) must be a Python identifier not starting with '_' "
            "(letters, digits and underscores: it becomes the head's parameter lm_head.<name> and the converter's "
            "flag --<name with dashes>), e.g. 'logit_temperature'"
        )
    if name in HEAD_OPTIONS or name in LEARNED_TERMS:
        raise ValueError(f"a head option {name!r} is registered already")
    if name in taken_head_names():
        raise ValueError(
            f"head option name {name!r} (register_head_option) is taken by the head itself (an attribute, method "
            "or setting of TiedNormHead): its parameter would replace it; register the option under another name"
        )
    HEAD_OPTIONS[name] = option
    return option


# Callables giving every name a head holds (its attributes, methods and parameters): head/layer.py adds
# TiedNormHead's where it defines the head, which imports this module (so this module cannot import it).
HEAD_NAME_SOURCES: list[Callable[[], Iterable[str]]] = []


def taken_head_names() -> frozenset[str]:
    """What a registered option's parameter must not replace: every name the head holds (``HEAD_NAME_SOURCES``) and
    every ``HeadOptions`` field, the renamed ones' old names included."""
    if not HEAD_NAME_SOURCES:
        raise RuntimeError("no head has declared its names (head/layer.py is not loaded): cannot check a name")
    fields = {f.name for f in dataclasses.fields(HeadOptions)} | set(RENAMED_CONFIG_FIELDS)
    return frozenset(fields.union(*(source() for source in HEAD_NAME_SOURCES)))


def learned_terms() -> tuple[str, ...]:
    """Every learned per-token term a head may hold: ``LEARNED_TERMS`` and the registered options'."""
    return (*LEARNED_TERMS, *HEAD_OPTIONS)


@dataclass(frozen=True, kw_only=True)
class HeadOptions:
    """The head's settings, keyword-only; the config fields of the same names (``TiedNormHeadConfigMixin``) document
    them, and every check of them is here (a config validates through ``HeadOptions.from_config``).

    Attributes:
        head_mode: a registered mode (head/modes.py).
        logit_scale_kind: ``none``, ``fixed`` (a constant g), ``scalar`` (one learned g) or ``vector`` (a learned
            g_i, the head's ``logit_scale`` parameter).
        logit_scale_init: g for ``fixed``, the initial g for ``scalar``/``vector``; None: 1 for a learned g, √d
            for ``fixed``.
        logit_bias: a learned per-token bias b added to the scores, zero at initialization.
        norm_eps: a row with ‖w_i‖ ≤ norm_eps is dead (scores 0, no gradient through its norm).
    """

    head_mode: str = DEFAULT_HEAD_MODE
    logit_scale_kind: str = "none"
    logit_scale_init: float | None = None
    logit_bias: bool = False
    norm_eps: float = 1e-6
    # Registered head options (``register_head_option``) that are on; not a config field of the package's own.
    extra_terms: tuple[str, ...] = field(default=(), metadata={"registry": True})

    def __post_init__(self) -> None:
        extra = self.extra_terms
        if isinstance(extra, str) or not isinstance(extra, (tuple, list)) or not all(isinstance(n, str) for n in extra):
            raise ValueError(
                f"extra_terms must be a tuple of registered head option names, got {type(extra).__name__} {extra!r}"
                + (f"; write extra_terms=({extra!r},)" if isinstance(extra, str) else "")
            )
        if len(set(extra)) != len(extra):
            raise ValueError(f"extra_terms names a head option twice: {list(extra)}")
        object.__setattr__(self, "extra_terms", tuple(extra))  # a config.json's list, as the hashable tuple
        unknown = [name for name in self.extra_terms if name not in HEAD_OPTIONS]
        if unknown:
            raise ValueError(
                f"head option(s) {unknown} are not registered in this process (registered: {sorted(HEAD_OPTIONS)}): "
                "the model was trained with a head option registered at runtime (register_head_option); register it "
                "before loading"
            )
        get_head_mode(self.head_mode)  # ValueError naming the mode and the registered ones
        if self.logit_scale_kind not in LOGIT_SCALES:
            raise ValueError(f"logit_scale_kind must be one of {LOGIT_SCALES}, got {self.logit_scale_kind!r}")
        if self.logit_scale_init is not None:
            if not 0 < self.logit_scale_init < math.inf:
                raise ValueError(f"logit_scale_init must be > 0 and finite, got {self.logit_scale_init}")
            if self.logit_scale_kind == "none":
                raise ValueError(
                    f"logit_scale_init={self.logit_scale_init} is set but logit_scale_kind='none'; choose a "
                    "logit_scale_kind "
                    "among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset"
                )
        if not isinstance(self.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {self.logit_bias!r}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @property
    def mode(self) -> HeadMode:
        """The mode object (head/modes.py): column terms, input lookups, lossless start, texts."""
        return get_head_mode(self.head_mode)

    @classmethod
    def from_config(cls, config) -> HeadOptions:
        """The options a config (any hf_tiednorm config: the fields of ``TiedNormHeadConfigMixin``) holds."""
        extra = getattr(config, "extra_terms", None)
        fields = {name: getattr(config, name) for name in cls.field_names()}
        return cls(**fields, extra_terms=() if extra is None else extra)  # a string is refused, not split

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The options that are config fields of the package (``TiedNormHeadConfigMixin``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("registry"))

    def as_config_fields(self) -> dict:
        """The config fields (``head_mode=...``, ...) of these options; ``extra_terms`` only when one is on."""
        fields = dataclasses.asdict(self)
        if not self.extra_terms:
            del fields["extra_terms"]
        return fields

    def with_lossless_start(self) -> HeadOptions:
        """The options a lossless start of ``head_mode`` needs (its ``HeadMode.lossless_start`` terms switched on),
        or ``ValueError`` naming the option that makes it impossible (head/lossless_start.py)."""
        mode = self.mode
        if mode.lossless_start is None:
            raise ValueError(mode.lossless_refusal)
        logit_scale = self.logit_scale_kind
        if "logit_scale" in mode.lossless_start:
            if logit_scale not in ("none", "vector"):
                raise ValueError(
                    f"lossless_start for head_mode {self.head_mode!r} sets a per-token logit scale "
                    f"(logit_scale_kind='vector'); logit_scale_kind={logit_scale!r} cannot give back the source's "
                    "logits: leave logit_scale_kind unset or 'vector'"
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
                f"sets {' and '.join(mode.lossless_start) or 'nothing'}); logit_scale_kind={logit_scale!r} would "
                "multiply the scores: leave logit_scale_kind='none'"
            )
        logit_bias = self.logit_bias or "logit_bias" in mode.lossless_start
        return dataclasses.replace(self, logit_scale_kind=logit_scale, logit_bias=logit_bias)


__all__ = [
    "HEAD_OPTIONS", "LEARNED_TERMS", "LOGIT_SCALES", "RENAMED_CONFIG_FIELDS", "TERM_CONFIG_FIELDS", "HeadOption",
    "HEAD_NAME_SOURCES", "HeadOptions", "LogitScale", "learned_terms", "register_head_option", "taken_head_names",
    "renamed_field_value", "renamed_fields_set",
]  # fmt: skip
