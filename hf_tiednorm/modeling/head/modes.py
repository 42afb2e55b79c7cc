"""The head modes: one small object per mode, holding everything that mode *is*, and the registry that holds them.

With weight tying (Press & Wolf, 2017) the output layer reuses the input embedding matrix W (rows w_i) and scores
token i as s_i = w_i·h. Liu, Zhai & Chen ("Normalization of Input-output Shared Embeddings in Text Generation
Models", 2020) show that this score is biased by the row norm ‖w_i‖ and propose the normalized modes below. Every
mode is an affine map of the plain scores W·h along the vocabulary axis, ``s = (W·h) * scale + bias`` with
vocabulary-sized vectors derived from the rows (``HeadMode.column_terms``): one matmul plus O(V) work per decoding
step, a chunked loss that reuses the vectors, and no normalized copy of W.

A mode object answers every question the rest of the package asks about a mode, so that no other module compares
a mode's name:

* ``column_terms(weight, eps)``: the (scale, bias) of its score;
* ``normalizes_input_lookups``: whether the input embedding looks up unit rows ŵ_i too (l2), which changes every
  layer's input (no lossless start, no weight-norm technique, and a plain export ships the unit rows at the input);
* ``keeps_row_norms``: whether row norms still mean something anywhere in the model (the weight-norm
  initialization and regularization act on them);
* ``equation``, ``paper``, ``summary``: the text of the config help, the CLI help, the model card and the docs;
* ``lossless_start`` / ``lossless_terms(weight, eps)``: which learned per-token terms (``"logit_scale"``,
  ``"logit_bias"``) give back a source's plain logits exactly when a tied checkpoint is converted, and their values;
  ``None`` where no such start exists (``lossless_refusal`` says why);
* ``plain_input_weight(weight, eps)``: what a plain ``nn.Embedding`` must hold to look up what this mode looks up;
  with the head's effective column terms (``TiedNormHead.column_terms()``, the logit scale g and bias b folded in)
  that is all a plain export needs: output weight ``diag(scale)·W``, output bias ``bias``.

``register_head_mode`` adds a mode (a test, a user's own variant). The registry lives in the model layer and travels
with a saved model as remote code: a folder whose config names a mode that its code files do not define is refused
by name when it is loaded (``get_head_mode``). A saved config records the mode's *name* only, so a name must mean one
mode everywhere: the built-in names (``BUILTIN_HEAD_MODES``) can be neither redefined nor unregistered (a model
trained with a redefined ``cosine`` reloaded in a fresh process as the built-in one, its logits 7.9 off, no error).
For the same reason a name that a live model scores with is not given another definition in its process: every head
is recorded, by weak reference, as it is built (``hold_head_mode``), and ``register_head_mode`` refuses a definition
other than the one a live head holds (issue 58: ``replace=True`` while a model built with ``"m"`` lived left that
model on the old definition while its saved folder reloaded in the same process with the new one, logits × 0.5, no
warning). Once the model is gone (``del model``) the name may be redefined; a model keeps its mode through a
``copy.deepcopy`` (TRL's reference model), since a mode copies as itself.

What a mode returns is checked, not trusted, wherever it is called: ``HeadMode`` wraps every ``column_terms`` and
``lossless_terms`` a subclass defines with the checks of ``head/mode_checks.py`` (the terms' type, shape, dtype and
device; a declared lossless start verified on the weights), and ``register_head_mode`` runs them on a small probe.
"""

from __future__ import annotations

import functools
import gc
import weakref
from collections.abc import Callable, Iterator, Sequence

import torch

from .folded_weight import squared_row_norms
from .mode_checks import (
    MODE_LOSSLESS_TERMS,
    ColumnTerms,
    checked_column_terms,
    checked_lossless_terms,
    probe_head_mode,
)

LIU_ET_AL = "Liu, Zhai & Chen (2020)"


def inverse_row_norms(weight: torch.Tensor, eps: float, power: float = 1) -> torch.Tensor:
    """1/‖w_i‖^power of every row of ``weight`` (..., d), in fp32, shape (...,); 0 for a dead row (‖w_i‖ ≤ eps).

    The 0 instead of 1/eps makes a dead row (the zero padding row) score 0 and receive no gradient through its
    norm: the direction of a zero vector is undefined and its gradient grows as 1/‖w‖, so a floored norm made the
    padding row's gradient dominate the whole model's.
    """
    # From ‖w_i‖² directly (no sqrt, whose gradient is infinite at a zero row): (‖w‖²)^(-power/2), floored at eps².
    squared = squared_row_norms(weight).float()
    inverse = squared.clamp_min(eps * eps).pow(-0.5 * power)
    return torch.where(squared > eps * eps, inverse, torch.zeros_like(inverse))


