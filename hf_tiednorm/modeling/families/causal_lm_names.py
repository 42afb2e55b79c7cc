"""A causal LM of this code adds its own model type to transformers' tables, nothing else. The Trainer's label smoother
shifts the labels of causal LMs named in ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; TRL's DPO, KTO and GRPO reload their
reference from the policy's folder with ``trust_remote_code=False``, which runs the code the user already trusted once
a folder's own code registered its type, as the package registers its own (docs/code_notes.md)."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoConfig, AutoModelForCausalLM
from transformers.models.auto.configuration_auto import CONFIG_MAPPING
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
from transformers.utils import logging


def recognise_as_causal_lm(model_type: str, class_name: str) -> None:
    """Name ``class_name`` under ``model_type`` among transformers' causal LMs (a name already there is kept)."""
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(model_type, class_name)


def recognise_built_causal_lm(model) -> None:
    """``recognise_as_causal_lm`` for ``model``; where a folder's own code runs (a ``modeling_tiednorm.py``, not the
    package), also register its classes for its type: the first folder's code then runs every folder of that type
    (transformers prefers a registered class), which is said once for a folder whose code files differ."""
    config, module = model.config, Path(__file__)  # this module: the package's, or a folder's modeling_tiednorm.py
    recognise_as_causal_lm(config.model_type, type(model).__name__)
    if module.name != "modeling_tiednorm.py":  # the package registers its own classes and says whose code runs
        return
    try:
        trusted = CONFIG_MAPPING[config.model_type]  # the package's, or the first folder's built in this process
    except KeyError:
        AutoConfig.register(config.model_type, trusted := type(config))
        AutoModelForCausalLM.register(trusted, type(model), exist_ok=True)
    folder = Path(str(config.name_or_path))  # "" for a model built in memory: no folder, nothing to compare
    differ = [name for name in ("configuration_tiednorm.py", module.name) if config.name_or_path
              and (folder / name).is_file() and (folder / name).read_bytes() != module.with_name(name).read_bytes()]
    if differ and trusted is type(config):
        logging.get_logger(__name__).warning_once(
            f"{folder} carries its own code ({', '.join(differ)} differ), but the code this process first trusted for "
            f"{config.model_type!r} runs it ({module.parent}; registered so that TRL can reload a reference without "
            f"trust_remote_code). To run its own: transformers.dynamic_module_utils.get_class_from_dynamic_module("
            f"'modeling_tiednorm.{type(model).__name__}', '{folder}').from_pretrained('{folder}'), or a new process."
        )


__all__ = ["recognise_as_causal_lm", "recognise_built_causal_lm"]
