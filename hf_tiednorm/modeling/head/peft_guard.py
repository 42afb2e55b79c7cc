"""PEFT must never bypass the normalized tied head: adapters on attention and MLP layers are allowed; trainable tokens,
LoRA on the head or the shared embedding, ``modules_to_save`` on them and an untied output layer are refused naming what
to do instead, and so is a head term trained outside an adapter, which PEFT's save would drop. The check runs at every
call of the model and every ``generate``, O(1) while nothing it watches was replaced. (docs/code_notes.md)"""

from __future__ import annotations

import operator

import torch
from torch import nn

from .layer import TiedNormHead

PEFT_EMBEDDING_ADVICE = ("Put adapters on attention/MLP layers only (e.g. LoraConfig(target_modules=['q_proj', "
                         "'v_proj']), never lm_head or the embedding); to fine-tune the shared embedding too, unfreeze "
                         "it after get_peft_model with `model.get_input_embeddings().weight.requires_grad_(True)` and "
                         "save it with the adapter: `model.save_pretrained(folder, save_embedding_layers=True)`. The "
                         "head then normalizes the trained matrix exactly.")
# Where a checked model keeps the head terms an adapter save would drop (unsaved_head_terms), checked at every call.
_WATCHED = "_tiednorm_guard_unsaved_terms"
# PEFT class names -> why wrapping the head or the shared embedding with one breaks the normalization; first match wins.
_WHY = {
    ("TrainableTokensWrapper", "TrainableTokensLayer"):
        "PEFT's trainable_token_indices scores and looks up tokens with the raw matrix (F.linear / F.embedding), "
        "bypassing the normalized head: the model would train with plain tied scoring",
    ("ModulesToSaveWrapper",):
        "PEFT's modules_to_save trains a copy of the module, which unties the output layer from the input embedding "
        "the normalized head scores with",
    ("BaseTunerLayer",):
        "an adapter there adds an unnormalized term beside the normalized score, and merging it changes the shared "
        "matrix the head normalizes, so the merged model would differ from the unmerged one",
}  # fmt: skip


def _peft_reason(module: nn.Module) -> str | None:
    """Why ``module``, a PEFT construct, must not wrap the head or the shared embedding; None for other modules."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return next((why for classes, why in _WHY.items() if names.intersection(classes)), None)


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
    tied = any(isinstance(m, nn.Embedding) and _same_matrix(m.weight, shared) for m in modules.values())
    if getattr(model.config, "tie_word_embeddings", True) and not tied:
        raise ValueError("the output layer no longer shares the input embedding matrix, which the normalized head "
                         f"scores with (was a module copied or replaced?). {PEFT_EMBEDDING_ADVICE}")
    model.__dict__[_WATCHED] = unsaved = unsaved_head_terms(modules)  # not a module attribute: no state dict entry
    refuse_unsaved_head_terms(unsaved)


def unsaved_head_terms(modules: dict[str, nn.Module]) -> list[tuple[str, nn.Parameter]]:
    """The head's learned terms (every parameter of a ``TiedNormHead`` but the shared matrix) that an adapter save
    would drop, by qualified name: all of them in a model PEFT put adapters into, unless the head trains them with an
    adapter (``hf_tiednorm.training.peft_terms.train_head_terms``, which makes it a PEFT auxiliary module); none in a
    model without PEFT (whose save keeps them)."""
    names = {name: {cls.__name__ for cls in type(module).__mro__} for name, module in modules.items()}
    if not any("BaseTunerLayer" in classes for classes in names.values()):
        return []
    return [
        (f"{name}.{term}" if name else term, parameter)
        for name, module in modules.items()
        if isinstance(module, TiedNormHead) and "AuxiliaryTrainingWrapper" not in names[name]
        for term, parameter in module.named_parameters(recurse=False)
        if term != "weight"
    ]


def refuse_unsaved_head_terms(terms: list[tuple[str, nn.Parameter]]) -> None:
    """Raise ``ValueError`` naming the first of ``terms`` (``unsaved_head_terms``) that requires grad: it would
    train, then be lost at ``save_pretrained`` (PEFT saves only its adapters), and a reload would score with the
    base model's value, with no warning. ``check_head_not_bypassed`` keeps ``terms`` on the model, and
    ``check_head_once`` checks them at every call (an attribute read a term): a ``requires_grad_`` set later is
    refused at the next call."""
    for name, parameter in terms:
        if parameter.requires_grad:
            raise ValueError(f"{name} requires grad in a model PEFT put adapters into, but PEFT's save_pretrained "
                             f"saves only what its adapters own: the trained {name} would be lost at save, and "
                             "PeftModel.from_pretrained would score with the base model's value. Train the head's "
                             "learned terms with the adapter instead: after get_peft_model, `from "
                             "hf_tiednorm.training.peft_terms import train_head_terms; train_head_terms(model)` (saved "
                             "with the adapter, restored by PeftModel.from_pretrained); or freeze it again with "
                             "`.requires_grad_(False)`")


def _same_matrix(weight: torch.Tensor, shared: torch.Tensor) -> bool:
    """Whether an embedding's ``weight`` is the head's matrix ``shared``: the same parameter, or offloaded by
    accelerate (a placeholder on the meta device between calls: accelerate puts the values in place, and ties them,
    from its weights map at each call)."""
    return weight is shared or (weight.is_meta or shared.is_meta) and weight.shape == shared.shape


_HEAD_CHECKED = "_tiednorm_head_checked"  # model.__dict__: (watched names, the objects found under them) after a pass
_OFFLOADED = object()  # what a meta parameter counts as: accelerate replaces it by another placeholder at each call


def _watched_paths(model: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Every name (as a path of attribute names) under which ``model`` holds its normalized head or an embedding
    holding the head's matrix: the objects a PEFT bypass or an untie replaces."""
    heads = [m for m in model.modules() if isinstance(m, TiedNormHead)]
    if not heads:
        return ()
    shared = heads[0].weight
    return tuple(
        tuple(name.split(".")) if name else ()
        for name, module in model.named_modules(remove_duplicate=False)
        if module is heads[0] or isinstance(module, nn.Embedding) and _same_matrix(module.weight, shared)
    )


