"""Every command-line flag of the scripts explains itself: each field of each ``HfArgumentParser`` dataclass (in
scripts/*.py, experiments/*.py, hf_tiednorm/training/ and experiments/paper_grid/, which holds reproduce_paper.py's
flags) carries ``metadata={"help": ...}``, which ``--help`` prints."""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
from script_helpers import EXPERIMENTS, SCRIPTS, load_script

# The modules that define argument dataclasses (experiments/paper_grid/ is on sys.path: conftest.py).
MODULES = ("hf_tiednorm.training.arguments", "hf_tiednorm.training.precision", "paper_grid.cells")

ARGUMENT_SCRIPTS = sorted(
    path.stem for folder in (SCRIPTS, EXPERIMENTS) for path in folder.glob("*.py") if "@dataclass" in path.read_text()
)


def argument_dataclasses(module) -> list[type]:
    """The dataclasses that ``module`` defines itself (not those it imports)."""
    return [
        obj for _, obj in inspect.getmembers(module, inspect.isclass)
        if dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
    ]


def test_the_scripts_with_flags_are_found():
    assert {"run_translation", "run_clm", "benchmark_speed"} <= set(ARGUMENT_SCRIPTS)


@pytest.mark.parametrize("name", [*MODULES, *ARGUMENT_SCRIPTS])
def test_every_flag_has_a_help(name):
    module = importlib.import_module(name) if name in MODULES else load_script(name)
    classes = argument_dataclasses(module)
    assert classes, f"{name} defines no argument dataclass"
    missing = [
        f"{cls.__name__}.{field.name}" for cls in classes for field in dataclasses.fields(cls)
        if not str(field.metadata.get("help", "")).strip()
    ]
    assert not missing, f"{name}: fields without metadata help: {missing}"
