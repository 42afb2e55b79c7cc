"""The code a saved folder carries, and every ``auto_map`` rule: which entries of a config are ours.

A saved model carries two Python files, ``configuration_tiednorm.py`` and ``modeling_tiednorm.py``, generated for its
family by ``utils/generate_remote_code.py`` (``hf_tiednorm/remote_code/<family>/``): ``save_pretrained`` of a
package class runs inside ``saved_with_code`` (the model layer's save hook, set when the package is imported),
which puts the family's files in the folder and points ``auto_map`` (and an encoder-decoder's ``custom_pipelines``
entry for the translation pipeline) into them, where transformers' ``custom_object_save`` would copy the class's
module and every module it imports. A class that is not the package's (a saved copy's, loaded with
``trust_remote_code=True``; a family registered from outside) is left to transformers. Folders saved before
(``LEGACY_MODULES``: one file per package module) still name their own copies, which they carry.

Whose code runs. transformers builds a model type registered in the process (``import hf_tiednorm`` registers ours)
instead of the folder's code, ``trust_remote_code=True`` or not. So a save records the version whose code it wrote
(``config.json``'s ``hf_tiednorm_version``), and a load with the package's classes compares the folder's code files
with those the installed package writes for it (``saved_code_files``) and, where they differ, logs once per folder
which code runs and how to run the folder's own (``report_whose_code_runs``, issue 58). A refused save writes nothing
(save_checks.py).

Ours are the only remote code a saved or published model may name. A base model's config can carry ``auto_map``
entries pointing elsewhere (``"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"``), and ``save_pretrained``
keeps the entries it does not overwrite, so they would survive fine-tuning and be uploaded. Our entries name one of
the two generated files (or, in a folder saved by an earlier version, one of its copies of a package module) without
a ``repo--`` prefix; ``foreign_auto_map`` returns every other one, for the training layer to drop and for staging to
refuse.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig
from transformers.utils import logging

from ..modeling.code_writer import CODE_HOOKS
from ..modeling.families.table import family_of_config
from ..modeling.translation_pipeline import TASK as TRANSLATION_TASK
from .save_checks import check_config_saveable, check_model_saveable

logger = logging.get_logger(__name__)

REMOTE_CODE_MODULES = ("configuration_tiednorm", "modeling_tiednorm")
# The config.json key of the package version whose code a save wrote into the folder.
VERSION_FIELD = "hf_tiednorm_version"
# The package modules a folder saved before the two generated files names in its auto_map (the flat
# hf_tiednorm/*.py of 7bdafef, copied one file each): such a folder carries them and still loads.
LEGACY_MODULES = frozenset({
    "accumulated_loss", "adaptive", "causal_lm_names", "chunked_loss", "configuration_tiednorm",
    "configuration_tiednorm_wrapped", "embeddings", "folded_weight", "fused_loss", "head_host", "head_mode_checks",
    "head_modes", "head_options", "load_checks", "loss", "lossless_start", "modeling_common",
    "modeling_tiednorm_bart", "modeling_tiednorm_causal", "modeling_tiednorm_seq2seq", "modeling_tiednorm_wrapped",
    "normalized_head", "outputs", "peft_guard", "pipeline_translation", "regularizers", "remote_code_map",
    "scoring_guard", "tie_topology", "token_loss", "weight_checks", "wrapped_fused_loss",
})  # fmt: skip  (scoring_guard: issue 47, a model-layer module transformers copies like the others)
# The model layer's folder and the generated files of each family (hf_tiednorm/remote_code/<row name>/).
_MODEL_LAYER = Path(__file__).resolve().parent.parent / "modeling"
GENERATED_DIR = _MODEL_LAYER.parent / "remote_code"


def _is_ours(reference: Any) -> bool:
    if reference is None:
        return True
    if isinstance(reference, (list, tuple)):  # a tokenizer's [slow, fast] pair
        return all(_is_ours(item) for item in reference)
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return False
    return reference.rsplit(".", 1)[0] in LEGACY_MODULES.union(REMOTE_CODE_MODULES)


def foreign_auto_map(auto_map: dict[str, Any] | None) -> dict[str, Any]:
    """The entries of ``auto_map`` (a config's) that do not name our remote code: another repository's
    (``owner/repo--module.Class``) or a module that is not ours. {} when every entry is ours."""
    return {key: value for key, value in (auto_map or {}).items() if not _is_ours(value)}


def _package_class(cls: type) -> bool:
    """Whether ``cls`` is defined by one of this package's model-layer modules (not by a generated file, a saved copy
    or a test) while the generated files are at hand."""
    module = sys.modules.get(cls.__module__)
    path = Path(getattr(module, "__file__", "") or "").resolve()
    return GENERATED_DIR.is_dir() and _MODEL_LAYER in path.parents


def family_code(row) -> Path:
    """The folder of the two generated files of family table row ``row`` (``hf_tiednorm/remote_code/<name>/``)."""
    return GENERATED_DIR / row.name


def remote_code_reference(cls: type, row) -> str:
    """``"modeling_tiednorm.Name"`` / ``"configuration_tiednorm.Name"``: where the saved code of ``row``'s family
    defines ``cls``, a class of this package. ``RuntimeError`` when the generated file lacks it (stale: regenerate)."""
    module = REMOTE_CODE_MODULES[0] if issubclass(cls, PreTrainedConfig) else REMOTE_CODE_MODULES[1]
    path = family_code(row) / f"{module}.py"
    if not path.is_file() or f"\nclass {cls.__name__}(" not in path.read_text():
        raise RuntimeError(
            f"{path} does not define {cls.__name__}: the generated remote code is stale; run "
            "`python utils/generate_remote_code.py`"
        )
    return f"{module}.{cls.__name__}"


def _renamed(reference: Any, row) -> Any:
    """A ``"module.Name"`` entry naming one of the package's modules, renamed into ``row``'s generated files."""
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return reference
    module, name = reference.rsplit(".", 1)
    if module not in LEGACY_MODULES:
        return reference
    for target in REMOTE_CODE_MODULES:
        if f"\nclass {name}(" in (family_code(row) / f"{target}.py").read_text():
            return f"{target}.{name}"
    return reference


def code_reference(cls: type, row) -> str:
    """The ``auto_map`` entry of ``cls``: in ``row``'s generated files for a class of this package, else
    ``"<its module's file name>.Name"`` as transformers writes it (a saved copy's class names its own file)."""
    if _package_class(cls):
        return remote_code_reference(cls, row)
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


@contextmanager
def no_module_copies(model) -> Iterator[None]:
    """While ``model.save_pretrained`` runs, for a model class of this package: transformers' ``custom_object_save``
    copies nothing (it would copy the class's module and the modules it imports, and it follows single-dot imports
    only), the config's ``auto_map`` names the class in the generated modeling file, and the config's own save writes
    the two files (``two_file_remote_code``). transformers asks the class (``is_remote_code`` is a classmethod), so
    the class's ``_auto_class`` is cleared for the save and restored after it."""
    cls = type(model)
    auto_class = cls._auto_class
    if auto_class is None or not _package_class(cls):
        yield
        return
    row = family_of_config(model.config)
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), auto_class: code_reference(cls, row)}
    own = "_auto_class" in vars(cls)
    cls._auto_class = None
    try:
        yield
    finally:
        if own:
            cls._auto_class = auto_class
        else:
            del cls._auto_class