def unit_rows(rows: torch.Tensor, eps: float) -> torch.Tensor:
    """ŵ = w/‖w‖ for each row of ``rows`` (..., d), in the dtype of ``rows``; 0 for a dead row.

    Scaled in fp32 so that fp16 rows cannot overflow on the way.
    """
    return (rows.float() * inverse_row_norms(rows, eps).unsqueeze(-1)).to(rows.dtype)


class HeadMode:
    """One scoring mode of the tied output head. Subclass it (or build one with ``column_terms`` overridden) and
    ``register_head_mode`` the instance.

    Attributes:
        name: the value of ``config.head_mode``.
        equation: the score s_i in words, e.g. ``"s_i = w_i·h / ‖w_i‖"``.
        paper: where it comes from, e.g. ``"Liu, Zhai & Chen (2020), eq. 27"``.
        summary: a short description for the help texts (default: the equation).
        normalizes_input_lookups: the input embedding looks up ŵ_i instead of w_i.
        keeps_row_norms: the row norms still act somewhere (False when both sides normalize them away).
        lossless_start: the learned terms a lossless start sets (``("logit_scale",)``, ``("logit_bias",)``, ``()``
            when the scores are the source's already); None: no lossless start (see ``lossless_refusal``).
        lossless_refusal: why there is no lossless start, for the error message.
        cites_liu_et_al: the model card cites Liu, Zhai & Chen.
    """

    name: str = ""
    equation: str = ""
    paper: str = ""
    summary: str = ""
    normalizes_input_lookups: bool = False
    keeps_row_norms: bool = True
    lossless_start: tuple[str, ...] | None = None
    lossless_refusal: str = "this mode declares no lossless start"
    cites_liu_et_al: bool = True

    def __init_subclass__(cls, **kwargs) -> None:
        # Every column_terms / lossless_terms a mode defines returns checked terms (module docstring).
        super().__init_subclass__(**kwargs)
        if "column_terms" in cls.__dict__:
            cls.column_terms = checked_column_terms(cls.__dict__["column_terms"])
        if "lossless_terms" in cls.__dict__:
            cls.lossless_terms = checked_lossless_terms(cls.__dict__["lossless_terms"])

    def column_terms(self, weight: torch.Tensor, eps: float) -> ColumnTerms:
        """(scale, bias) over the vocabulary such that ``s = (W·h) * scale + bias`` is the mode's score.

        Args:
            weight: W, (V, d) (or one band's (n, d)); eps: the dead-row threshold ``norm_eps``.
        Returns:
            fp32 vectors of shape (V,) on ``weight``'s device (a 0-dim tensor stands for one value for every row),
            or None for "multiply by one" / "add zero"; anything else is refused naming the mode and the term.
        """
        raise NotImplementedError(f"head mode {self.name!r} defines no column_terms")

    @checked_lossless_terms
    def lossless_terms(self, weight: torch.Tensor, eps: float) -> ColumnTerms:
        """The per-token logit scale g and logit bias b (fp32 (V,), or None where ``lossless_start`` sets none) that
        make this mode's scores equal the plain w_i·h: g·(W·h·scale + bias) + b = W·h, i.e. g = 1/scale and
        b = −g·bias (g = 0 on a dead row, which scores 0 either way). Modes override it for exact closed forms."""
        if self.lossless_start is None:
            raise ValueError(self.lossless_refusal)
        scale, bias = self.column_terms(weight, eps)
        scale_term, bias_term = MODE_LOSSLESS_TERMS  # g, b
        g = None
        if scale_term in self.lossless_start:
            g = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
        b = None
        if bias_term in self.lossless_start:
            b = -bias if g is None else -bias * g
        return g, b

    def plain_input_weight(self, weight: torch.Tensor, eps: float) -> torch.Tensor:
        """The matrix a plain ``nn.Embedding`` must hold to look up what this mode looks up: ŵ for a mode that
        normalizes the input lookups, W itself otherwise. (V, d), in ``weight``'s dtype."""
        return unit_rows(weight, eps) if self.normalizes_input_lookups else weight

    def __repr__(self) -> str:
        return f"<head mode {self.name!r}: {self.equation}>"

    def __deepcopy__(self, memo) -> HeadMode:
        return self  # a mode is its registered definition: a deep-copied model scores with the same one


