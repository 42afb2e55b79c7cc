"""Adding a head mode: ``register_head_mode`` checks a mode before any model uses it, and its names are the choices
of every flag (``HEAD_MODES``).

The registry itself belongs to the modeling code (head/settings.py's ``HEAD_MODE_REGISTRY``, filled with the built-in
modes by head/modes.py), which a saved folder carries; the checks and the probe a registration runs live here, with
the package, because a folder's own code never registers a mode: a config naming a mode its code does not define is
refused by name. What a registered mode returns is checked at every call (registration/mode_checks.py).
"""

from __future__ import annotations

import gc
import types
from collections.abc import Callable, Iterator, Sequence

from ..modeling.head.layer import NormalizedScoresMixin
from ..modeling.head.modes import HeadMode, get_head_mode
from ..modeling.head.settings import BUILTIN_HEAD_MODES, HEAD_MODE_REGISTRY, head_mode_names
from ..modeling.head.terms import MODE_LOSSLESS_TERMS
from .mode_checks import checked_column_terms, checked_lossless_terms, probe_head_mode


def register_head_mode(mode: HeadMode, *, replace: bool = False) -> HeadMode:
    """Add ``mode`` to the registry under ``mode.name`` (and return it); every config, head, script flag, converter
    and model card of this process then accepts it. ``replace`` allows redefining a name registered at runtime; a
    built-in name (``BUILTIN_HEAD_MODES``) is refused: a saved config names its mode only, and a fresh process (the
    folder's remote code, another user) would score it with the built-in mode.

    Raises:
        ValueError / TypeError: a name that is no identifier, a built-in or taken name, a lossless start naming
            another term than g or b, or terms of the wrong type, shape, dtype or device on a small probe weight.
    """
    if not isinstance(mode, HeadMode) or not isinstance(mode.name, str) or not mode.name.isidentifier():
        raise ValueError(f"a head mode must be a HeadMode instance with an identifier as name, got {mode!r}")
    if mode.name in BUILTIN_HEAD_MODES and mode.name in HEAD_MODE_REGISTRY:
        if HEAD_MODE_REGISTRY[mode.name] is mode:  # the built-in object itself: nothing changes
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
    if mode.name in HEAD_MODE_REGISTRY and not replace:
        raise ValueError(f"head mode {mode.name!r} is registered already; pass replace=True to redefine it")
    live = live_heads_holding_another(mode)
    if live:
        raise ValueError(
            f"head mode {mode.name!r} cannot be redefined while a model built with it lives ({len(live)} live "
            f"head(s) of {type(live[0]).__name__} score with {live[0].mode!r}): that model would keep the old "
            "definition while its saved folder reloaded in this process with the new one, other logits and no "
            "error. Delete those models first (del model), or register the new definition under a name of its own"
        )
    # Every call of its terms is checked: the methods become checked ones on the instance (its class's, or those set
    # on the instance itself, mode.column_terms = ...).
    for attribute, checked in (("column_terms", checked_column_terms), ("lossless_terms", checked_lossless_terms)):
        function = _unbound(vars(mode)[attribute]) if attribute in vars(mode) else getattr(type(mode), attribute)
        setattr(mode, attribute, types.MethodType(checked(function), mode))
    probe_head_mode(mode)
    HEAD_MODE_REGISTRY[mode.name] = mode
    return mode


def live_heads_holding_another(mode: HeadMode) -> list:
    """The live heads of this process scoring with a definition of ``mode.name`` other than ``mode`` (issue 58: a
    live model kept the old definition while its saved folder reloaded with the new one, logits × 0.5). Found among
    the objects the garbage collector tracks, after a collection, so that a model in a reference cycle outlives its
    last name no longer; a registration is rare, and a head needs no record of its own (nor its copies)."""
    gc.collect()
    live = []
    for found in gc.get_objects():
        try:
            if isinstance(found, NormalizedScoresMixin) and found.mode.name == mode.name and found.mode is not mode:
                live.append(found)
        except Exception:  # noqa: BLE001, S112 (an object whose isinstance or attributes raise: not a head)
            continue
    return live


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
    HEAD_MODE_REGISTRY.pop(name, None)


class _RegisteredNames(Sequence):
    """The names of the registered modes, read at each use (argparse choices, membership tests, iteration)."""

    def __getitem__(self, index):
        return head_mode_names()[index]

    def __len__(self) -> int:
        return len(head_mode_names())

    def __iter__(self) -> Iterator[str]:
        return iter(head_mode_names())

    def __contains__(self, name: object) -> bool:
        return name in head_mode_names()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return repr(tuple(self))


HEAD_MODES: Sequence[str] = _RegisteredNames()


def head_mode_summaries() -> str:
    """"name summary" of every registered mode, for help texts."""
    modes = map(get_head_mode, HEAD_MODES)
    return "; ".join(f"{mode.name} {mode.summary or mode.equation}" for mode in modes)


__all__ = [
    "HEAD_MODES", "head_mode_summaries", "live_heads_holding_another", "register_head_mode", "unregister_head_mode",
]  # fmt: skip