def installed_version() -> str | None:
    """The installed hf_tiednorm's version; None where the package is not installed (this file as remote code)."""
    try:
        return importlib.metadata.version("hf_tiednorm")
    except importlib.metadata.PackageNotFoundError:
        return None


def saved_code_files(config: PreTrainedConfig, *, with_model: bool = True) -> dict[str, Path]:
    """The code files a save of ``config`` writes into its folder (file name -> the package's generated file it is a
    copy of): what the installed package generates for the config's family. ``with_model``: the modeling file too
    (a config saved alone names no model). The one rule ``two_file_remote_code`` writes by and a load compares a
    folder's code against (``code_differences``)."""
    modules = REMOTE_CODE_MODULES if with_model else REMOTE_CODE_MODULES[:1]
    return {f"{module}.py": family_code(family_of_config(config)) / f"{module}.py" for module in modules}


def folder_code_files(config: PreTrainedConfig) -> list[str]:
    """The code files a loaded ``config``'s folder names as its own: the modules of its ``auto_map`` entries and of
    its pipelines' implementations (``module.Name``, no other repository's), as file names."""
    pipelines = getattr(config, "custom_pipelines", None) or {}
    named = [*(getattr(config, "auto_map", None) or {}).values(),
             *(entry.get("impl") for entry in pipelines.values() if isinstance(entry, dict))]  # fmt: skip
    named = [item for value in named for item in (value if isinstance(value, (list, tuple)) else [value])]
    modules = {name.rsplit(".", 1)[0] for name in named if isinstance(name, str) and "." in name and "--" not in name}
    return sorted(f"{module}.py" for module in modules)


