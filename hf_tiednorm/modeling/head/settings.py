"""The head's settings as one value, ``HeadSettings``, checked once when made, and the registries of head modes and
learned terms, by name: what a configuration checks without torch."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import InitVar, dataclass, field
from typing import Literal, get_args

LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: tuple[str, ...] = get_args(LogitScale)
BUILTIN_HEAD_MODES = ("baseline", "l2", "square", "distance", "cosine")  # one meaning in every process
DEFAULT_HEAD_MODE = "baseline"  # plain tying: a converted model keeps its function
# name -> HeadMode and name -> HeadTerm, filled by the modeling code and hf_tiednorm.register_head_mode / _term.
HEAD_MODE_REGISTRY: dict[str, object] = {}
HEAD_TERMS: dict[str, object] = {}
# Old name -> new name (TRL, vLLM and Cohere read config.logit_scale as a float multiplier of the logits).
RENAMED_FIELDS = {"logit_scale": "logit_scale_kind"}


def head_mode_names() -> tuple[str, ...]:
    """The head modes this process knows, built-in and registered."""
    return tuple(dict.fromkeys((*BUILTIN_HEAD_MODES, *HEAD_MODE_REGISTRY)))


def check_head_mode(name) -> None:
    """``ValueError`` naming ``name`` and the modes this process knows, unless it is one of them."""
    if not isinstance(name, str) or name not in head_mode_names():
        raise ValueError(f"head_mode must be one of {head_mode_names()}, the modes this code defines; got {name!r}. A "
                         "model with a mode registered at runtime (register_head_mode) loads and saves only where it "
                         "is registered: register it")


def renamed_value(old: str, value, current, given_as: str, stacklevel: int):
    """``value`` given under a renamed field's old name (a FutureWarning ``stacklevel`` frames up, as a ``given_as``);
    ``ValueError`` for a value it never took (a float multiplier) or one contradicting the new field's ``current``."""
    new = RENAMED_FIELDS[old]
    if not (isinstance(value, str) and value in LOGIT_SCALES):
        raise ValueError(f"{old}={value!r}: hf_tiednorm's configs have no {old} field (TRL, vLLM and Cohere read "
                         f"config.{old} as a float multiplier of the logits, which this head would not apply); the "
                         f"head's scale is {new}, one of {LOGIT_SCALES}, with logit_scale_init for its value")
    if current not in ("none", value):
        raise ValueError(f"{old}={value!r} (the old name of {new}) contradicts {new}={current!r}: give {new} only")
    advice = f"Write {new}={value!r}" if given_as == "keyword argument" else "Save the config again to store it"
    warnings.warn(
        f"the {given_as} {old!r} is renamed {new!r} (TRL, vLLM and transformers read config.{old} as a float "
        f"multiplier of the logits); reading {old}={value!r} as {new}={value!r}. {advice}: the old name will stop "
        "working in a future release",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )
    return value


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    """The head's settings as the config fields of the same names (``TiedNormHeadConfigMixin``) describe them;
    ``extra_terms``: registered head terms it learns too."""

    head_mode: str = DEFAULT_HEAD_MODE
    logit_scale_kind: str = "none"
    logit_scale_init: float | None = None
    logit_bias: bool = False
    norm_eps: float = 1e-6
    extra_terms: tuple[str, ...] = field(default=(), metadata={"registry": True})  # no config field of the package's
    logit_scale: InitVar[str | None] = None  # logit_scale_kind's old name (a FutureWarning)

    def __post_init__(self, logit_scale: str | None = None) -> None:
        if logit_scale is not None:
            value = renamed_value("logit_scale", logit_scale, self.logit_scale_kind, "keyword argument", 3)
            object.__setattr__(self, "logit_scale_kind", value)
        extra = self.extra_terms
        if isinstance(extra, str) or not isinstance(extra, (tuple, list)) or not all(isinstance(n, str) for n in extra):
            raise ValueError(
                f"extra_terms must be a tuple of registered head term names, got {type(extra).__name__} {extra!r}"
                + (f"; write extra_terms=({extra!r},)" if isinstance(extra, str) else "")
            )
        if len(set(extra)) != len(extra):
            raise ValueError(f"extra_terms names a head term twice: {list(extra)}")
        object.__setattr__(self, "extra_terms", tuple(extra))  # a config.json's list, as the hashable tuple
        switched = sorted(name for name, term in HEAD_TERMS.items() if not term.config_fields)
        unknown = [name for name in self.extra_terms if name not in switched]
        if unknown:
            raise ValueError(f"head term(s) {unknown} are not registered in this process (registered: {switched}): the "
                             "model was trained with a head term registered at runtime (register_head_term); register "
                             "it before loading")
        check_head_mode(self.head_mode)
        if self.logit_scale_kind not in LOGIT_SCALES:
            raise ValueError(f"logit_scale_kind must be one of {LOGIT_SCALES}, got {self.logit_scale_kind!r}")
        if self.logit_scale_init is not None and not 0 < self.logit_scale_init < math.inf:
            raise ValueError(f"logit_scale_init must be > 0 and finite, got {self.logit_scale_init}")
        if self.logit_scale_init is not None and self.logit_scale_kind == "none":
            raise ValueError(f"logit_scale_init={self.logit_scale_init} is set but logit_scale_kind='none'; choose a "
                             "logit_scale_kind among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset")
        if not isinstance(self.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {self.logit_bias!r}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @classmethod
    def from_config(cls, config) -> HeadSettings:
        """The settings a config (any hf_tiednorm config) holds."""
        extra = getattr(config, "extra_terms", None)
        fields = {name: getattr(config, name) for name in cls.field_names()}
        return cls(**fields, extra_terms=() if extra is None else extra)  # a string is refused, not split

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The settings that are the package's config fields."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("registry"))

    def as_config_fields(self) -> dict:
        """These settings as config fields; ``extra_terms`` only when one is on."""
        fields = dataclasses.asdict(self)
        if not self.extra_terms:
            del fields["extra_terms"]
        return fields


__all__ = [
    "BUILTIN_HEAD_MODES", "DEFAULT_HEAD_MODE", "HEAD_MODE_REGISTRY", "HEAD_TERMS", "LOGIT_SCALES", "RENAMED_FIELDS",
    "HeadSettings", "LogitScale", "check_head_mode", "head_mode_names", "renamed_value",
]  # fmt: skip
