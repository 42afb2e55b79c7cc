"""The package's layers and their dependency rules (docs/layout.md, issues 23, 41 and 50).

The flat ``hf_tiednorm/*.py`` is the model layer: what a saved model's code is generated from
(utils/generate_remote_code.py writes ``hf_tiednorm/remote_code/``, the two files a saved folder carries). Above it,
in order: conversion and export (``bridges/``, with their public names ``convert/`` and ``export/``), publishing and
training; the experiments live outside the package. The rules are read with a resolver over the AST
(utils/import_graph.py): every form of import counts (relative or absolute, ``from . import x``, ``import a.b as c``,
inside a function, ``importlib.import_module("...")``), not a substring of an import line."""

from __future__ import annotations

import ast
import functools
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import FAMILIES, REPO_ROOT, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head

sys.path.insert(0, str(REPO_ROOT / "utils"))
from import_graph import cycles, internal_graph, package_imports  # noqa: E402

PACKAGE = REPO_ROOT / "hf_tiednorm"
GENERATED = PACKAGE / "remote_code"  # generated copies of model-layer modules: checked in their sources
MODEL_LAYER = sorted(path.name for path in PACKAGE.glob("*.py"))
HIGHER_LAYERS = ("hf_tiednorm.bridges", "hf_tiednorm.convert", "hf_tiednorm.export", "hf_tiednorm.training",
                 "hf_tiednorm.publishing")  # fmt: skip
# The flat modules that are not inlined into a saved model's code: the package's ``__init__`` (the family table's
# Auto registration; the public names) and the family table. A saved model never imports them.
PACKAGE_ENTRY = {"__init__.py", "families.py"}
# The layers, bottom up: a module may import its own layer and those below, never one above (the dependency rule).
LAYERS = {"model": 0, "metrics": 0, "remote_code": 0, "bridges": 1, "convert": 1, "export": 1, "publishing": 2,
          "training": 3}  # fmt: skip
EXPERIMENTS = ("experiments", "paper_grid")
# The import cycles of today, allowed by name: the restructure of issue 50 (the loss as one package; one head-mode
# module) removes them. A new cycle fails below.
KNOWN_CYCLES = {
    ("hf_tiednorm.chunked_loss", "hf_tiednorm.fused_loss", "hf_tiednorm.wrapped_fused_loss"),
    ("hf_tiednorm.head_mode_checks", "hf_tiednorm.head_modes"),
}


@functools.cache
def all_imports() -> tuple:
    """Every import of the package (read once per test session)."""
    return tuple(package_imports(PACKAGE))


def package_files(root: Path = PACKAGE) -> list[Path]:
    """The package's hand-written modules (not the generated remote code)."""
    return [path for path in sorted(root.rglob("*.py")) if GENERATED not in path.parents]


def layer_of(module: str, root: Path = PACKAGE) -> str:
    """The layer of ``module`` (a dotted name in the package at ``root``): its sub-package's, or ``model`` for the
    package itself and its flat modules. A sub-package without a layer is an error, not a default."""
    parts = module.split(".")
    if len(parts) == 1 or not (root / parts[1]).is_dir():
        return "model"
    if parts[1] not in LAYERS:
        raise KeyError(f"{root / parts[1]} has no layer: add it to LAYERS in tests/test_layout.py and docs/layout.md")
    return parts[1]


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """Every import in the package at ``root`` of a module of a higher layer than the importer's."""
    package = root.name
    found = []
    for item in all_imports() if root == PACKAGE else package_imports(root):
        if item.target == package or item.target.startswith(f"{package}."):
            if LAYERS[layer_of(item.target, root)] > LAYERS[layer_of(item.importer, root)]:
                found.append(f"{item.importer}:{item.line} imports {item.target}")
    return found


def test_the_model_layer_imports_no_higher_layer_nor_the_experiments():
    assert {"normalized_head.py", "modeling_common.py", "families.py"} <= set(MODEL_LAYER)
    for item in all_imports():
        if layer_of(item.importer) == "model":
            assert not item.target.startswith(HIGHER_LAYERS + EXPERIMENTS), f"{item.importer}:{item.line}"
            # The generator inlines `from .module import name` (utils/generate_remote_code.py).
            assert item.level <= 1, f"{item.importer}:{item.line}: a relative import above the package"


