"""The five settings of the normalized tied head, as one value: ``HeadSettings``.

A head is built from a config (``HeadSettings.from_config``), from the converter's arguments or CLI, or directly; each
path builds one ``HeadSettings``, which checks every setting once when it is made, and passes it whole to the head
(``TiedNormHead(..., settings=...)``), the wrapper's config (``as_config_fields``) and the lossless start
(``with_lossless_start``). The head's learned terms (its logit scale g and bias b, and any added from outside) are
``HeadTerm`` objects in one registry (``HEAD_TERMS``; the built-ins in terms.py): a new term is a
``HeadTerm`` registered with ``register_head_term`` and nothing else.
"""

from __future__ import annotations

import dataclasses
import keyword
import math
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from typing import Literal, get_args

import torch

from .modes import DEFAULT_HEAD_MODE, HeadMode, get_head_mode

# Configs annotate their logit_scale_kind field with this type (``@strict`` checks it).
LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: tuple[str, ...] = get_args(LogitScale)


def renamed_config_fields() -> dict[str, tuple[str, HeadTerm]]:
    """Config fields renamed since models were saved with them: old name -> (new name, the term that owns it), from
    each term's ``renamed_fields``. config.json and keyword arguments under the old name still load, with a
    FutureWarning (``HeadTerm.renamed_value``)."""
    return {old: (new, term) for term in head_terms() for old, new in term.renamed_fields.items()}


def renamed_fields_set(config, kwargs: dict) -> dict:
    """Set on ``config`` each field that ``kwargs`` (a config's extra keywords: config.json, from_pretrained) gives
    under its old name (``renamed_config_fields``, with a FutureWarning); returns the other keywords."""
    for old, (new, term) in renamed_config_fields().items():
        if old in kwargs:
            kwargs = dict(kwargs)
            setattr(config, new, term.renamed_value(old, new, kwargs.pop(old), getattr(config, new)))
    return kwargs


class HeadTerm:
    """A learned term of the head, folded into its (scale, bias): the one protocol of the built-in terms (the logit
    scale g and bias b, terms.py) and of a term added from outside (``ExtraHeadTerm``). The head, the fold, a
    resize, fp32 handling, a lossless start, the load checks, the flags, the export and the card ask a term only
    these; none of them names one. Defaults are those of a per-token (V,) term switched on by ``extra_terms``.

    Attributes:
        name: the head's parameter (``lm_head.<name>``, a state-dict key), a Python identifier.
        help: the help of its flag (converter, training scripts).
        config_fields: the ``HeadSettings``/config fields that set it (their flags are the term's flags); () for a
            term switched on by naming it in ``extra_terms`` (its flag is the switch ``--<name>``).
        keep_fp32: kept fp32 under a bf16/fp16 load or cast (a step of a small learning rate rounds away in bf16).
        row_scaled: multiplied by c_i where a source's output rows were c_i·w_i (``take_row_scales``), because it
            multiplies or shifts the whole logit (g and b).
        takes_row_scales: a lossless start that sets it can absorb those c_i (a per-token scale of the logit).
    """

    name: str
    help: str
    config_fields: tuple[str, ...] = ()
    renamed_fields: dict[str, str] = {}  # noqa: RUF012 (read only) old config field name -> its new name
    keep_fp32: bool = True
    row_scaled: bool = False
    takes_row_scales: bool = False

    def renamed_value(self, old: str, new: str, value, current, given_as: str = "config field"):
        """The value of config field ``new`` given under its old name ``old`` (``renamed_fields``) as a
        ``given_as`` (``"config field"``, ``"keyword argument"``), with a FutureWarning, or ``ValueError``; a term
        that renamed a field says what the old name may hold."""
        raise ValueError(f"{old}={value!r}: the config field {old} is now {new}")

    def is_on(self, settings) -> bool:
        """Whether a head with ``settings`` holds (or applies) this term."""
        return self.name in settings.extra_terms

    def setting(self, settings) -> str:
        """The config setting that switches it, as config.json states it (load checks' messages)."""
        return f"extra_terms={list(settings.extra_terms)!r}"

    def check(self, settings) -> None:
        """``ValueError`` naming the field for a bad setting of ``settings`` (a ``HeadSettings`` being made)."""

    def start_value(self, settings, hidden_size: int) -> float:
        """The value the parameter starts at (and a resized vocabulary's new tokens get)."""
        return float(self.init)

    def shape(self, settings, vocab_size: int) -> tuple[int, ...] | None:
        """The parameter's shape for ``settings``; None: the head holds no parameter for it."""
        return (vocab_size,) if self.is_on(settings) else None

    def fold_into(self, head, scale, bias, rows: slice, device):
        """(scale, bias) of the tokens ``rows`` (a slice with both ends; fp32, (n,) or None) with this term folded
        in; ``device``: the head's."""
        return self.fold(getattr(head, self.name)[rows].float(), scale, bias)

    def lossless_settings(self, settings, mode) -> dict:
        """The ``HeadSettings`` fields a lossless start of ``mode`` sets for this term, or ``ValueError`` naming the
        setting that makes the start impossible."""
        return {}

    def lossless_value(self, head, rows, mode_terms: dict):
        """The value a lossless start gives this term for the rows ``rows`` (``mode_terms``: the mode's
        ``lossless_terms`` by name); None: left as it is (then checked to change no score)."""
        value = getattr(self, "lossless", None)
        return None if value is None else torch.full((rows.shape[0],), float(value), device=rows.device)

    def card_row(self, config, stored, hidden_size: int) -> str | None:
        """The model card's text for it (``stored(name)``: the (min, max) of a saved tensor, or None); None where
        ``config`` does not switch it on."""
        return self.card if self.is_on(HeadSettings.from_config(config)) else None

    def bias_text(self) -> str:
        """What a plain export's refusal of a bias says this term is."""
        return f"the registered head term {self.name!r}"


