"""Every ``auto_map`` rule in one place: a wrapped model's saved folder has the wrapper's own, never the source's
(``drop_source_auto_map``); and which entries of a config are ours (``foreign_auto_map``).

A Hub config often carries an ``auto_map`` under a built-in ``model_type`` (remote code of its own, or stale
entries). Kept inside the wrapper's ``text_config``, it (a) took the wrapper's own entries: ``register_for_auto_class``
reads and writes ``config.auto_map``, which the wrapper config delegates to ``text_config``, so the saved folder had
no top-level ``auto_map`` and did not load with ``trust_remote_code=True`` where hf_tiednorm is not installed; and
(b) named someone else's code (``"AutoModelForCausalLM": "org/repo--modeling.Model"``) that transformers would run to
build the wrapped model from ``text_config`` under ``trust_remote_code=True``. The wrapped architecture is a built-in
one, so its config needs no ``auto_map``: it is removed when the config becomes a wrapper's ``text_config``.

A saved model carries two Python files, ``configuration_tiednorm.py`` and ``modeling_tiednorm.py``, generated from
this package by ``utils/generate_remote_code.py`` (in ``hf_tiednorm/remote_code/``): ``two_file_remote_code`` puts
them in the folder and points ``auto_map`` (and the translation pipeline's ``custom_pipelines`` entry) into them,
where transformers' ``custom_object_save`` would copy the class's module and every module it imports. A class that
is not the package's (a saved copy's, loaded with ``trust_remote_code=True``; a family registered from outside) is
left to transformers. Folders saved before (``LEGACY_MODULES``: one file per package module) still name their own
copies, which they carry.

Whose code runs. transformers builds a model type registered in the process (``import hf_tiednorm`` registers ours)
instead of the folder's code, ``trust_remote_code=True`` or not. So a folder saved by another version, or whose
``modeling_tiednorm.py`` was edited, loads with the installed package's classes. A save records the version whose
code it wrote (``config.json``'s ``hf_tiednorm_version``); a load with the package's classes compares the folder's
code files with those the installed package writes for it (``saved_code_files``: the one rule of which files a save
writes) and, where they differ, logs once per folder which code runs and how to run the folder's own
(``report_whose_code_runs``, issue 58).

Ours are the only remote code a saved or published model may name.
``auto_map`` tells ``from_pretrained(..., trust_remote_code=True)`` which code to download and run. A base model's
config can carry entries pointing elsewhere (``"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"``), and
``save_pretrained`` keeps the config's entries it does not overwrite, so they would survive fine-tuning and be
uploaded. Our entries name one of the two generated files (or, in a folder saved by an earlier version, one of
its copies of a package module) without a ``repo--`` prefix; ``foreign_auto_map`` returns every other one, for
the training layer to drop and for staging to refuse.
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
# The model layer's folder (hf_tiednorm/modeling/) and the generated files beside it in the package (absent where
# this module is itself generated code).
_MODEL_LAYER = Path(__file__).resolve().parent
GENERATED_DIR = _MODEL_LAYER.parent / "remote_code"


def drop_source_auto_map(text_config) -> None:
    """Remove ``auto_map`` from ``text_config`` (a ``PreTrainedConfig`` about to become a wrapper's ``text_config``)
    in place; a dict (converted later) or None is left alone."""
    if isinstance(text_config, PreTrainedConfig):
        text_config.__dict__.pop("auto_map", None)


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


def remote_code_reference(cls: type) -> str:
    """``"modeling_tiednorm.Name"`` / ``"configuration_tiednorm.Name"``: where a saved model's code defines ``cls``,
    a class of this package. ``RuntimeError`` when the generated file lacks it (stale: regenerate)."""
    module = REMOTE_CODE_MODULES[0] if issubclass(cls, PreTrainedConfig) else REMOTE_CODE_MODULES[1]
    if f"\nclass {cls.__name__}(" not in (GENERATED_DIR / f"{module}.py").read_text():
        raise RuntimeError(
            f"{GENERATED_DIR / module}.py does not define {cls.__name__}: the generated remote code is stale; run "
            "`python utils/generate_remote_code.py`"
        )
    return f"{module}.{cls.__name__}"


def _renamed(reference: Any) -> Any:
    """A ``"module.Name"`` entry naming one of the package's modules, renamed into the generated files."""
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return reference
    module, name = reference.rsplit(".", 1)
    if module not in LEGACY_MODULES:
        return reference
    for target in REMOTE_CODE_MODULES:
        if f"\nclass {name}(" in (GENERATED_DIR / f"{target}.py").read_text():
            return f"{target}.{name}"
    return reference


def code_reference(cls: type) -> str:
    """The ``auto_map`` entry of ``cls``: in the generated files for a class of this package, else
    ``"<its module's file name>.Name"`` as transformers writes it (a saved copy's class names its own file)."""
    if _package_class(cls):
        return remote_code_reference(cls)
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
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), auto_class: code_reference(cls)}
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
    return {f"{module}.py": GENERATED_DIR / f"{module}.py" for module in modules}


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
    if not _package_class(type(model)) or not Path(source).is_dir():
        return
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
    if type(config)._auto_class is None or not _package_class(type(config)):
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
    auto_map = {key: _renamed(value) for key, value in (getattr(config, "auto_map", None) or {}).items()}
    config.auto_map = {**auto_map, type(config)._auto_class: remote_code_reference(type(config))}
    pipelines = getattr(config, "custom_pipelines", None) or {}
    for entry in pipelines.values():
        if isinstance(entry, dict) and "impl" in entry:
            entry["impl"] = _renamed(entry["impl"])
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


class TwoFileModelCodeMixin:
    """Put before ``PreTrainedModel`` in a model class's bases (every family's pretrained base, so a bare body too):
    its ``save_pretrained`` names the generated modeling file instead of copying its module (``no_module_copies``),
    and its ``from_pretrained`` says where the folder's own code is not the code that runs
    (``report_whose_code_runs``)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        report_whose_code_runs(loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path)
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        check_model_saveable(self, save_directory)  # a refused save writes nothing (modeling/save_checks.py)
        with no_module_copies(self):
            super().save_pretrained(save_directory, *args, **kwargs)


class TwoFileRemoteCodeMixin:
    """Put before ``PreTrainedConfig`` in a config class's bases: its ``save_pretrained`` (alone, or inside a
    model's) writes the two generated files as the folder's code (``two_file_remote_code``)."""

    def save_pretrained(self, save_directory, *args, **kwargs) -> None:
        check_config_saveable(self, save_directory)  # before the code files are written (modeling/save_checks.py)
        with two_file_remote_code(self, save_directory):
            super().save_pretrained(save_directory, *args, **kwargs)


__all__ = [
    "GENERATED_DIR", "LEGACY_MODULES", "REMOTE_CODE_MODULES", "VERSION_FIELD", "code_differences", "code_reference",
    "folder_code_files", "installed_version", "report_whose_code_runs", "saved_code_files", "drop_source_auto_map",
    "foreign_auto_map", "no_module_copies", "TwoFileModelCodeMixin", "TwoFileRemoteCodeMixin", "remote_code_reference",
    "two_file_remote_code",
]  # fmt: skip
