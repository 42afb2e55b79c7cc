"""Who scores with the normalized head: a caller that replaces a model's forward is served exactly or refused by name.

TRL's trainers (``SFTTrainer``, ``DPOTrainer``, ``GRPOTrainer``, ...) call ``trl.trainer.utils.add_fused_lm_head``
on the model: it sets ``model.forward`` to a function that, called with ``fused_lm_head=True``, runs
``model.base_model`` and scores its last hidden state itself, through a chunked log-prob kernel, with
``get_output_embeddings().weight`` and ``.bias`` (z = h·Wᵀ + b, times ``config.logit_scale``, soft-capped by
``final_logit_softcapping``). On a normalized tied head that weight is the raw tied matrix: TRL would train on the raw
scores w_i·h, which are not what the model computes (on tiny models the log-probs differ by 2.4).

The head *is* a plain linear layer at any given weights, though. Every head mode scores s = (W·h) ⊙ scale + bias
(head/modes.py), with the logit scale g, the logit bias b and registered head terms folded into scale and bias;
Press & Wolf's projection P of the own families folds in too (W_s·(P·h) = (W_s·P)·h). ``FoldedLinear`` is that
layer: weight W_s = diag(scale)·W (·P) and the bias, computed from the parameters when it is made, so autograd carries
TRL's gradients back to W, g, b and P (``folded_weight.FoldScale``). While a TRL fused call runs, and only then,
``get_output_embeddings()`` returns it (``serving_folded_head``): TRL's own kernel computes exactly the normalized
head's log-probabilities, its metrics (entropy, token accuracy) included, with nothing of TRL reimplemented here.
Everywhere else ``get_output_embeddings()`` stays the ``TiedNormHead`` that HF's tying and resizing, PEFT and this
package rely on.

Why this design: the alternatives were (a) a ``get_output_embeddings()`` that always returns a folded view, which
breaks tying, resizing and PEFT, which need the module that holds the shared matrix; (b) re-implementing TRL's fused
forward here, which copies TRL's private kernel plumbing and drifts with every TRL release; (c) subclassing TRL's
trainers, which users of stock TRL never call. Serving the one read that TRL makes keeps both libraries as they are.

Every other replacement of the forward — at instance level (a user's monkey-patch, liger-kernel's instance patch)
or class level (``TiedNormForCausalLM.forward = ...``) — would score with the raw matrix or skip the head's loss, and
is refused by name: when it is set on the model (``model.forward = ...``), or, set behind the model's back or on the
class, at the first call of the model's backbone (``check_scoring``), which every forward (TRL's, liger-kernel's,
ours) runs: under PEFT, too, where the model's own ``__call__`` hooks never run. accelerate's and
torch's wrappers (``convert_outputs_to_fp32``, ``autocast``, ``torch.compile``) are looked through. The check is cached
on the identity of the installed forward: a training step costs two attribute reads (docs/benchmarks.md, "Scoring
guard").

The functions are recognized by their code object's module (``__globals__``) and name, never by ``__qualname__`` or
``__module__``: ``functools.wraps`` (which TRL applies to keep the signature) copies those from our own forward.
This module imports neither trl nor accelerate.
"""

from __future__ import annotations

import functools
import types
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from .folded_weight import fold_scale
from .layer import TiedNormHead

# The forwards of our own models (``own_scoring``) and the TRL forwards this module serves, by identity.
_OWN_FORWARDS: weakref.WeakSet = weakref.WeakSet()
_SERVED_FORWARDS: weakref.WeakSet = weakref.WeakSet()
_SERVING_FOLDED = "_tiednorm_serving_folded_head"  # __dict__ entries, not module attributes: no state-dict entry
_SCORING_CHECKED = "_tiednorm_scoring_checked"
_SCORING_GUARDED = "_tiednorm_scoring_guard"