class Baseline(HeadMode):
    name, equation, paper = "baseline", "s_i = w_i·h", "plain weight tying, Press & Wolf (2017)"
    summary = "w_i·h (plain tying)"
    lossless_start = ()
    cites_liu_et_al = False

    def column_terms(self, weight, eps):
        return None, None


class L2(HeadMode):
    name, paper = "l2", f"{LIU_ET_AL}, eq. 19"
    equation = "s_i = ŵ_i·h with ŵ_i = w_i/‖w_i‖, and the input lookups use ŵ_i too"
    summary = "ŵ_i·h with unit-row input lookups too"
    normalizes_input_lookups = True
    keeps_row_norms = False
    lossless_refusal = (
        "lossless_start is impossible for head_mode 'l2': it looks up unit rows ŵ_i = w_i/‖w_i‖ at the input too, "
        "so every layer receives other inputs than in the source and no term of the output head can restore its "
        "logits. Use head_mode 'cosine' with lossless_start (the same normalized output head ŵ_i·h, with the "
        "source's input lookups), or convert to 'l2' without lossless_start and fine-tune"
    )

    def column_terms(self, weight, eps):  # ŵ_i·h = w_i·h / ‖w_i‖
        return inverse_row_norms(weight, eps), None


class Square(HeadMode):
    name, equation, paper = "square", "s_i = w_i·h / ‖w_i‖²", f"{LIU_ET_AL}, eq. 22"
    summary = "w_i·h/‖w_i‖²"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps, power=2), None

    def lossless_terms(self, weight, eps):  # g_i = ‖w_i‖²
        return squared_row_norms(weight).float(), None


class Distance(HeadMode):
    name, paper = "distance", f"{LIU_ET_AL}, eq. 26"
    # = −½‖w_i − h‖² + ½‖h‖²: a nearest-neighbour score (the ½‖h‖² is the same for every token)
    equation = "s_i = w_i·h − ½‖w_i‖²"
    summary = "w_i·h − ½‖w_i‖²"
    lossless_start = ("logit_bias",)

    def column_terms(self, weight, eps):
        # No norm is divided by, so no lower bound is needed: a zero row has zero bias and a bounded gradient.
        return None, -0.5 * squared_row_norms(weight).float()

    def lossless_terms(self, weight, eps):  # b_i = ½‖w_i‖², the same fp32 numbers as the bias it cancels
        return None, 0.5 * squared_row_norms(weight).float()


class Cosine(HeadMode):
    name, equation, paper = "cosine", "s_i = w_i·h / ‖w_i‖", f"{LIU_ET_AL}, eq. 27"
    summary = "w_i·h/‖w_i‖"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps), None

    def lossless_terms(self, weight, eps):  # g_i = ‖w_i‖
        return squared_row_norms(weight).float().sqrt(), None


_REGISTRY: dict[str, HeadMode] = {}
# The package's own modes: what a config naming them means in every process, so never replaced (module docstring).
BUILTIN_HEAD_MODES = ("baseline", "l2", "square", "distance", "cosine")
# The heads built in this process, by the name of their mode, held weakly (a head is forgotten with its model).
_LIVE_HEADS: dict[str, weakref.WeakSet] = {}


def hold_head_mode(head) -> None:
    """Record that ``head`` (a module whose ``mode`` attribute is the ``HeadMode`` it scores with) lives: while it
    does, its mode's name cannot be given another definition (``register_head_mode``)."""
    _LIVE_HEADS.setdefault(head.mode.name, weakref.WeakSet()).add(head)


def live_heads_holding_another(mode: HeadMode) -> list:
    """The live heads scoring with a definition of ``mode.name`` other than ``mode``. A model in a reference cycle
    outlives its last name until the garbage collector runs, so it runs before a head is counted as live."""
    def others() -> list:
        return [head for head in list(_LIVE_HEADS.get(mode.name, ())) if head.mode is not mode]

    if others():
        gc.collect()
    return others()