def code_differences(folder: Path, config: PreTrainedConfig) -> list[str]:
    """How the code files that ``folder`` (loaded as ``config``) names differ from those the installed package writes
    for it (``saved_code_files``); [] where they are the same bytes, or the folder names no code of its own."""
    expected = saved_code_files(config)
    differences = []
    for name in folder_code_files(config):
        if name not in expected:
            differences.append(f"{name} is not a file this version writes (it writes {', '.join(expected)})")
        elif not (folder / name).is_file():
            differences.append(f"{name} is missing")
        elif (folder / name).read_bytes() != expected[name].read_bytes():
            differences.append(f"{name} differs from the installed package's")
    return differences


_REPORTED: set[str] = set()  # the folders whose code was reported (once each)


def report_whose_code_runs(model, source: str | os.PathLike) -> None:
    """Log once per folder, where ``model`` (a class of the installed package, loaded from ``source``) was loaded from
    a folder whose own code differs from what the installed package writes for it: which code runs, and how to run
    the folder's own. Nothing for a class that is not the package's (the folder's own code already runs)."""
    if not hasattr(model, "config") or not _package_class(type(model)) or not Path(str(source)).is_dir():
        return  # a config (its model reports), another class, or a Hub id
    folder = Path(source)
    key = str(folder.resolve())
    differences = [] if key in _REPORTED else code_differences(folder, model.config)
    if not differences:
        return
    _REPORTED.add(key)
    saved, installed = getattr(model.config, VERSION_FIELD, None), installed_version()
    saved_by = f"saved by hf_tiednorm {saved}" if saved else "saved with no hf_tiednorm version recorded (before 0.1)"
    entries = (getattr(model.config, "auto_map", None) or {}).values()
    own = next((e for e in entries if isinstance(e, str) and e.endswith(f".{type(model).__name__}")), None)
    own = own or f"{REMOTE_CODE_MODULES[1]}.{type(model).__name__}"
    logger.warning(
        "%s carries its own code (%s%s: %s), but the installed hf_tiednorm %s runs it: transformers builds a model "
        "type registered in this process (import hf_tiednorm registers ours) instead of a folder's code, "
        "trust_remote_code=True or not. To run the folder's own code: transformers.dynamic_module_utils."
        "get_class_from_dynamic_module(%r, %r).from_pretrained(%r), or load it in a process that does not import "
        "hf_tiednorm; to give the folder the installed code, save the loaded model again",
        folder, saved_by, "; edited since, or another build" if saved == installed else "", "; ".join(differences),
        installed, own, str(folder), str(folder),
    )


