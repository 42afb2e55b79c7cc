"""A model folder loads as trained or not at all: every tensor the model holds must come from the file (a learned head
term, the shared embedding, any layer) and every tensor of the file must find its place; transformers only logs both.
``check_loaded_head`` runs from transformers' own hook on the loading report and names each tensor, config field and
the folder. (docs/code_notes.md)"""

from __future__ import annotations

from torch import nn

from .head.layer import NormalizedScoresMixin
from .head.settings import HEAD_TERMS, HeadSettings
from .weight_checks import check_finite_weights


def _shared_matrices(model: nn.Module) -> set[int]:
    """The ``id``s of the output embedding's matrices (the shared matrix, or the adaptive bands)."""
    head = next((module for module in model.modules() if isinstance(module, NormalizedScoresMixin)), None)
    return set() if head is None else {id(matrix) for matrix in head.embedding_matrices()}


def head_term_errors(model: nn.Module, missing: set[str], unexpected: set[str]) -> list[str]:
    """What is wrong with the head's learned terms (head/settings.HeadTerm, every registered one): a term the config
    declares but the weights lack, or a term the weights hold but the config does not declare (state-dict keys such
    as 'lm_head.logit_scale')."""
    heads = {name: module for name, module in model.named_modules() if isinstance(module, NormalizedScoresMixin)}
    errors = []
    for key in sorted(missing | unexpected):
        module, _, leaf = key.rpartition(".")
        if module not in heads or leaf not in HEAD_TERMS:
            continue
        setting = HEAD_TERMS[leaf].setting(HeadSettings.from_config(model.config))  # "logit_bias=True", as config.json
        switch = setting.partition("=")[0]
        if key in missing:
            errors.append(f"tensor {key!r} is missing from the weights, but config.json declares {setting}: a learned "
                          "term of the head is part of the trained function, and it would start afresh (at "
                          f"{heads[module].term_starts[leaf]:g}). Restore the weights file, or set {switch} in "
                          "config.json to what the model was trained with")
        else:
            errors.append(f"the weights hold a trained {key!r}, but config.json declares {setting}, which has no such "
                          f"tensor: loading would drop it and change the logits. Set {switch} in config.json to what "
                          f"the model was trained with ({HEAD_TERMS[leaf].help})")
    return errors


def embedding_errors(model: nn.Module, missing: set[str]) -> list[str]:
    """The output embedding (the shared matrix, or the adaptive bands) missing from the weights, and any parameter
    left on the meta device (never loaded, never initialized)."""
    shared = _shared_matrices(model)
    # One report per matrix, under the name it is saved as (not a tied copy's name, which is never in the file).
    tied_copies = set(getattr(model, "all_tied_weights_keys", None) or {})
    names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in missing and id(parameter) in shared:
            names.setdefault(id(parameter), []).append(name)
    errors = [
        f"tensor {next((n for n in found if n not in tied_copies), found[0])!r} (the embedding matrix the tied head "
        "scores with) is missing from the weights: it would be initialized at random. The weights file is "
        "incomplete; restore it"
        for found in names.values()
    ]
    return errors + [
        f"tensor {name!r} was not in the weights and was left on the meta device (no values): the weights file is "
        "incomplete; restore it"
        for name, parameter in model.named_parameters()
        if parameter.is_meta and not offloaded_to_disk(model, name)
    ]


_DEVICE_MAP_AT_LOAD = "_tiednorm_device_map_at_load"  # model.__dict__: no registration, no state-dict entry


def offloaded_to_disk(model: nn.Module, name: str) -> bool:
    """Whether parameter ``name`` is offloaded to disk by the device map ``model`` is loaded (or dispatched) with:
    the longest module prefix of ``name`` the map names maps to ``"disk"``."""
    device_map = model.__dict__.get(_DEVICE_MAP_AT_LOAD) or getattr(model, "hf_device_map", None) or {}
    parts = name.split(".")
    for end in range(len(parts), -1, -1):
        device = device_map.get(".".join(parts[:end]))
        if device is not None:
            return device == "disk"
    return False


def _named_already(model: nn.Module, keys: set[str]) -> set[str]:
    """The keys of ``keys`` that ``head_term_errors`` / ``embedding_errors`` report (under their own words): the
    head's learned terms, every name of the shared embedding matrices, and parameters left on the meta device."""
    heads = {name for name, module in model.named_modules() if isinstance(module, NormalizedScoresMixin)}
    shared = _shared_matrices(model)
    named = {key for key in keys if key.rpartition(".")[0] in heads and key.rpartition(".")[2] in HEAD_TERMS}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in keys and (id(parameter) in shared or parameter.is_meta and not offloaded_to_disk(model, name)):
            named.add(name)
    return named


