"""Who scores with the normalized head, judged by what ran: the model's own forward (under any wrapper: accelerate's
hooks and offload, torch.compile, PEFT) is served, TRL's fused LM head is served the head exactly (``FoldedLinear``:
W_s = diag(scale)·W and the bias), and a forward that ran the backbone itself is refused by its real name. Decided
from counts kept in the model (its own forwards running, its calls in progress), never from interpreter frames; no
torch global hook. (docs/code_notes.md)"""

from __future__ import annotations

import copy
import functools
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .layer import TiedNormHead

# The forwards that score with the model's own head (own_scoring's wrappers, TRL's served one), by identity.
_OWN_FORWARDS: weakref.WeakSet = weakref.WeakSet()
# __dict__ entries, not module attributes: no registration, no state-dict entry.
_SCORING = "_tiednorm_scoring"  # backbone: how many own or served forwards are running over it now
_CALLING = "_tiednorm_model_calls"  # backbone: how many calls of the model (its __call__) are in progress
_HOST = "_tiednorm_scoring_host"  # backbone: _HostRef to the model that scores its hidden states
_BACKBONE = "_tiednorm_guarded_backbone"  # model: the backbone the hook is on (base_model is a slow property)
_SERVING_FOLDED = "_tiednorm_serving_folded_head"  # model: inside a served TRL call
_TRL_FORWARD = "_tiednorm_trl_forward"  # model: (TRL's function, the instance forward it replaced or None)
_TRL_FUSED = ("trl.trainer.utils", "_fused_forward")
_COMPILED = ("torch._dynamo.eval_frame", "compile_wrapper")


def _origin(function) -> tuple[str, str]:
    """(module, code name) where the plain function ``function`` was really defined, whatever ``functools.wraps``
    copied onto it."""
    return function.__globals__.get("__name__", "?"), function.__code__.co_name


def is_trl_fused_forward(function) -> bool:
    """Whether ``function`` (or the bound method) is the forward TRL's ``add_fused_lm_head`` installs."""
    function = getattr(function, "__func__", function)
    return isinstance(function, types.FunctionType) and _origin(function) == _TRL_FUSED


# --- counting the scoring forwards on the backbone -----------------------------------------------------------------


@contextmanager
def _scoring(model: nn.Module) -> Iterator[None]:
    """Inside this block an own or served forward of ``model`` runs over its backbone: the backbone is served."""
    backbone = model.__dict__.get(_BACKBONE)
    backbone = model.base_model if backbone is None else backbone
    backbone.__dict__[_SCORING] = backbone.__dict__.get(_SCORING, 0) + 1
    try:
        yield
    finally:
        backbone.__dict__[_SCORING] -= 1


