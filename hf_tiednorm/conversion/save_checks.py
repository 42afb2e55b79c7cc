"""A refused save leaves the folder as it was: every check that can refuse a ``save_pretrained`` runs before its
first write.

transformers' ``PreTrainedModel.save_pretrained`` creates the folder and its code files, then lets the config refuse
itself (``PreTrainedConfig.save_pretrained`` validates just before writing ``config.json``) and the generation config
after that. A model whose head mode had been unregistered wrote ``configuration_tiednorm.py`` and
``modeling_tiednorm.py`` before the refusal, and the folder then failed later with transformers' "Should have a
`model_type` key" (issue 58). ``check_model_saveable`` (a model's save) and ``check_config_saveable`` (a config's)
run those same checks first, and one more: every head of the model scores with the definition its mode's name is
registered under (head/modes.py), since the saved config records that name only.

The package's save hook runs them (saved_code.py); a folder's own code registers no mode, so it needs none of this.
"""

from __future__ import annotations

import os
import warnings

from huggingface_hub.errors import StrictDataclassError
from torch import nn

from ..modeling.head.modes import HeadMode
from ..modeling.head.settings import HEAD_MODE_REGISTRY


def check_config_saveable(config, save_directory: str | os.PathLike) -> None:
    """What ``config.save_pretrained(save_directory)`` would refuse, raised before anything is written: the config's
    own validation (``@strict`` validators: a head mode or head term not registered, a contradiction) and generation
    parameters set on the config. ``ValueError`` naming the folder, with the cause."""
    try:
        if hasattr(config, "validate"):
            config.validate()
        generation = config._get_generation_parameters() if hasattr(config, "_get_generation_parameters") else {}
        if generation:
            raise ValueError(
                f"generation parameters are set in the model config ({generation}): they go into "
                "model.generation_config"
            )
    except (ValueError, StrictDataclassError) as error:  # a @strict validator's refusal is not a ValueError
        refused = f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written"
        raise ValueError(f"{refused}: {error}") from error


def check_model_saveable(model: nn.Module, save_directory: str | os.PathLike) -> None:
    """What ``model.save_pretrained(save_directory)`` would refuse, raised before the folder is created or any file
    written: a head whose mode is not the definition registered under its name (unregistered, or replaced past the
    registry), the config's checks (``check_config_saveable``) and the generation config's strict validation as
    transformers runs it at save time."""
    # The heads, found by the mode they hold
    for head in (module for module in model.modules() if isinstance(getattr(module, "mode", None), HeadMode)):
        registered = HEAD_MODE_REGISTRY.get(head.head_mode)
        if registered is not head.mode:
            what = "is not registered" if registered is None else f"is registered as {registered!r}"
            raise ValueError(
                f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written: the model scores "
                f"with head mode {head.mode!r}, but its name {head.head_mode!r} {what} in this process, and the saved "
                "config records the name only, so the folder would not reload as this model. Register the model's "
                f"mode again (register_head_mode({head.mode!r})) and save"
            )
    check_config_saveable(model.config, save_directory)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and model.can_generate():
        strict = getattr(generation_config, "_original_object_hash", None) != hash(generation_config)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers' own save warns again; this check only refuses
                generation_config.validate(strict=strict)
        except ValueError as error:
            raise ValueError(
                f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written: the generation "
                f"config is invalid ({error})"
            ) from error


__all__ = ["check_config_saveable", "check_model_saveable"]