def other_tensor_errors(model: nn.Module, missing: set[str], unexpected: set[str]) -> list[str]:
    """Every missing tensor (a layer's weight, a norm, a bias: transformers would initialize it at random) and every
    unexpected one (a tensor of the file the model has no place for: dropped) that ``head_term_errors`` and
    ``embedding_errors`` do not report already. ``missing`` / ``unexpected`` come after transformers' own rules, so a
    tied copy that is not saved twice, a non-persistent buffer and a family's ``_keys_to_ignore_on_load_*`` are not
    among them."""
    named = _named_already(model, missing | unexpected)
    errors = [
        f"tensor {key!r} is missing from the weights: it would be initialized at random, so the model would compute "
        "other logits than the one that was saved. The weights file is incomplete; restore it"
        for key in sorted(missing - named)
    ]
    errors += [
        f"the weights hold tensor {key!r}, which {type(model).__name__} built from this config.json has no place "
        "for: loading would drop it. The weights belong to another model, or config.json was edited; restore the "
        "folder's config.json, or load it with the class it was saved from"
        for key in sorted(unexpected - named)
    ]
    return errors


def check_loaded_head(model: nn.Module, loading_info) -> None:
    """Raise ``ValueError`` naming every head term, shared-embedding tensor, other missing or unexpected tensor or
    meta-device parameter that makes the loaded ``model`` differ from the model that was saved; do nothing for a
    complete, consistent folder.

    Args:
        model: the model ``from_pretrained`` built, weights loaded and tied.
        loading_info: transformers' ``LoadStateDictInfo`` (``missing_keys``, ``unexpected_keys``: sets of
            state-dict keys), after transformers' own ignore rules.
    """
    missing, unexpected = set(loading_info.missing_keys), set(loading_info.unexpected_keys)
    errors = head_term_errors(model, missing, unexpected) + embedding_errors(model, missing)
    errors += other_tensor_errors(model, missing, unexpected)
    refuse_load_errors(model, errors)


def check_loaded_body(model: nn.Module, loading_info) -> None:
    """``check_loaded_head`` for a bare encoder-decoder body: every missing tensor, the shared embedding above all
    (HF's tie logic leaves it on the meta device and reports nothing), is refused by name. Unexpected tensors are not:
    a body loaded from its LM's folder drops the head, as transformers' bodies do."""
    missing = set(loading_info.missing_keys)
    refuse_load_errors(model, embedding_errors(model, missing) + other_tensor_errors(model, missing, set()))


def refuse_load_errors(model: nn.Module, errors: list[str]) -> None:
    if errors:
        folder = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "") or "the folder"
        listed = "\n".join(f"  - {error}" for error in errors)
        raise ValueError(f"{type(model).__name__} cannot load {folder} as it was trained:\n{listed}")


class DeviceMapAtLoadMixin:
    """Keeps the device map ``from_pretrained`` loads with where the load checks read it (``offloaded_to_disk``):
    transformers sets ``hf_device_map`` only after loading, when it dispatches the model."""

    @classmethod
    def _finalize_model_loading(cls, model, load_config, loading_info):
        model.__dict__[_DEVICE_MAP_AT_LOAD] = getattr(load_config, "device_map", None)
        return super()._finalize_model_loading(model, load_config, loading_info)


class WeightChecksMixin(DeviceMapAtLoadMixin):
    """``from_pretrained`` checks that the loaded weights are finite and the head's tensors all loaded
    (modeling/load_checks.py).
    First among a model class's bases."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True returns a tuple
        check_finite_weights(model, pretrained_model_name_or_path)
        return loaded

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        # transformers' hook on the loading report (from_pretrained): a missing or unexpected head term, or a missing
        # shared embedding, is an error naming the tensor and the config field (modeling/load_checks.py).
        super()._adjust_missing_and_unexpected_keys(loading_info)
        check_loaded_head(self, loading_info)


__all__ = [
    "DeviceMapAtLoadMixin",
    "WeightChecksMixin",
    "check_loaded_body",
    "check_loaded_head",
    "embedding_errors",
    "head_term_errors",
    "offloaded_to_disk",
    "other_tensor_errors",
    "refuse_load_errors",
]