# Wrappers that call the forward they wrap and change only the dtype of its inputs/outputs: (module, code name) ->
# the wrapped callable.
_TRANSPARENT: dict[tuple[str, str], Callable] = {
    ("accelerate.utils.operations", "forward"): lambda f: f.__wrapped__,  # convert_outputs_to_fp32
    ("torch.amp.autocast_mode", "decorate_autocast"): lambda f: f.__wrapped__,
    ("torch._dynamo.eval_frame", "compile_wrapper"): lambda f: f.__wrapped__,  # model.forward = torch.compile(...)
}
_TRL_FUSED = ("trl.trainer.utils", "_fused_forward")


def own_scoring(forward: Callable) -> Callable:
    """Mark ``forward`` as a model forward that scores with the model's own head (our families' and the wrapper's)."""
    _OWN_FORWARDS.add(forward)
    return forward


def _code_origin(function) -> tuple[str, str]:
    """(module, code name) where ``function`` was really defined, whatever ``functools.wraps`` copied onto it."""
    code = getattr(function, "__code__", None)
    module = getattr(function, "__globals__", {}).get("__name__", getattr(function, "__module__", "?"))
    return module, code.co_name if code is not None else type(function).__name__


def _describe_code(function) -> str:
    code = getattr(function, "__code__", None)
    name = getattr(code, "co_qualname", None) or _code_origin(function)[1]
    return f"{_code_origin(function)[0]}.{name}"


def _wrapped_callable(function):
    """The callable a transparent wrapper calls, or None when ``function`` is not one."""
    if type(function).__name__ == "ConvertOutputsToFp32" and hasattr(function, "model_forward"):
        return function.model_forward
    unwrap = _TRANSPARENT.get(_code_origin(function))
    return None if unwrap is None else unwrap(function)


def is_trl_fused_forward(function) -> bool:
    """Whether ``function`` (or the bound method) is the forward TRL's ``add_fused_lm_head`` installs."""
    return _code_origin(getattr(function, "__func__", function)) == _TRL_FUSED


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
    """What ``model.forward = forward`` installs: TRL's fused forward wrapped so that its fused calls score with
    ``FoldedLinear`` (module docstring); any other ``forward`` that scores with the model's head as it is.

    Raises:
        ValueError: a forward that does not score with the model's head, named (``check_scoring`` catches those set
            behind the model's back, and class-level ones, at the first call); TRL's fused forward on a model whose
            training objective it cannot compute (``unservable_reasons``).
    """
    if not is_trl_fused_forward(forward):
        _refuse_scoring(_scoring_verdict(model, forward))
        return forward
    reasons = unservable_reasons(model)
    if reasons:
        raise ValueError(
            f"TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, which every TRL trainer installs) cannot "
            f"train this {type(model).__name__}: {'; '.join(reasons)}. Train it with transformers' Trainer "
            "(scripts/run_clm.py), or build the model without these options"
        )

    @functools.wraps(forward)  # the signature generate() validates its model kwargs against
    def served(self, *args, fused_lm_head: bool = False, **kwargs):
        if not fused_lm_head:
            return forward(*args, **kwargs)
        with serving_folded_head(self):
            return forward(*args, fused_lm_head=True, **kwargs)

    _SERVED_FORWARDS.add(served)
    return types.MethodType(served, model)


@contextmanager
def serving_folded_head(model: nn.Module) -> Iterator[None]:
    """Inside this block, ``model.get_output_embeddings()`` returns the head as a ``FoldedLinear``."""
    model.__dict__[_SERVING_FOLDED] = model.__dict__.get(_SERVING_FOLDED, 0) + 1
    try:
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
        scale, bias = head.column_terms()
        weight = fold_scale(head.weight, scale)
        if projection is not None:
            weight = weight @ projection.weight.to(weight.dtype)  # W_s·(P·h) = (W_s·P)·h
        self.weight, self.bias = weight, bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(hidden_states, self.weight).to(torch.promote_types(self.weight.dtype,
                                                                                         torch.float32))
        return logits if self.bias is None else logits + self.bias