@dataclass(frozen=True)
class ExtraHeadTerm(HeadTerm):
    """A head term added from outside the package (``register_head_term``): a learned per-token term t (V,),
    a parameter of the head named ``name``, started at ``init`` and folded into the column terms by ``fold(t, scale,
    bias) -> (scale, bias)`` (so the plain export bakes it like g and b). A model switches it on with
    ``HeadSettings(extra_terms=(name,))``; its config records the names (``extra_terms``), and a process where the
    option is not registered refuses the model by name, as it refuses an unknown head mode. ``lossless``: the value
    a lossless start sets it to (None: left at ``init``); ``keep_fp32``: kept fp32 under a bf16/fp16 load."""

    name: str
    help: str
    init: float
    fold: Callable
    card: str  # the model card's line for it
    keep_fp32: bool = True
    lossless: float | None = None


# Every head term, in the order they fold: the built-ins first (terms.py registers them at import), then those
# registered from outside (``register_head_term``).
HEAD_TERMS: dict[str, HeadTerm] = {}


def head_terms() -> tuple[HeadTerm, ...]:
    """Every registered head term, built-in and added, in folding order."""
    return tuple(HEAD_TERMS.values())


def add_head_term(term: HeadTerm) -> HeadTerm:
    """Put ``term`` in the registry (a built-in's way in, at import; ``register_head_term`` checks more)."""
    if term.name in HEAD_TERMS:
        raise ValueError(f"a head term {term.name!r} is registered already")
    HEAD_TERMS[term.name] = term
    return term


def takes_row_scales(mode) -> bool:
    """Whether ``mode``'s lossless start sets a term that can absorb a source's output row scales c_i (a per-token
    scale of the logit, ``HeadTerm.takes_row_scales``): an untied source with rows c_i·w_i converts losslessly."""
    return any(HEAD_TERMS[name].takes_row_scales for name in mode.lossless_start or () if name in HEAD_TERMS)


