"""The three wings (docs/layout.md, issue 23): the model wing is the flat ``hf_tiednorm/`` and travels with a saved
model as remote code; the training wing (``hf_tiednorm/training/``) and publishing (``hf_tiednorm/publishing/``) are
tools around it; the experiments (``experiments/``) live outside the package. The walls are checked here: the model
wing imports neither of the other wings, the library never imports the experiments, a saved model's remote code is
model-wing files only, and the modules a saved model names in its config.json stay where they were."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from testing_utils import FAMILIES, REPO_ROOT, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head

PACKAGE = REPO_ROOT / "hf_tiednorm"
MODEL_WING = sorted(path.name for path in PACKAGE.glob("*.py"))
OTHER_WINGS = ("hf_tiednorm.bridges", "hf_tiednorm.convert", "hf_tiednorm.export", "hf_tiednorm.training",
               "hf_tiednorm.publishing")
# The flat files that are not remote code: the package's front door (``import hf_tiednorm``: the family table and its
# Auto registration). A saved model never imports them: its auto_map names the modeling files directly.
FRONT_DOOR = {"__init__.py", "families.py"}
# The house, bottom up: a module may import its own floor and those below, never one above (issue 41).
FLOORS = {"model": 0, "metrics": 0, "bridges": 1, "convert": 1, "export": 1, "publishing": 2, "training": 3}
EXPERIMENTS = ("experiments", "paper_grid")


def imports_of(path: Path, package: str) -> list[tuple[str, int]]:
    """(absolute module name, relative level) of every import in ``path``, a module of ``package``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                found.append((node.module, 0))
                continue
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            names = [node.module] if node.module else [alias.name for alias in node.names]
            found += [(".".join([*base, name]), node.level) for name in names]
    return found


def test_the_model_wing_imports_neither_training_nor_publishing_nor_experiments():
    assert {"normalized_head.py", "modeling_common.py", "families.py"} <= set(MODEL_WING)
    for name in MODEL_WING:
        for module, level in imports_of(PACKAGE / name, "hf_tiednorm"):
            assert not module.startswith(OTHER_WINGS + EXPERIMENTS), f"hf_tiednorm/{name} imports {module}"
            # Remote code follows single-dot relative imports only (transformers' get_relative_imports).
            assert level <= 1, f"hf_tiednorm/{name}: a relative import above the package ({module})"


def test_the_library_never_imports_the_experiments():
    for path in PACKAGE.rglob("*.py"):
        package = ".".join(path.relative_to(REPO_ROOT).parent.parts)
        for module, _ in imports_of(path, package):
            assert not module.startswith(EXPERIMENTS), f"{path.relative_to(REPO_ROOT)} imports {module}"


def test_importing_the_package_loads_the_model_wing_only():
    """``import hf_tiednorm`` (what remote code and users do) loads no training or publishing module, and so none of
    their side effects."""
    code = "import sys, hf_tiednorm; print(sorted(m for m in sys.modules if m.startswith('hf_tiednorm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    loaded = eval(out.stdout.strip().splitlines()[-1])
    assert "hf_tiednorm.modeling_common" in loaded
    assert not [module for module in loaded if module.startswith(OTHER_WINGS)], loaded


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