def _defined_in_its_class(cls: type, function) -> bool:
    """Whether ``function``, ``cls.forward``, is written in the body of the class that holds it (a family registered
    from outside the package, with a forward of its own), possibly under transformers' decorators (can_return_tuple),
    rather than set on a class afterwards (liger-kernel's ``LlamaForCausalLM.forward = lce_forward``)."""
    owner = next((klass for klass in cls.__mro__ if "forward" in vars(klass)), None)
    if owner is None:
        return False
    while _code_origin(function)[0].startswith("transformers.") and hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    code = getattr(function, "__code__", None)
    return (code is not None and getattr(code, "co_qualname", None) == f"{owner.__qualname__}.forward"
            and _code_origin(function)[0] == owner.__module__)


def _scoring_verdict(model: nn.Module, forward=None) -> str | None:
    """Why ``model``'s forward (``forward`` when given: one about to be installed on the instance) does not score with
    its own head (a sentence naming it), or None."""
    forward = model.__dict__.get("forward") if forward is None else forward
    if forward is None:
        function = type(model).forward
        if function in _OWN_FORWARDS or _defined_in_its_class(type(model), function):
            return None
        return f"{type(model).__name__}.forward was replaced at class level by {_describe_code(function)}"
    for _ in range(32):  # a chain of wrappers; deeper is no wrapper we know
        function = getattr(forward, "__func__", forward)
        if function in _OWN_FORWARDS or function in _SERVED_FORWARDS:
            return None
        if is_trl_fused_forward(function):
            return (f"model.forward is TRL's add_fused_lm_head forward ({_describe_code(function)}), installed without "
                    "going through the model (object.__setattr__?), so it would score with the raw tied matrix")
        inner = _wrapped_callable(function)
        if inner is None:
            return f"model.forward was replaced on the instance by {_describe_code(function)}"
        forward = inner
    return f"model.forward is a chain of more than 32 wrappers ending in {_describe_code(function)}"


def check_scoring(model: nn.Module) -> None:
    """Raise ``ValueError`` naming the replacement when ``model``'s forward (instance or class level) no longer
    scores with its normalized head and is not one this module serves; cached on the forward's identity."""
    key = (model.__dict__.get("forward"), type(model).forward)
    checked = model.__dict__.get(_SCORING_CHECKED)
    if checked is not None and checked[0] is key[0] and checked[1] is key[1]:
        return
    _refuse_scoring(_scoring_verdict(model))
    model.__dict__[_SCORING_CHECKED] = key


def _refuse_scoring(why: str | None) -> None:
    if why is not None:
        raise ValueError(
            f"{why}: a replaced forward scores with get_output_embeddings().weight (the raw tied matrix) or skips the "
            "normalized head, so training would not train this model's head. Served exactly: our own forward, "
            "TRL's add_fused_lm_head (every TRL trainer), accelerate's and torch's autocast and torch.compile "
            "wrappers. For a fused loss use config.loss_implementation ('fused' / 'chunked') instead of "
            "liger-kernel's forward patches; a forward of your own that scores through the model's head can be "
            "marked with hf_tiednorm.modeling.head.scoring_guard.own_scoring"
        )


def install_scoring_guard(model: nn.Module) -> None:
    """Run ``check_scoring(model)`` before every call of its backbone (``model.base_model``), once per model."""
    backbone = model.base_model
    if backbone is model or model.__dict__.get(_SCORING_GUARDED):
        return
    owner = weakref.ref(model)

    def guard(_module, _args):
        # Not inside a compiled graph: the check reads Python objects, which dynamo cannot trace. A compiled forward
        # set on the model (model.forward = torch.compile(...)) was judged when it was set (serve_replaced_forward).
        if torch.compiler.is_compiling():
            return
        lm = owner()
        if lm is not None:
            check_scoring(lm)

    backbone.register_forward_pre_hook(guard)
    model.__dict__[_SCORING_GUARDED] = True


__all__ = [
    "FoldedLinear",
    "check_scoring",
    "install_scoring_guard",
    "is_serving_folded_head",
    "is_trl_fused_forward",
    "own_scoring",
    "serve_replaced_forward",
    "serving_folded_head",
    "unservable_reasons",
]