def switched_terms() -> tuple[str, ...]:
    """The names of the terms a model switches on by naming them in ``extra_terms``."""
    return tuple(term.name for term in HEAD_TERMS.values() if not term.config_fields)


def register_head_term(term: ExtraHeadTerm) -> ExtraHeadTerm:
    """Make ``term`` available to every head, config, converter flag (``--<name>``), export and card.

    Its name becomes a parameter of the head (``lm_head.<name>``), a key of the state dict and a converter flag, so
    it must be a Python identifier (no dash, dot or empty name) not starting with ``_``, and must not shadow
    anything the head already holds (``HEAD_NAME_SOURCES``: ``norm_eps``, ``weight``, ``settings``, ...): a
    parameter set over ``norm_eps`` changed the logits by 1.77 at its neutral init, with no error.
    """
    if not isinstance(term, HeadTerm):
        raise TypeError(f"register_head_term takes an ExtraHeadTerm (a HeadTerm), got {type(term).__name__}")
    name = term.name
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(
            f"head term name {name!r} (register_head_term) must be a Python identifier not starting with '_' "
            "(letters, digits and underscores: it becomes the head's parameter lm_head.<name> and the converter's "
            "flag --<name with dashes>), e.g. 'logit_temperature'"
        )
    if name in HEAD_TERMS:
        raise ValueError(f"a head term {name!r} is registered already")
    if term.config_fields:  # HeadSettings and the configs declare the built-ins' fields only
        raise ValueError(
            f"head term {name!r} (register_head_term) declares config_fields {term.config_fields}, which no "
            "config has: a term added from outside is switched on by naming it in extra_terms; leave config_fields ()"
        )
    if name in taken_head_names():
        raise ValueError(
            f"head term name {name!r} (register_head_term) is taken by the head itself (an attribute, method "
            "or setting of TiedNormHead): its parameter would replace it; register the term under another name"
        )
    return add_head_term(term)


# Callables giving every name a head holds (its attributes, methods and parameters): head/layer.py adds
# TiedNormHead's where it defines the head, which imports this module (so this module cannot import it).
HEAD_NAME_SOURCES: list[Callable[[], Iterable[str]]] = []


def taken_head_names() -> frozenset[str]:
    """What a registered term's parameter must not replace: every name the head holds (``HEAD_NAME_SOURCES``) and
    every ``HeadSettings`` field, the renamed ones' old names included."""
    if not HEAD_NAME_SOURCES:
        raise RuntimeError("no head has declared its names (head/layer.py is not loaded): cannot check a name")
    fields = {f.name for f in dataclasses.fields(HeadSettings)} | set(renamed_config_fields())
    return frozenset(fields.union(*(source() for source in HEAD_NAME_SOURCES)))