@contextmanager
def two_file_remote_code(config: PreTrainedConfig, save_directory: str | os.PathLike) -> Iterator[None]:
    """While ``config.save_pretrained(save_directory)`` runs (itself, or inside a model's ``save_pretrained``):
    the folder holds the two generated files instead of transformers' copies of the package's modules, and the
    config's ``auto_map`` and ``custom_pipelines`` entries name them. Nothing changes for a config class that is not
    the package's (see the module docstring)."""
    row = family_of_config(config)
    if type(config)._auto_class is None or not _package_class(type(config)) or row is None:
        yield
        return
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    left = []
    for module in LEGACY_MODULES - set(REMOTE_CODE_MODULES):
        if (folder / f"{module}.py").is_file():
            left.append(f"{module}.py")
    if left:  # not ours to delete: an earlier save's code, or the user's
        logger.warning("%s holds %s, which the saved model does not use (auto_map names configuration_tiednorm.py "
                       "and modeling_tiednorm.py); delete them if an earlier save left them", folder, sorted(left))
    auto_map = {key: _renamed(value, row) for key, value in (getattr(config, "auto_map", None) or {}).items()}
    config.auto_map = {**auto_map, type(config)._auto_class: remote_code_reference(type(config), row)}
    pipelines = getattr(config, "custom_pipelines", None) or {}
    for entry in pipelines.values():
        if isinstance(entry, dict) and "impl" in entry:
            entry["impl"] = _renamed(entry["impl"], row)
    named = [*config.auto_map.values(), *(entry.get("impl") for entry in pipelines.values() if isinstance(entry, dict))]
    # the modeling file where a model (or its pipeline) is named: not a config's
    with_model = any(str(name).startswith(f"{REMOTE_CODE_MODULES[1]}.") for name in named)
    for name, generated in saved_code_files(config, with_model=with_model).items():
        shutil.copyfile(generated, folder / name)
    setattr(config, VERSION_FIELD, installed_version())  # whose code the folder now carries
    config._auto_class = None  # an instance attribute, over the class's: transformers then copies nothing
    try:
        yield
    finally:
        del config._auto_class


def add_model_entries(model) -> None:
    """The ``auto_map`` and ``custom_pipelines`` entries a model's folder needs beside its own class's: the bare body
    under ``AutoModel`` where its class is defined beside the LM's (in the same generated file, or the module
    transformers copies for a family from outside the package), and an encoder-decoder's translation pipeline, so
    that ``pipeline("tiednorm-translation", model=folder, trust_remote_code=True)`` serves the folder alone."""
    row, config = family_of_config(model.config), model.config
    # The row's base model (the wrapper's is TiedNormWrappedModel, not the wrapped backbone transformers' base_model
    # gives: an engine that builds the AutoModel class, vLLM's Transformers backend, then meets its refusal).
    body_class = getattr(row, "base_model_class", None) or type(model.base_model)
    if row is not None and not isinstance(model, body_class) and body_class.__module__ == type(model).__module__:
        config.auto_map = {**(getattr(config, "auto_map", None) or {}), "AutoModel": code_reference(body_class, row)}
    if row is not None and row.pipeline_class is not None and config.is_encoder_decoder:
        entry = {"impl": code_reference(row.pipeline_class, row), "pt": ["AutoModelForSeq2SeqLM"], "tf": [],
                 "type": "text"}  # fmt: skip  (the form Pipeline.save_pretrained writes)
        config.custom_pipelines = {**(getattr(config, "custom_pipelines", None) or {}), TRANSLATION_TASK: entry}


@contextmanager
def saved_with_code(obj, save_directory: str | os.PathLike) -> Iterator[None]:
    """The model layer's save hook (``CODE_HOOKS["save"]``): around ``save_pretrained`` of a config or model of the
    package, the folder gets its family's two generated files and ``auto_map`` names them (module docstring)."""
    if isinstance(obj, PreTrainedConfig):
        check_config_saveable(obj, save_directory)  # before the code files are written (save_checks.py)
        with two_file_remote_code(obj, save_directory):
            yield
        return
    check_model_saveable(obj, save_directory)  # a refused save writes nothing (save_checks.py)
    add_model_entries(obj)
    with no_module_copies(obj):
        yield


def install_code_writer() -> None:
    """Make ``save_pretrained`` of the package's classes write their family's generated code, and their
    ``from_pretrained`` report where a folder's own code is not the code that runs (``import hf_tiednorm`` does it)."""
    CODE_HOOKS["save"], CODE_HOOKS["load"] = saved_with_code, report_whose_code_runs


__all__ = [
    "GENERATED_DIR", "LEGACY_MODULES", "REMOTE_CODE_MODULES", "VERSION_FIELD", "add_model_entries", "code_differences",
    "code_reference", "family_code", "folder_code_files", "foreign_auto_map", "install_code_writer",
    "installed_version", "no_module_copies", "remote_code_reference", "report_whose_code_runs", "saved_code_files",
    "saved_with_code", "two_file_remote_code",
]  # fmt: skip