def _fingerprint(model: nn.Module, paths: tuple[tuple[str, ...], ...]) -> tuple:
    """The objects found under ``paths`` (each module and its ``weight``), read through the modules' own
    dictionaries: a few reads per path, whatever the size of the model."""
    found = []
    for path in paths:
        module = model
        for part in path:
            module = module._modules.get(part)
            if module is None:
                return (None,)
        weight = module._parameters.get("weight")
        found += [module, _OFFLOADED if weight is not None and weight.is_meta else weight]
    return tuple(found)


def check_head_once(model: nn.Module) -> None:
    """``check_head_not_bypassed(model)``, unless it passed already and the head, the embeddings holding its matrix
    and that matrix are still the objects found under the same names (O(1) then: no walk over the modules); the head
    terms an adapter save would drop are checked at every call (``refuse_unsaved_head_terms``)."""
    checked = model.__dict__.get(_HEAD_CHECKED)
    if checked is not None:
        paths, objects = checked
        now = _fingerprint(model, paths)
        if len(now) == len(objects) and all(map(operator.is_, now, objects)):
            refuse_unsaved_head_terms(model.__dict__.get(_WATCHED, ()))  # a requires_grad_ set since
            return
    check_head_not_bypassed(model)
    paths = _watched_paths(model)
    # Not a module attribute: no registration, no state-dict entry; a deep copy maps the objects to its own.
    model.__dict__[_HEAD_CHECKED] = (paths, _fingerprint(model, paths))


def check_again(model: nn.Module) -> None:
    """Forget what ``check_head_once`` found for ``model`` and every module in it: the next call checks in full (a
    head that changed role without a structural change, e.g. ``train_head_terms``, is judged again)."""
    for module in model.modules():
        module.__dict__.pop(_HEAD_CHECKED, None)
        module.__dict__.pop(_WATCHED, None)


def refuse_bypassed_head(model: nn.Module, _args: tuple) -> None:
    """Forward pre-hook running ``check_head_once`` at every call of ``model`` (our own families)."""
    check_head_once(model)


__all__ = [
    "PEFT_EMBEDDING_ADVICE",
    "check_again",
    "check_head_not_bypassed",
    "check_head_once",
    "refuse_bypassed_head",
    "refuse_unsaved_head_terms",
]
