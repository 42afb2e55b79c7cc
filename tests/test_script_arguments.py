"""Every command-line flag of the scripts explains itself: each field of each ``HfArgumentParser`` dataclass (in
scripts/*.py, hf_tiednorm/training.py and hf_tiednorm/paper_grid.py, which holds reproduce_paper.py's flags)
carries ``metadata={"help": ...}``, which ``--help`` prints."""

from __future__ import annotations

import dataclasses
import inspect

import pytest
from script_helpers import SCRIPTS, load_script

import hf_tiednorm.paper_grid
import hf_tiednorm.training

MODULES = {"hf_tiednorm.training": hf_tiednorm.training, "hf_tiednorm.paper_grid": hf_tiednorm.paper_grid}

ARGUMENT_SCRIPTS = sorted(path.stem for path in SCRIPTS.glob("*.py") if "@dataclass" in path.read_text())


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
    module = MODULES[name] if name in MODULES else load_script(name)
    classes = argument_dataclasses(module)
    assert classes, f"{name} defines no argument dataclass"
    missing = [
        f"{cls.__name__}.{field.name}" for cls in classes for field in dataclasses.fields(cls)
        if not str(field.metadata.get("help", "")).strip()
    ]
    assert not missing, f"{name}: fields without metadata help: {missing}"
