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
bypass is a structural change of the few objects the check reads: the head or an embedding holding the shared matrix
replaced under one of its names (PEFT wraps a module by setting the wrapper where it was), or the shared matrix
replaced in one of them. After a walk that passed, ``check_head_once`` keeps those names and objects in the model's
own ``__dict__`` (no torch hook, nothing process-wide) and, at the next call, only reads the objects found under the
kept names again: a decoding step costs a few dictionary reads, whatever the size of the model, instead of a walk
over every module (docs/benchmarks.md, "PEFT guard"). A parameter on the meta device is one accelerate offloaded
(``cpu_offload``, ``disk_offload``, ``device_map`` with offload): its values are put in place, and tied again, by
accelerate's hook at each call, so the tie is not judged by its (placeholder) identity. The exact way to also train
the shared embedding under PEFT: unfreeze it and save it with the adapter (``PEFT_EMBEDDING_ADVICE``).

This module does not import peft (an optional extra): PEFT layers are recognized by their class names.
"""

from __future__ import annotations

import operator

import torch
from torch import nn

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
    head = heads[0]
    shared = head.weight
    for name, module in modules.items():
        why = _peft_reason(module)
        if why is None:
            continue
        base = _wrapped(module)
        if isinstance(base, TiedNormHead) or isinstance(base, nn.Embedding) and base.weight is shared:
            raise ValueError(f"{name} is wrapped by {type(module).__name__}: {why}. {PEFT_EMBEDDING_ADVICE}")
    tied = any(isinstance(m, nn.Embedding) and _same_matrix(m.weight, shared) for m in modules.values())
    if getattr(model.config, "tie_word_embeddings", True) and not tied:
        raise ValueError(
            "the output layer no longer shares the input embedding matrix, which the normalized head scores with "
            f"(was a module copied or replaced?). {PEFT_EMBEDDING_ADVICE}"
        )


def refuse_peft_before_normalizing(model: nn.Module) -> None:
    """Raise ``ValueError`` when ``model``, about to get the normalized head (``normalize_tied_head``), is a
    ``PeftModel`` or carries PEFT layers already (``get_peft_model`` injects them into the model it is given).

    Normalizing then would replace modules under the adapters (the saved adapter keys no longer match and reload
    re-initialized), or find a LoRA layer where the output layer should be (PEFT's ``lora.Linear``, reported as
    "got Linear"). The order that works: normalize the plain model, then ``get_peft_model`` on the result.
    """
    peft_classes = {"PeftModel", "BaseTunerLayer", "ModulesToSaveWrapper", "TrainableTokensWrapper"}
    found = next(
        (
            (name or "the model itself", type(module).__name__)
            for name, module in model.named_modules()
            if peft_classes.intersection(cls.__name__ for cls in type(module).__mro__)
        ),
        None,
    )
    if found is not None:
        raise ValueError(
            f"normalize_tied_head got a model that PEFT has wrapped already ({found[0]} is a PEFT "
            f"{found[1]}): normalize first, then add adapters, i.e. "
            "model = normalize_tied_head(base_model, ...) and then get_peft_model(model, LoraConfig(...)) on the "
            f"normalized model (load the base model again if get_peft_model has modified it). {PEFT_EMBEDDING_ADVICE}"
        )


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
    and that matrix are still the objects found under the same names (O(1) then: no walk over the modules)."""
    checked = model.__dict__.get(_HEAD_CHECKED)
    if checked is not None:
        paths, objects = checked
        now = _fingerprint(model, paths)
        if len(now) == len(objects) and all(map(operator.is_, now, objects)):
            return
    check_head_not_bypassed(model)
    paths = _watched_paths(model)
    # Not a module attribute: no registration, no state-dict entry; a deep copy maps the objects to its own.
    model.__dict__[_HEAD_CHECKED] = (paths, _fingerprint(model, paths))


def refuse_bypassed_head(model: nn.Module, _args: tuple) -> None:
    """Forward pre-hook running ``check_head_once`` at every call of ``model`` (our own families)."""
    check_head_once(model)


__all__ = [
    "PEFT_EMBEDDING_ADVICE",
    "check_head_not_bypassed",
    "check_head_once",
    "refuse_bypassed_head",
    "refuse_peft_before_normalizing",
]