# config.json's auto_map as a model saved before the three wings (main at 8dfefd0) wrote it: those folders name these
# modules and classes, so they must stay flat model-wing files with these classes for such a model to load.
SAVED_AUTO_MAPS = {
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
def test_a_saved_model_carries_model_wing_files_only_and_keeps_its_auto_map(family, tmp_path):
    model = normalize_tied_head(source_model("gpt2"), "cosine") if family == "wrapped" else tiny_model(family)
    model.save_pretrained(tmp_path)
    code_files = sorted(path.name for path in tmp_path.glob("*.py"))
    assert code_files and set(code_files) <= set(MODEL_WING), code_files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == SAVED_AUTO_MAPS[family]
    for reference in auto_map.values():
        module, name = reference.split(".")
        assert f"{module}.py" in code_files
        assert hasattr(importlib.import_module(f"hf_tiednorm.{module}"), name)


def defined_functions(name: str, delegating: bool = True) -> list[str]:
    """Where the package defines a function or method called ``name`` (path:line); with ``delegating=False``,
    leaving out those that only wrap the next class's (they call ``super().<name>``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
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
    """The loss is assembled in loss.py alone: one ``penalty_terms`` (the training wing's evaluation helper is
    ``penalty_values``), one ``compose_loss``, one ``score_and_loss``."""
    for name in ("penalty_terms", "compose_loss", "score_and_loss", "head_cross_entropy"):
        (where,) = defined_functions(name)
        assert where.startswith("hf_tiednorm/loss.py:"), (name, where)


def test_callers_do_not_probe_the_model_with_hasattr():
    """The training wing and the scripts ask the model through its type or a shared helper
    (``adaptive.embedding_matrices``), not ``hasattr(model, ...)``."""
    paths = [*(PACKAGE / "training").glob("*.py"), *(REPO_ROOT / "scripts").glob("*.py")]
    probes = [f"{path.relative_to(REPO_ROOT)}" for path in paths if "hasattr(model" in path.read_text()]
    assert not probes, probes


def test_no_module_of_the_package_is_much_longer_than_400_lines():
    """Small single-purpose modules (issue 23: "~400 lines"; the slack is room for a docstring, not for a second
    concern: split the module instead)."""
    lengths = {str(path.relative_to(REPO_ROOT)): len(path.read_text().splitlines()) for path in PACKAGE.rglob("*.py")}
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
        *(p for p in PACKAGE.rglob("*.py")
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


def floor_of(module: str) -> str:
    """The floor of ``hf_tiednorm.<module>``: its sub-package, or ``model`` for a flat file."""
    parts = module.split(".")
    return parts[1] if len(parts) > 2 and parts[1] in FLOORS else "model"


def test_the_flat_wing_is_exactly_the_remote_code():
    """The flat hf_tiednorm/*.py are the files save_pretrained copies as remote code (transformers'
    ``get_relative_import_files`` of every row's modeling and config files: our families and the wrapper) plus the
    package's front door; everything else (conversion, export, training, publishing) lives in a sub-package."""
    from transformers.dynamic_module_utils import get_relative_import_files

    import hf_tiednorm.families as table

    travelling = set()
    for row in table.ROWS.values():
        classes = [row.config_class, row.base_model_class, *(lm for lm, _ in row.lm_classes)]
        for cls in filter(None, classes):
            module = Path(sys.modules[cls.__module__].__file__)
            travelling |= {Path(path).name for path in [module, *get_relative_import_files(module)]}
    assert set(MODEL_WING) - FRONT_DOOR == travelling, sorted(set(MODEL_WING) ^ travelling)


def test_no_import_runs_back_up_the_house():
    """model wing (flat) < bridges (and the public names convert/, export/) < publishing < training: a module imports
    its own floor and those below (the training wing writes cards, the card does not read the training wing)."""
    found = []
    for path in PACKAGE.rglob("*.py"):
        package = ".".join(path.relative_to(REPO_ROOT).parent.parts)
        own = FLOORS[floor_of(f"{package}.{path.stem}")]
        for module, _ in imports_of(path, package):
            if module.startswith("hf_tiednorm.") and FLOORS[floor_of(module)] > own:
                found.append(f"{path.relative_to(REPO_ROOT)} imports {module}")
    assert not found, found


def test_the_layout_page_names_every_module():
    """docs/layout.md names every module of the library, the scripts and the experiments (by its file name, or its
    path inside its wing), so a module added without a line there fails here."""
    text = (REPO_ROOT / "docs" / "layout.md").read_text()
    modules = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "scripts").glob("*.py"), *(REPO_ROOT / "scripts").glob("*.sh"),
               *(REPO_ROOT / "experiments").rglob("*.py")]  # fmt: skip
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
    paths = [*PACKAGE.rglob("*.py"), *(REPO_ROOT / "tests").glob("*.py"), *(REPO_ROOT / "experiments").rglob("*.py")]
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[-1] == "normalized_head":
                found += [f"{path.relative_to(REPO_ROOT)}: {a.name}" for a in node.names if a.name in homes]
    assert not found, found
    dead = {"check_head_mode", "mode_column_terms"}  # unused helpers removed (issue 41)
    assert not dead & set(dir(importlib.import_module("hf_tiednorm.normalized_head")))