def register_head_mode(mode: HeadMode, *, replace: bool = False) -> HeadMode:
    """Add ``mode`` to the registry under ``mode.name`` (and return it); every config, head, script flag, converter
    and model card of this process then accepts it. ``replace`` allows redefining a name registered at runtime; a
    built-in name (``BUILTIN_HEAD_MODES``) is refused: a saved config names its mode only, and a fresh process (the
    folder's remote code, another user) would score it with the built-in mode."""
    if not isinstance(mode, HeadMode) or not isinstance(mode.name, str) or not mode.name.isidentifier():
        raise ValueError(f"a head mode must be a HeadMode instance with an identifier as name, got {mode!r}")
    if mode.name in BUILTIN_HEAD_MODES and mode.name in _REGISTRY:
        if _REGISTRY[mode.name] is mode:  # the built-in object itself: nothing changes
            return mode
        raise ValueError(
            f"head mode {mode.name!r} is built in ({', '.join(BUILTIN_HEAD_MODES)}) and cannot be redefined, even "
            "with replace=True: a saved config records the mode's name only, so a model trained with the redefined "
            f"mode would reload in another process as the built-in {mode.name!r}, with other logits and no error. "
            "Register your mode under a name of its own"
        )
    if mode.lossless_start is not None and set(mode.lossless_start) - set(MODE_LOSSLESS_TERMS):
        names = " / ".join(map(repr, MODE_LOSSLESS_TERMS))
        raise ValueError(f"head mode {mode.name!r}: lossless_start may name {names} only")
    if mode.name in _REGISTRY and not replace:
        raise ValueError(f"head mode {mode.name!r} is registered already; pass replace=True to redefine it")
    live = live_heads_holding_another(mode)
    if live:
        raise ValueError(
            f"head mode {mode.name!r} cannot be redefined while a model built with it lives ({len(live)} live "
            f"head(s) of {type(live[0]).__name__} score with {live[0].mode!r}): that model would keep the old "
            "definition while its saved folder reloaded in this process with the new one, other logits and no "
            "error. Delete those models first (del model), or register the new definition under a name of its own"
        )
    # Terms set on the instance itself (mode.column_terms = ...) are checked like a subclass's.
    for attribute, checked in (("column_terms", checked_column_terms), ("lossless_terms", checked_lossless_terms)):
        if attribute in vars(mode):
            setattr(mode, attribute, functools.partial(checked(_unbound(vars(mode)[attribute])), mode))
    probe_head_mode(mode)
    _REGISTRY[mode.name] = mode
    return mode


def _unbound(function: Callable) -> Callable:
    """A function set on an instance takes (weight, eps); the checks call it as (self, weight, eps)."""
    return getattr(function, "__func__", None) or (lambda self, *args, **kwargs: function(*args, **kwargs))


def unregister_head_mode(name: str) -> None:
    """Remove a mode that ``register_head_mode`` added (a test cleans up with it); a built-in mode is refused (it
    could then be registered again as another mode under its name). A live model of the mode keeps scoring with it,
    its ``save_pretrained`` is refused until it is registered again, and no other definition can be registered under
    the name while it lives."""
    if name in BUILTIN_HEAD_MODES:
        raise ValueError(f"head mode {name!r} is built in and cannot be unregistered")
    _REGISTRY.pop(name, None)


def get_head_mode(name: str) -> HeadMode:
    """The registered mode called ``name``; ``ValueError`` naming it and the modes this code defines otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"head_mode must be one of {tuple(_REGISTRY)}, the modes this code ({__name__}) defines; got {name!r}. "
            "A model with a mode registered at runtime (register_head_mode) loads and saves only where that mode is "
            "registered: register it first"
        ) from None


def registered_head_mode(name: str) -> HeadMode | None:
    """The mode registered as ``name``, or None (``get_head_mode`` raises instead)."""
    return _REGISTRY.get(name)


class _RegisteredNames(Sequence):
    """The names of the registered modes, read at each use (argparse choices, membership tests, iteration)."""

    def __getitem__(self, index):
        return tuple(_REGISTRY)[index]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


HEAD_MODES: Sequence[str] = _RegisteredNames()
# The mode a model, a head or a conversion gets when none is named: plain tying, which keeps a converted model's
# function unchanged (docs/head.md, "The default mode").
DEFAULT_HEAD_MODE = "baseline"

for _mode in (Baseline(), L2(), Square(), Distance(), Cosine()):
    register_head_mode(_mode)


def head_mode_summaries() -> str:
    """"name summary" of every registered mode, for help texts."""
    return "; ".join(f"{mode.name} {mode.summary or mode.equation}" for mode in _REGISTRY.values())


__all__ = [
    "BUILTIN_HEAD_MODES",
    "DEFAULT_HEAD_MODE",
    "HEAD_MODES",
    "HeadMode",
    "get_head_mode",
    "head_mode_summaries",
    "hold_head_mode",
    "inverse_row_norms",
    "live_heads_holding_another",
    "register_head_mode",
    "registered_head_mode",
    "unit_rows",
    "unregister_head_mode",
]