def test_the_library_never_imports_the_experiments():
    found = [f"{i.importer}:{i.line}" for i in all_imports() if i.target.startswith(EXPERIMENTS)]
    assert not found, found


def test_importing_the_package_loads_the_model_layer_only():
    """``import hf_tiednorm`` (what remote code and users do) loads no training or publishing module, and so none of
    their side effects."""
    code = "import sys, hf_tiednorm; print(sorted(m for m in sys.modules if m.startswith('hf_tiednorm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert "hf_tiednorm.modeling_common" in loaded
    assert not [module for module in loaded if module.startswith(HIGHER_LAYERS)], loaded


def test_importing_precision_registers_no_attention_until_a_run_chooses_it():
    """The fp32-softmax attention of bf16 on CPU is registered with transformers by ``choose_attention`` (through
    ``register_cpu_bf16_attention``), not as a side effect of importing the module (the benchmarks import it for
    ``cpu_description``)."""
    code = (
        "from transformers import AttentionInterface\n"
        "from hf_tiednorm.training import precision\n"
        "print(precision.CPU_BF16_ATTENTION in AttentionInterface._global_mapping)\n"
        "precision.register_cpu_bf16_attention()\n"
        "print(precision.CPU_BF16_ATTENTION in AttentionInterface._global_mapping)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    assert out.stdout.split()[-2:] == ["False", "True"]


# config.json's auto_map as a model saved before the two generated files (main at 7bdafef) wrote it: those folders
# carry their own copies of these modules, and their entries stay ours (remote_code_map.LEGACY_MODULES).
LEGACY_AUTO_MAPS = {
    "seq2seq": {"AutoConfig": "configuration_tiednorm.TiedNormSeq2SeqConfig",
                "AutoModel": "modeling_tiednorm_seq2seq.TiedNormSeq2SeqModel",
                "AutoModelForSeq2SeqLM": "modeling_tiednorm_seq2seq.TiedNormForConditionalGeneration"},
    "bart": {"AutoConfig": "configuration_tiednorm.TiedNormBartConfig",
             "AutoModel": "modeling_tiednorm_bart.TiedNormBartModel",
             "AutoModelForSeq2SeqLM": "modeling_tiednorm_bart.TiedNormBartForConditionalGeneration"},
    "causal": {"AutoConfig": "configuration_tiednorm.TiedNormCausalConfig",
               "AutoModel": "modeling_tiednorm_causal.TiedNormCausalModel",
               "AutoModelForCausalLM": "modeling_tiednorm_causal.TiedNormForCausalLM"},
    "wrapped": {"AutoConfig": "configuration_tiednorm_wrapped.TiedNormWrappedConfig",
                "AutoModelForCausalLM": "modeling_tiednorm_wrapped.TiedNormWrappedForCausalLM"},
}


@pytest.mark.parametrize("family", [*FAMILIES, "wrapped"])
def test_a_saved_model_carries_the_two_generated_files_and_auto_map_names_them(family, tmp_path):
    from hf_tiednorm.remote_code_map import foreign_auto_map

    model = normalize_tied_head(source_model("gpt2"), "cosine") if family == "wrapped" else tiny_model(family)
    model.save_pretrained(tmp_path)
    code_files = sorted(path.name for path in tmp_path.glob("*.py"))
    assert code_files == ["configuration_tiednorm.py", "modeling_tiednorm.py"], code_files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    expected = {key: f"{value.split('.')[0].split('_')[0]}_tiednorm.{value.split('.')[1]}"
                for key, value in LEGACY_AUTO_MAPS[family].items()}  # fmt: skip
    assert auto_map == expected
    for reference in auto_map.values():
        module, name = reference.split(".")
        assert f"\nclass {name}(" in (tmp_path / f"{module}.py").read_text()
    assert foreign_auto_map(LEGACY_AUTO_MAPS[family]) == {}  # an earlier folder's entries are still ours


def defined_functions(name: str, delegating: bool = True) -> list[str]:
    """Where the package defines a function or method called ``name`` (path:line); with ``delegating=False``,
    leaving out those that only wrap the next class's (they call ``super().<name>``)."""
    found = []
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                wraps = f"super().{name}(" in ast.unparse(node)
                if delegating or not wraps:
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    return found


def test_one_host_for_the_head_in_our_families_and_the_wrapper():
    """Hosting a normalized head (a new output layer, generation with frozen column terms, resizing, saving, the
    output embedding's matrices) is written once, in head_host.py, for the families and the wrapper alike (the
    encoder-decoder family's generate only wraps it to keep an FSDP2 root gathered)."""
    import hf_tiednorm
    from hf_tiednorm.head_host import TiedNormHeadHostMixin

    models = (
        hf_tiednorm.TiedNormForConditionalGeneration, hf_tiednorm.TiedNormBartForConditionalGeneration,
        hf_tiednorm.TiedNormForCausalLM, hf_tiednorm.TiedNormWrappedForCausalLM,
        hf_tiednorm.TiedNormWrappedForSeq2SeqLM,
    )
    for method in ("set_output_embeddings", "generate", "resize_token_embeddings", "save_pretrained",
                   "output_embedding_weights"):
        host = f"hf_tiednorm/head_host.py:{getattr(TiedNormHeadHostMixin, method).__code__.co_firstlineno}"
        assert host in defined_functions(method), method
        assert set(defined_functions(method, delegating=False)) <= {host}, method  # others only add to it
        for model in models:
            assert issubclass(model, TiedNormHeadHostMixin), model


def test_one_loss_module_and_one_penalty_terms():
    """The loss is assembled in loss.py alone: one ``penalty_terms`` (the training layer's evaluation helper is
    ``penalty_values``), one ``compose_loss``, one ``score_and_loss``."""
    for name in ("penalty_terms", "compose_loss", "score_and_loss", "head_cross_entropy"):
        (where,) = defined_functions(name)
        assert where.startswith("hf_tiednorm/loss.py:"), (name, where)


def test_callers_do_not_probe_the_model_with_hasattr():
    """The training layer and the scripts ask the model through its type or a shared helper
    (``adaptive.embedding_matrices``), not ``hasattr(model, ...)``."""
    paths = [*(PACKAGE / "training").glob("*.py"), *(REPO_ROOT / "scripts").glob("*.py")]
    probes = [f"{path.relative_to(REPO_ROOT)}" for path in paths if "hasattr(model" in path.read_text()]
    assert not probes, probes


def test_no_module_of_the_package_is_much_longer_than_400_lines():
    """Small single-purpose modules (issue 23: "~400 lines"; the slack is room for a docstring, not for a second
    concern: split the module instead)."""
    lengths = {str(path.relative_to(REPO_ROOT)): len(path.read_text().splitlines()) for path in package_files()}
    assert not {path: n for path, n in lengths.items() if n > 420}, lengths


# The family table and the families' own files: the only places a model_type or a family class is compared.
FAMILY_FILES = ("families.py", "configuration_tiednorm.py", "configuration_tiednorm_wrapped.py")


def family_comparisons(path: Path) -> list[str]:
    """Where ``path`` compares a ``model_type`` or a class of the family table (a row's config/model class, a source or
    parent class): ``x.model_type == ...``/``in``/``startswith``, a row's ``model_type`` string, ``is``/``in``/
    ``isinstance`` against such a class."""
    import hf_tiednorm.families as table

    model_types = set(table.ROWS)
    classes = set(table.public_classes()) | {
        cls.__name__ for row in table.ROWS.values() for cls in (row.source_class, row.hf_parent_config) if cls
    }

    def names(node) -> set[str]:
        found = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
        return found | {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}

    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        where = f"{path.relative_to(REPO_ROOT)}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Constant) and node.value in model_types:
            found.append(f"{where} names {node.value!r}")
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr == "model_type" for o in operands):
                found.append(f"{where} compares a model_type")
            elif any(names(o) & classes for o in operands if not isinstance(o, ast.Call)):
                found.append(f"{where} compares a family class")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "startswith":
            if isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "model_type":
                found.append(f"{where} matches a model_type's prefix")
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("isinstance", "issubclass"):
            if names(node.args[1]) & classes:
                found.append(f"{where} asks isinstance of a family class")
    return found