def learned_terms() -> tuple[str, ...]:
    """Every learned term a head may hold, named as its parameter (state-dict keys such as 'lm_head.<name>')."""
    return tuple(HEAD_TERMS)


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    """The head's settings, keyword-only; the config fields of the same names (``TiedNormHeadConfigMixin``) document
    them, and every check of them is here (a config validates through ``HeadSettings.from_config``).

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
    # Registered head terms (``register_head_term``) that are on; not a config field of the package's own.
    extra_terms: tuple[str, ...] = field(default=(), metadata={"registry": True})
    # The old name of logit_scale_kind (renamed_config_fields), a keyword only: HeadSettings(logit_scale="vector"),
    # as scripts written before the rename pass it (normalize_tied_head, convert_checkpoint), sets logit_scale_kind
    # with a FutureWarning naming the new name.
    logit_scale: InitVar[str | None] = None

    def __post_init__(self, logit_scale: str | None = None) -> None:
        if logit_scale is not None:  # the old keyword: its term checks the value and warns
            new, term = renamed_config_fields()["logit_scale"]
            value = term.renamed_value("logit_scale", new, logit_scale, getattr(self, new), "keyword argument")
            object.__setattr__(self, new, value)
        extra = self.extra_terms
        if isinstance(extra, str) or not isinstance(extra, (tuple, list)) or not all(isinstance(n, str) for n in extra):
            raise ValueError(
                f"extra_terms must be a tuple of registered head term names, got {type(extra).__name__} {extra!r}"
                + (f"; write extra_terms=({extra!r},)" if isinstance(extra, str) else "")
            )
        if len(set(extra)) != len(extra):
            raise ValueError(f"extra_terms names a head term twice: {list(extra)}")
        object.__setattr__(self, "extra_terms", tuple(extra))  # a config.json's list, as the hashable tuple
        switched = switched_terms()
        unknown = [name for name in self.extra_terms if name not in switched]
        if unknown:
            raise ValueError(
                f"head term(s) {unknown} are not registered in this process (registered: {sorted(switched)}): "
                "the model was trained with a head term registered at runtime (register_head_term); register it "
                "before loading"
            )
        get_head_mode(self.head_mode)  # ValueError naming the mode and the registered ones
        for term in head_terms():  # each term checks its own fields (terms.py)
            term.check(self)
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @property
    def mode(self) -> HeadMode:
        """The mode object (head/modes.py): column terms, input lookups, lossless start, texts."""
        return get_head_mode(self.head_mode)

    @classmethod
    def from_config(cls, config) -> HeadSettings:
        """The settings a config (any hf_tiednorm config: the fields of ``TiedNormHeadConfigMixin``) holds."""
        extra = getattr(config, "extra_terms", None)
        fields = {name: getattr(config, name) for name in cls.field_names()}
        return cls(**fields, extra_terms=() if extra is None else extra)  # a string is refused, not split

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The settings that are config fields of the package (``TiedNormHeadConfigMixin``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("registry"))

    def active_terms(self) -> tuple[HeadTerm, ...]:
        """The head terms these settings switch on, in the order they fold: the built-ins' (set by their config
        fields) in registry order, then ``extra_terms`` in their order."""
        built_in = (term for term in head_terms() if term.config_fields and term.is_on(self))
        return (*built_in, *map(HEAD_TERMS.get, self.extra_terms))

    def term_switches(self) -> dict:
        """Each built-in term's switch (its first config field) and its value: {"logit_scale_kind": ..., ...}."""
        switches = [term.config_fields[0] for term in head_terms() if term.config_fields]
        return {name: getattr(self, name) for name in switches}

    def term_settings(self) -> str:
        """The terms' settings as config.json states them (a head's repr): "logit_scale_kind='none', ..."."""
        settings = (term.setting(self) for term in head_terms() if term.config_fields or term.is_on(self))
        return ", ".join(dict.fromkeys(settings))

    def as_config_fields(self) -> dict:
        """The config fields (``head_mode=...``, ...) of these settings; ``extra_terms`` only when one is on."""
        fields = dataclasses.asdict(self)
        if not self.extra_terms:
            del fields["extra_terms"]
        return fields

    def with_lossless_start(self) -> HeadSettings:
        """The settings a lossless start of ``head_mode`` needs (its ``HeadMode.lossless_start`` terms switched on),
        or ``ValueError`` naming the option that makes it impossible (head/lossless_start.py)."""
        mode = self.mode
        if mode.lossless_start is None:
            raise ValueError(mode.lossless_refusal)
        changes = {}
        for term in head_terms():
            changes.update(term.lossless_settings(self, mode))
        return dataclasses.replace(self, **changes)


__all__ = [
    "HEAD_TERMS", "LOGIT_SCALES", "ExtraHeadTerm", "HeadTerm", "renamed_config_fields",
    "HEAD_NAME_SOURCES", "HeadSettings", "LogitScale", "add_head_term", "head_terms", "learned_terms",
    "register_head_term", "switched_terms", "takes_row_scales", "taken_head_names", "renamed_fields_set",
]  # fmt: skip
