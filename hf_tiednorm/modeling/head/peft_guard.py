"""PEFT must never bypass the normalized tied head: refuse the adapters that would, saying what to do instead.

Measured with peft 0.21 on a normalized tied head (cosine, l2):

* LoRA (or any adapter) on attention / MLP layers leaves the head and the embedding alone: exact (tie kept, adapter
  round trip exact, merged = unmerged up to float rounding). Allowed.
* ``trainable_token_indices`` replaces the lookup and the output layer by ``F.embedding`` / ``F.linear`` on the raw
  matrix: the model would silently score with plain tied logits (and look up unnormalized rows in l2 mode).
* LoRA on ``lm_head`` / the embedding adds an unnormalized low-rank term beside the normalized score, and merging it
  changes the shared matrix the head normalizes: merged ≠ unmerged.
* ``modules_to_save`` on ``lm_head`` / the embedding trains a copy: the output layer is no longer tied.

Those three are refused by ``check_head_not_bypassed``, which can be called on any model after ``get_peft_model``.
The models run it through ``check_head_once`` (the wrapped models in ``forward``, our own families in a forward
pre-hook, ``refuse_bypassed_head``; PEFT's tuners and ``generate`` call the model) and at every ``generate``. A
bypass is a structural change (a module or a parameter replaced under its name), and torch reports every one through
its global module/parameter registration hooks: ``check_head_once`` walks the modules again only after one happened
anywhere in the process, so a decoding step costs a counter comparison instead of a walk over every module
(docs/benchmarks.md, "PEFT guard"). The exact way to also train the shared embedding under PEFT: unfreeze it and
save it with the adapter (``PEFT_EMBEDDING_ADVICE``).

This module does not import peft (an optional extra): PEFT layers are recognized by their class names.
"""

from __future__ import annotations

from torch import nn
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)

from .layer import TiedNormHead

PEFT_EMBEDDING_ADVICE = (
    "Put adapters on attention/MLP layers only (e.g. LoraConfig(target_modules=['q_proj', 'v_proj']), never lm_head "
    "or the embedding); to fine-tune the shared embedding too, unfreeze it after get_peft_model with "
    "`model.get_input_embeddings().weight.requires_grad_(True)` and save it with the adapter: "
    "`model.save_pretrained(folder, save_embedding_layers=True)`. The head then normalizes the trained matrix exactly."
)
# (PEFT class names, why wrapping the head or the shared embedding with one breaks the normalization), first match wins.
_WHY = (
    (
        ("TrainableTokensWrapper", "TrainableTokensLayer"),
        "PEFT's trainable_token_indices scores and looks up tokens with the raw matrix (F.linear / F.embedding), "
        "bypassing the normalized head: the model would train with plain tied scoring",
    ),
    (
        ("ModulesToSaveWrapper",),
        "PEFT's modules_to_save trains a copy of the module, which unties the output layer from the input embedding "
        "the normalized head scores with",
    ),
    (
        ("BaseTunerLayer",),
        "an adapter there adds an unnormalized term beside the normalized score, and merging it changes the shared "
        "matrix the head normalizes, so the merged model would differ from the unmerged one",
    ),
)


def _peft_reason(module: nn.Module) -> str | None:
    """Why ``module``, a PEFT construct, must not wrap the head or the shared embedding; None for other modules."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return next((why for classes, why in _WHY if names.intersection(classes)), None)


def _wrapped(module: nn.Module) -> nn.Module:
    """The module a PEFT construct wraps (a tuner layer's ``base_layer``, a wrapper's ``original_module``)."""
    inner = getattr(module, "original_module", None) or getattr(module, "base_layer", None)
    return module if inner is None else _wrapped(inner)


def check_head_not_bypassed(model: nn.Module) -> None:
    """Raise ``ValueError`` when a PEFT construct wraps the normalized head or an embedding sharing its matrix, or
    when the output layer is no longer tied to the input embedding; do nothing otherwise.

    Args:
        model: a model with a ``TiedNormHead`` (an hf_tiednorm model, possibly inside a ``PeftModel``).
    """
    modules = dict(model.named_modules())
    heads = [m for m in modules.values() if isinstance(m, TiedNormHead)]
    if not heads:
        return  # no normalized head (e.g. the adaptive softmax): nothing this guard protects
    shared = heads[0].weight
    for name, module in modules.items():
        why = _peft_reason(module)
        if why is None:
            continue
        base = _wrapped(module)
        if isinstance(base, TiedNormHead) or isinstance(base, nn.Embedding) and base.weight is shared:
            raise ValueError(f"{name} is wrapped by {type(module).__name__}: {why}. {PEFT_EMBEDDING_ADVICE}")
    tied = any(isinstance(m, nn.Embedding) and m.weight is shared for m in modules.values())
    if getattr(model.config, "tie_word_embeddings", True) and not tied:
        raise ValueError(
            "the output layer no longer shares the input embedding matrix, which the normalized head scores with "
            f"(was a module copied or replaced?). {PEFT_EMBEDDING_ADVICE}"
        )


# Bumped whenever any module *replaces* a submodule or a parameter it holds under a name (nn.Module.__setattr__,
# add_module, register_parameter over an existing entry): every way PEFT or a user swaps the head, an embedding or the
# shared matrix for another object. A new name in a fresh container (transformers slices its ModuleList of layers
# at every forward) replaces nothing that a checked model reaches its head through.
_structure = {"version": 0}


def _replaced_module(module: nn.Module, name: str, _value) -> None:
    if name in module._modules:
        _structure["version"] += 1


def _replaced_parameter(module: nn.Module, name: str, _value) -> None:
    if name in module._parameters:
        _structure["version"] += 1


register_module_module_registration_hook(_replaced_module)
register_module_parameter_registration_hook(_replaced_parameter)
_CHECKED_AT = "_tiednorm_guard_checked_at"


def check_head_once(model: nn.Module) -> None:
    """``check_head_not_bypassed(model)``, unless it passed already and no module or parameter has been registered
    anywhere in the process since (O(1) then)."""
    version = _structure["version"]
    if model.__dict__.get(_CHECKED_AT) == version:
        return
    check_head_not_bypassed(model)
    model.__dict__[_CHECKED_AT] = version  # not a module attribute: no registration, no state dict entry


def refuse_bypassed_head(model: nn.Module, _args: tuple) -> None:
    """Forward pre-hook running ``check_head_once`` at every call of ``model`` (our own families)."""
    check_head_once(model)


__all__ = [
    "PEFT_EMBEDDING_ADVICE",
    "check_head_not_bypassed",
    "check_head_once",
    "refuse_bypassed_head",
]