def test_no_model_type_or_family_class_is_compared_outside_the_family_table():
    """Every per-family question is the table's (families.py: our families and the wrapper's row); the rest of the
    library, the scripts and the experiments ask it (issue 41), so a new family needs no branch anywhere else."""
    paths = [
        *(p for p in package_files()
          if p.name not in FAMILY_FILES and not p.name.startswith("modeling_tiednorm_")),
        *(REPO_ROOT / "scripts").glob("*.py"),
        *(REPO_ROOT / "experiments").rglob("*.py"),
    ]
    found = [hit for path in paths for hit in family_comparisons(path)]
    assert not found, found


def test_the_scripts_take_every_family_class_from_the_table():
    """The training scripts and the multi-GPU worker build and load models through the family table (no tiny-family
    table or hard-coded causal classes of their own), so a new family reaches them without an edit."""
    import hf_tiednorm.families as table

    classes = set(table.public_classes())
    for path in (REPO_ROOT / "scripts").glob("*.py"):
        named = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        named |= {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert not named & classes, (path.name, sorted(named & classes))


def test_the_flat_modules_are_exactly_what_a_saved_models_code_inlines():
    """The flat hf_tiednorm/*.py are the modules the two generated files inline (the closure of every row's
    configuration and model classes over relative imports: utils/generate_remote_code.py) plus the package's entry;
    everything else (conversion, export, training, publishing) lives in a sub-package."""
    import generate_remote_code

    modules = generate_remote_code.read_modules()
    config_roots, model_roots = generate_remote_code.family_roots()
    inlined = {*generate_remote_code.closure(config_roots, modules),
               *generate_remote_code.closure(model_roots, modules)}
    assert set(MODEL_LAYER) - PACKAGE_ENTRY == {f"{name.split('.')[-1]}.py" for name in inlined}


def test_no_module_imports_a_higher_layer():
    """model < bridges (and the public names convert/, export/) < publishing < training: a module imports its own
    layer and those below (the training layer writes cards, the card does not read the training layer)."""
    found = upward_imports(PACKAGE)
    assert not found, found


def test_no_import_cycle_but_the_known_ones():
    found = set(cycles(internal_graph(all_imports())))
    assert found <= KNOWN_CYCLES, sorted(found - KNOWN_CYCLES)


# Seven ways a model-layer module can import the training layer; the former text reader caught only the first.
UPWARD_FORMS = {
    "dotted_from": "from hf_tiednorm.training.steps import run\n",
    "relative_package": "from .training import steps\n",
    "relative_name": "from . import training\n",
    "absolute_package": "from hf_tiednorm import training\n",
    "import_as": "import hf_tiednorm.training as t\n",
    "lazy": "def later():\n    import hf_tiednorm.training\n",
    "import_module": "import importlib\nimportlib.import_module('hf_tiednorm.training')\n",
}


def _former_text_reader(root: Path) -> list[str]:
    """tests/test_layout.py before issue 50: the imported names' text, a module's layer by position in the name."""
    found = []
    for path in root.rglob("*.py"):
        package = ".".join(path.relative_to(root.parent).parent.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                names = [node.module] if node.level == 0 else [
                    ".".join([*base, n]) for n in ([node.module] if node.module else [a.name for a in node.names])]
            for module in names:
                parts = module.split(".")
                layer = parts[1] if len(parts) > 2 and parts[1] in LAYERS else "model"
                if module.startswith("hf_tiednorm.") and LAYERS[layer] > 0:
                    found.append(path.stem)
    return found


def test_every_form_of_an_upward_import_is_caught(tmp_path):
    """A synthetic package: one model-layer module per form. The resolver catches all seven; the former text
    reader missed six (so it could not fail on them)."""
    root = tmp_path / "hf_tiednorm"
    (root / "training").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "training" / "__init__.py").write_text("")
    (root / "training" / "steps.py").write_text("from .. import dotted_from\n\n\ndef run():\n    pass\n")
    for name, source in UPWARD_FORMS.items():
        (root / f"{name}.py").write_text(source)
    caught = {line.split(":")[0].split(".")[-1] for line in upward_imports(root)}
    assert caught == set(UPWARD_FORMS), sorted(set(UPWARD_FORMS) - caught)
    assert set(_former_text_reader(root)) == {"dotted_from"}


def test_the_resolver_reads_relative_lazy_type_checking_and_dynamic_imports(tmp_path):
    from import_graph import imports_of

    root = tmp_path / "pkg"
    (root / "bridges").mkdir(parents=True)
    for name in ("__init__.py", "head.py", "bridges/__init__.py"):
        (root / name).write_text("")
    source = (
        "from typing import TYPE_CHECKING\n"
        "from .. import head\n"
        "from ..training.steps import run\n"
        "if TYPE_CHECKING:\n    from ..head import Head\n"
        "def later():\n    import importlib\n    importlib.import_module('..cards', package='pkg.bridges')\n"
    )
    (root / "bridges" / "convert.py").write_text(source)
    known = {"pkg", "pkg.head", "pkg.bridges", "pkg.bridges.convert"}
    found = {(i.target, i.runtime, i.lazy, i.dynamic) for i in imports_of(root / "bridges" / "convert.py",
                                                                          "pkg.bridges.convert", known)}
    assert found >= {("pkg.head", True, False, False), ("pkg.training.steps", True, False, False),
                     ("pkg.head", False, False, False), ("pkg.cards", True, True, True)}, found


def test_a_sub_package_without_a_layer_is_refused(tmp_path):
    (tmp_path / "hf_tiednorm" / "plugins").mkdir(parents=True)
    with pytest.raises(KeyError, match="plugins has no layer"):
        layer_of("hf_tiednorm.plugins.extra", tmp_path / "hf_tiednorm")


def test_the_layout_page_names_every_module():
    """docs/layout.md names every module of the library, the scripts and the experiments (by its file name, or its
    path inside its sub-package), so a module added without a line there fails here."""
    text = (REPO_ROOT / "docs" / "layout.md").read_text()
    modules = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "scripts").glob("*.py"), *(REPO_ROOT / "scripts").glob("*.sh"),
               *(REPO_ROOT / "experiments").rglob("*.py"), *(REPO_ROOT / "utils").glob("*.py")]  # fmt: skip
    missing = [
        str(path.relative_to(REPO_ROOT)) for path in modules
        if path.name not in ("__init__.py", "__main__.py", "sacrebleu_local.py") and f"`{path.name}`" not in text
        and f"{path.parent.name}/{path.name}`" not in text
    ]  # fmt: skip
    assert not missing, f"docs/layout.md does not name {missing}"


def test_each_name_is_imported_from_the_module_that_defines_it():
    """No module re-exports another's names for others to import (normalized_head.py once re-exported the mode
    registry and the options): an import of a head_modes / head_options name goes to head_modes / head_options."""
    import hf_tiednorm.head_modes as head_modes
    import hf_tiednorm.head_options as head_options

    homes = {name: "head_modes" for name in head_modes.__all__} | {name: "head_options" for name in
                                                                       head_options.__all__}  # fmt: skip
    found = []
    paths = [*package_files(), *(REPO_ROOT / "tests").glob("*.py"), *(REPO_ROOT / "experiments").rglob("*.py")]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == "normalized_head":
                found += [f"{path.relative_to(REPO_ROOT)}: {a.name}" for a in node.names if a.name in homes]
    assert not found, found
    dead = {"check_head_mode", "mode_column_terms"}  # unused helpers removed (issue 41)
    assert not dead & set(dir(importlib.import_module("hf_tiednorm.normalized_head")))