def own_scoring(forward: Callable) -> Callable:
    """Mark ``forward`` as a model forward that scores with the model's own head (our families' and the wrapper's,
    or a forward of your own that calls it): while it runs, the backbone it runs is served.

    Returns the forward wrapped (``functools.wraps``: same signature); under ``torch.compile`` the wrapper adds
    nothing to the graph.
    """

    @functools.wraps(forward)
    def scoring(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return forward(self, *args, **kwargs)
        with _scoring(self):
            return forward(self, *args, **kwargs)

    _OWN_FORWARDS.add(scoring)
    return scoring


# --- TRL's fused LM head, served -----------------------------------------------------------------------------------


def unservable_reasons(model: nn.Module) -> list[str]:
    """What keeps TRL's fused LM head from computing ``model``'s training objective: a head that is no linear layer
    (the adaptive softmax), or a term of the model's own loss, which a trainer that computes its loss from the
    log-probabilities drops."""
    config, reasons = model.config, []
    if not isinstance(model.get_output_embeddings(), TiedNormHead):
        reasons.append(f"its output layer is a {type(model.get_output_embeddings()).__name__} (adaptive_cutoffs), "
                       "not one linear layer")
    for name in ("label_smoothing", "projection_regularization", "weight_norm_regularization"):
        if getattr(config, name, None):
            reasons.append(f"{name}={getattr(config, name)} is part of the model's own loss, which the trainer "
                           "replaces by its own")
    return reasons


def serve_replaced_forward(model: nn.Module, forward):
    """What ``model.forward = forward`` installs: TRL's fused forward served (its fused calls score with
    ``FoldedLinear``, module docstring); any other ``forward`` as it is, judged by what it runs.

    Raises:
        ValueError: TRL's fused forward on a model whose training objective it cannot compute
            (``unservable_reasons``); a ``torch.compile``d forward that does not compile the model's own forward
            (no hook can see what runs inside its graph), named.
    """
    if not is_trl_fused_forward(forward):
        _refuse_compiled_foreign(model, forward)
        return forward
    reasons = unservable_reasons(model)
    if reasons:
        raise ValueError("TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, which every TRL trainer installs) "
                         f"cannot train this {type(model).__name__}: {'; '.join(reasons)}. Train it with transformers' "
                         "Trainer (scripts/run_clm.py), or build the model without these options")
    # Kept in the model's __dict__, not in a closure: a deep copy of the model takes them along, bound to the copy
    # (TRL's own function keeps the original model's forward for its unfused calls; it is not called here).
    model.__dict__[_TRL_FORWARD] = _TrlPatch((getattr(forward, "__func__", forward), model.__dict__.get("forward")))
    return types.MethodType(_served_trl_forward(type(model).forward), model)


class _TrlPatch(tuple):
    """(TRL's fused function, the instance forward it replaced or None). A deep copy copies it for the copy; a pickle
    leaves it out, as it leaves out TRL's patch of any transformers model (a bound method pickles as the attribute of
    its name, ``forward``: the unpickled model has its own forward; ``add_fused_lm_head`` patches it again)."""

    def __deepcopy__(self, memo: dict) -> _TrlPatch:
        return _TrlPatch(copy.deepcopy(tuple(self), memo))

    def __reduce__(self):
        return type(None), ()


def _served_trl_forward(own_forward: Callable) -> Callable:
    """The function a TRL-patched model's forward is bound to: it reads what it serves from the model it is called
    on, so that a copy serves its own head. Its signature is the model's (generate() and the Trainer read it)."""

    @functools.wraps(own_forward)
    def served(self, *args, fused_lm_head: bool = False, **kwargs):
        patch = self.__dict__.get(_TRL_FORWARD)
        if patch is None:  # unpickled: TRL's patch is not carried (_TrlPatch); the model's own forward
            return type(self).forward(self, *args, **kwargs)
        trl_forward, replaced = patch
        if not fused_lm_head:  # the forward TRL replaced, on this model
            forward = replaced if replaced is not None else types.MethodType(type(self).forward, self)
            return forward(*args, **kwargs)
        with serving_folded_head(self):
            return trl_forward(self, *args, fused_lm_head=True, **kwargs)

    _OWN_FORWARDS.add(served)  # by identity: functools.wraps copies attributes onto any wrapper of it
    return served


@contextmanager
def serving_folded_head(model: nn.Module) -> Iterator[None]:
    """Inside this block, ``model.get_output_embeddings()`` returns the head as a ``FoldedLinear``, and the backbone
    is served (TRL's fused call runs it itself)."""
    model.__dict__[_SERVING_FOLDED] = model.__dict__.get(_SERVING_FOLDED, 0) + 1
    try:
        with _scoring(model):
            yield
    finally:
        model.__dict__[_SERVING_FOLDED] -= 1


def is_serving_folded_head(model: nn.Module) -> bool:
    return bool(model.__dict__.get(_SERVING_FOLDED))


class FoldedLinear(nn.Module):
    """The normalized head at the current weights as the plain linear layer it computes: logits = h·W_sᵀ + bias.

    Args:
        head: the ``TiedNormHead`` (weight W (V, d)).
        projection: Press & Wolf's P (d, d) applied to h before the head, or None.

    ``weight`` (V, d) in W's dtype and ``bias`` (V,) fp32 or None are plain tensors of the autograd graph (no
    parameters): gradients through them reach W, the head's learned terms and P.
    """

    def __init__(self, head: TiedNormHead, projection: nn.Linear | None = None) -> None:
        super().__init__()
        weight, bias = head.folded_weight_and_bias()
        if projection is not None:
            weight = weight @ projection.weight.to(weight.dtype)  # W_s·(P·h) = (W_s·P)·h
        self.weight, self.bias = weight, bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(hidden_states, self.weight).to(torch.promote_types(self.weight.dtype,
                                                                                         torch.float32))
        return logits if self.bias is None else logits + self.bias


# --- the model's forward in effect, unwrapped -----------------------------------------------------------------------


def _unwrap(forward) -> tuple[list[Callable], bool]:
    """The plain functions that run when ``forward`` is called, outermost first, down to the model's own forward
    (excluded), through bound methods, ``functools.partial`` (accelerate's hooks), ``__wrapped__`` (``functools.wraps``:
    accelerate's autocast and fp32 wrappers, ``torch.compile``) and callable objects' ``__call__``; and whether they
    reach the model's own forward. Read from the objects, not from what runs: O(length of the chain)."""
    found, pending, seen, reaches_own = [], [forward], set(), False
    while pending and len(seen) < 64:
        function = pending.pop(0)
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        if isinstance(function, types.FunctionType) and function in _OWN_FORWARDS:
            reaches_own = True
            continue
        if isinstance(function, types.MethodType):
            pending.append(function.__func__)
            continue
        if isinstance(function, functools.partial):
            pending.append(function.func)
        elif isinstance(function, types.FunctionType):
            found.append(function)
        elif callable(function):  # a callable object: its class's __call__ runs
            call = next((vars(k)["__call__"] for k in type(function).__mro__ if "__call__" in vars(k)), None)
            if isinstance(call, types.FunctionType):
                found.append(call)
        pending.append(getattr(function, "__wrapped__", None))
    return found, reaches_own


def _name(function) -> str:
    """A function by its real module and qualified name (its code's: ``functools.wraps`` copies the wrapped one's)."""
    code = function.__code__
    return f"{function.__globals__.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"


def _names(functions: list[Callable]) -> str:
    return ", wrapping ".join(_name(function) for function in functions)


def forward_name(forward) -> str:
    """What runs when ``forward`` is called: its functions by their real module and name, outermost first (which of
    them scored is not known without running it: "accelerate's hook, wrapping a patch", "a patch, wrapping the
    class's forward" as ``functools.wraps`` dresses one)."""
    return _names(_unwrap(forward)[0]) or "the model's own forward"


def _refuse_compiled_foreign(model: nn.Module, forward) -> None:
    """Refuse a ``torch.compile``d forward set on the instance unless it compiles the model's own forward: inside its
    graph no hook runs, so what it scores with cannot be seen when it runs."""
    functions, reaches_own = _unwrap(forward)
    if reaches_own or not any(_origin(function) == _COMPILED for function in functions):
        return
    compiled = [function for function in functions if _origin(function) != _COMPILED]
    name = _name(compiled[-1]) if compiled else "a function"
    _refuse_scoring(f"{type(model).__name__}'s forward (set on the instance) is torch.compile of {name}, not of the "
                    "model's own forward (a compiled graph runs no hook, so it is judged by what it compiles)")


def _refuse_scoring(why: str) -> None:
    raise ValueError(f"{why}: a forward that runs the backbone itself scores the hidden states without the normalized "
                     "head (with get_output_embeddings().weight, the raw tied matrix, or not at all), so training and "
                     "evaluation would not use this model's head. Served exactly: anything that calls the model's own "
                     "forward (accelerate's device and offload hooks, torch.compile, autocast, PEFT, a wrapper of your "
                     "own) and TRL's add_fused_lm_head (every TRL trainer). For a fused loss use "
                     "config.loss_implementation ('fused' / 'chunked') instead of liger-kernel's forward patches; a "
                     "forward of your own that scores through the model's head can be marked with "
                     "hf_tiednorm.modeling.head.scoring_guard.own_scoring")


# --- the hook on the backbone --------------------------------------------------------------------------------------


class _HostRef:
    """A weak reference from a backbone to the model that scores its hidden states; a deep copy of the model points
    its backbone's at the copy, a pickle takes the model along."""

    __slots__ = ("_ref",)

    def __init__(self, host: nn.Module | None) -> None:
        self._ref = weakref.ref(host) if host is not None else None

    def __call__(self) -> nn.Module | None:
        return None if self._ref is None else self._ref()

    def __deepcopy__(self, memo: dict) -> _HostRef:
        host = self()
        return _HostRef(memo.get(id(host), host))

    def __reduce__(self):
        return _HostRef, (self(),)


def _enter_model_call(model: nn.Module, _args) -> None:
    """Forward pre-hook of the model: one more call of the model (its ``__call__``) in progress over its backbone."""
    backbone = model.__dict__.get(_BACKBONE)
    if backbone is not None and not torch.compiler.is_compiling():
        backbone.__dict__[_CALLING] = backbone.__dict__.get(_CALLING, 0) + 1


def _exit_model_call(model: nn.Module, _args, _output) -> None:
    """Forward hook of the model, run also when the forward raised (``always_call``)."""
    backbone = model.__dict__.get(_BACKBONE)
    if backbone is not None and backbone.__dict__.get(_CALLING) and not torch.compiler.is_compiling():
        backbone.__dict__[_CALLING] -= 1


def _judge_backbone_call(backbone: nn.Module, _args) -> None:
    """Forward pre-hook of a model's backbone: refuse a call that the model's forward in effect makes without the
    model's own forward (module docstring)."""
    state = backbone.__dict__
    if state.get(_SCORING) or torch.compiler.is_compiling():
        return
    reference = state.get(_HOST)
    host = reference() if reference is not None else None
    if host is None or host.base_model is not backbone:  # a backbone used on its own (or copied alone)
        return
    instance = host.__dict__.get("forward")
    functions, reaches_own = _unwrap(instance if instance is not None else type(host).forward)
    if not functions:  # the model's own forward is in effect, and not running: nothing of the model's scores
        return
    name = _names(functions)
    where = "set on the instance" if instance is not None else "its class's"
    if state.get(_CALLING):  # the model is being called, and its forward in effect ran the backbone itself
        why = f"{type(host).__name__}'s forward ({where}) ran its backbone in {name}"
        if any(_origin(function) == _TRL_FUSED for function in functions):
            why += (", TRL's add_fused_lm_head forward installed without going through the model "
                    "(object.__setattr__?), so it scores with the raw tied matrix")
        why += ", not through the model's own forward"
    elif reaches_own or "peft_config" not in host.__dict__:
        return  # called directly (hidden states for an embedding, a value head): nothing is scored
    else:  # PEFT (model.peft_config) holds the model, and its AdaLoRA / X-LoRA tuners call model.forward directly
        why = (f"{type(host).__name__}'s forward ({where}) is {name}, which does not reach the model's own forward, "
               "and the backbone ran outside the model's own forward while PEFT holds the model (its AdaLoRA and "
               "X-LoRA tuners call model.forward past the model's __call__, where no hook sees the call)")
    _refuse_scoring(why)


def install_scoring_guard(model: nn.Module) -> None:
    """Judge every call of ``model``'s backbone (``model.base_model``) by what runs it (module docstring): a hook on
    the backbone, once per backbone (a later call only points it at ``model``), and two counting the model's calls,
    once per model."""
    backbone = model.base_model
    if backbone is model:
        return
    if _HOST not in backbone.__dict__:
        backbone.register_forward_pre_hook(_judge_backbone_call)
    backbone.__dict__[_HOST] = _HostRef(model)
    if _BACKBONE not in model.__dict__:
        model.register_forward_pre_hook(_enter_model_call, prepend=True)
        model.register_forward_hook(_exit_model_call, always_call=True)
    model.__dict__[_BACKBONE] = backbone  # not registered: no second name, no state-dict entry


__all__ = [
    "FoldedLinear",
    "forward_name",
    "install_scoring_guard",
    "is_serving_folded_head",
    "is_trl_fused_forward",
    "own_scoring",
    "serve_replaced_forward",
    "serving_folded_head",
    "unservable_reasons",
]
