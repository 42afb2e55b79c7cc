"""The package's layers and their dependency rules (docs/layout.md, issues 23, 41 and 50), checked as contracts.

The package is laid out by concern: ``modeling/`` (the model layer, from which a saved model's two code files are
generated: ``head/`` < ``loss/`` < the shared checks < ``families/``), ``conversion/`` (with its public names
``convert/`` and ``export/``), ``publishing/``, ``training/``; the experiments live outside the package. The rules
are read with a resolver over the AST (utils/import_graph.py): every form of import counts (relative or absolute,
``from . import x``, ``import a.b as c``, inside a function, ``importlib.import_module("...")``), not a substring of an
import line, and a module's layer is the longest sub-package prefix of its dotted name, never its position."""

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
from import_graph import cycles, internal_graph, longest_chain, package_imports  # noqa: E402

PACKAGE = REPO_ROOT / "hf_tiednorm"
GENERATED = PACKAGE / "remote_code"  # generated from the model layer's modules: checked in their sources
# The layers contract (import-linter's "layers", read from the AST): top to bottom, each layer a tuple of
# sub-packages or modules. A module imports modules of its own layer or of a lower one, never of a higher one.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("training",),
    ("publishing",),
    ("conversion", "convert", "export"),
    ("registration",),
    ("modeling.families",),
    ("modeling.load_checks", "modeling.weight_checks", "modeling.code_writer", "modeling.translation_pipeline",
     "modeling.engine_checks"),
    ("modeling.loss",),
    ("modeling.head",),
    ("metrics", "remote_code"),
)
# The package's own __init__ is its front door, above every layer: it registers the family table with the Auto
# classes and liger-kernel's table and installs the writer of a saved folder's code, so it may import these and
# nothing else of the higher layers.
FRONT_DOOR_IMPORTS = {"hf_tiednorm.training.liger", "hf_tiednorm.conversion.saved_code"}
# Sub-packages that hold only their own concern and import no sibling of their layer (import-linter's
# "independence"): conversion's public names import conversion, not each other.
INDEPENDENT = (("hf_tiednorm.convert", "hf_tiednorm.export"),)
MODEL_LAYER = "hf_tiednorm.modeling"
# Packages whose __init__ is a docstring only (checked below): they import nothing, so they sit in the lowest layer.
DOCSTRING_PACKAGES = ("modeling", "modeling.head", "modeling.loss", "modeling.families")
# The model-layer modules a saved model's code does not inline: the family table (the package's Auto registration
# and the tools' questions; a saved model never asks them) and the sub-packages' docstring-only __init__ files.
NOT_INLINED = {"hf_tiednorm.modeling.families.table"}
EXPERIMENTS = ("experiments", "paper_grid")


@functools.cache
def all_imports() -> tuple:
    """Every import of the package (read once per test session)."""
    return tuple(package_imports(PACKAGE))


def package_files(root: Path = PACKAGE) -> list[Path]:
    """The package's hand-written modules (not the generated remote code)."""
    return [path for path in sorted(root.rglob("*.py")) if GENERATED not in path.parents]


def layer_of(module: str, root: Path = PACKAGE) -> int:
    """The layer of ``module`` (a dotted name in the package at ``root``), 0 the highest: the layer of the longest
    entry of ``LAYERS`` its name starts with. The package itself is -1 (the front door). A module or sub-package in
    no layer is an error, not a default."""
    package, _, rest = module.partition(".")
    if not rest:
        return -1
    if rest in DOCSTRING_PACKAGES:
        return len(LAYERS) - 1
    best = max(((len(entry), level) for level, entries in enumerate(LAYERS) for entry in entries
                if rest == entry or rest.startswith(f"{entry}.")), default=None)  # fmt: skip
    if best is None:
        first = rest.split(".")[0]
        raise KeyError(f"{root / first} has no layer: add it to LAYERS in tests/test_layout.py and docs/layout.md")
    return best[1]


def upward_imports(root: Path = PACKAGE) -> list[str]:
    """Every import in the package at ``root`` of a module of a higher layer than the importer's (the front door's
    registrations excepted)."""
    package = root.name
    found = []
    for item in all_imports() if root == PACKAGE else package_imports(root):
        if item.target == package or item.target.startswith(f"{package}."):
            if item.importer == package and item.target in FRONT_DOOR_IMPORTS:
                continue
            if layer_of(item.target, root) < layer_of(item.importer, root):
                found.append(f"{item.importer}:{item.line} imports {item.target}")
    return found


def test_every_module_of_the_package_has_a_layer():
    for path in package_files():
        parts = list(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        layer_of(".".join(parts))  # raises naming the module


def test_the_model_layers_packages_import_nothing():
    """A sub-package's ``__init__`` names its modules; importing one module never loads its siblings."""
    for name in DOCSTRING_PACKAGES:
        path = PACKAGE.joinpath(*name.split("."), "__init__.py")
        body = ast.parse(path.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr), f"{path} holds more than its docstring"


def test_the_model_layer_imports_the_package_only_relatively_and_never_the_experiments():
    """The generator inlines relative imports (utils/generate_remote_code.py); an absolute ``hf_tiednorm`` import
    would make a saved model's code need the package."""
    for item in all_imports():
        if item.importer.startswith(f"{MODEL_LAYER}."):
            assert not item.target.startswith(EXPERIMENTS), f"{item.importer}:{item.line}"
            if item.target.startswith("hf_tiednorm"):
                assert item.level > 0 or item.dynamic, f"{item.importer}:{item.line} imports {item.target}"


def test_the_library_never_imports_the_experiments():
    found = [f"{i.importer}:{i.line}" for i in all_imports() if i.target.startswith(EXPERIMENTS)]
    assert not found, found


def test_conversions_public_names_are_independent():
    for group in INDEPENDENT:
        found = [f"{i.importer}:{i.line}" for i in all_imports() for a in group for b in group
                 if a != b and i.importer.startswith(a) and i.target.startswith(b)]  # fmt: skip
        assert not found, found


def test_importing_the_package_loads_the_model_layer_and_the_liger_registration_only():
    """``import hf_tiednorm`` (what users do) loads the model layer, the registration API it exports (registration/),
    the liger-kernel registration (training/liger.py) and the writer of a saved folder's code
    (conversion/saved_code.py), and no other conversion, publishing or training module, so none of their side
    effects."""
    code = "import sys, hf_tiednorm; print(sorted(m for m in sys.modules if m.startswith('hf_tiednorm')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    loaded = set(eval(out.stdout.strip().splitlines()[-1]))
    assert "hf_tiednorm.modeling.families.common" in loaded
    others = {m for m in loaded if not m.startswith((MODEL_LAYER, "hf_tiednorm.registration")) and m != "hf_tiednorm"}
    saving = {"hf_tiednorm.conversion", "hf_tiednorm.conversion.save_checks"}  # what the code writer runs
    assert others == {"hf_tiednorm.training", *saving, *FRONT_DOOR_IMPORTS}, sorted(others)


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
# carry their own copies of these modules, and their entries stay ours (conversion/saved_code.LEGACY_MODULES).
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
    from hf_tiednorm.conversion.saved_code import foreign_auto_map

    model = normalize_tied_head(source_model("gpt2"), "cosine") if family == "wrapped" else tiny_model(family)
    model.save_pretrained(tmp_path)
    code_files = sorted(path.name for path in tmp_path.glob("*.py"))
    assert code_files == ["configuration_tiednorm.py", "modeling_tiednorm.py"], code_files
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    expected = {key: f"{value.split('.')[0].split('_')[0]}_tiednorm.{value.split('.')[1]}"
                for key, value in LEGACY_AUTO_MAPS[family].items()}  # fmt: skip
    if family == "wrapped":  # since issue 57 the wrapper's folder names its base model too (what vLLM builds)
        expected["AutoModel"] = "modeling_tiednorm.TiedNormWrappedModel"
    assert auto_map == expected
    for reference in auto_map.values():
        module, name = reference.split(".")
        assert f"\nclass {name}(" in (tmp_path / f"{module}.py").read_text()
    assert foreign_auto_map(LEGACY_AUTO_MAPS[family]) == {}  # an earlier folder's entries are still ours
    if family != "wrapped":  # a bare body too (fe3eb9a: transformers copied its module and failed on `from ..`)
        model.model.save_pretrained(tmp_path / "body")
        assert sorted(path.name for path in (tmp_path / "body").glob("*.py")) == code_files
        body_map = json.loads((tmp_path / "body" / "config.json").read_text())["auto_map"]
        assert body_map["AutoModel"] == expected["AutoModel"]


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
    """Hosting a normalized head (a new output layer, generation with frozen column terms, resizing, the output
    embedding's matrices) is written once, in head_host.py, for the families and the wrapper alike (the
    encoder-decoder family's generate only wraps it to keep an FSDP2 root gathered); saving a folder's code once, in
    code_writer.py, for every config and model."""
    import hf_tiednorm
    from hf_tiednorm.modeling.families.head_host import TiedNormHeadHostMixin

    models = (
        hf_tiednorm.TiedNormForConditionalGeneration, hf_tiednorm.TiedNormBartForConditionalGeneration,
        hf_tiednorm.TiedNormForCausalLM, hf_tiednorm.TiedNormWrappedForCausalLM,
        hf_tiednorm.TiedNormWrappedForSeq2SeqLM,
    )
    for method in ("set_output_embeddings", "generate", "resize_token_embeddings", "output_embedding_weights"):
        line = getattr(TiedNormHeadHostMixin, method).__code__.co_firstlineno
        host = f"hf_tiednorm/modeling/families/head_host.py:{line}"
        assert host in defined_functions(method), method
        assert set(defined_functions(method, delegating=False)) <= {host}, method  # others only add to it
        for model in models:
            assert issubclass(model, TiedNormHeadHostMixin), model
    saves = [where for where in defined_functions("save_pretrained") if where.startswith("hf_tiednorm/modeling/")]
    assert [where.split(":")[0] for where in saves] == ["hf_tiednorm/modeling/code_writer.py"], saves


def test_one_loss_module_and_one_penalty_terms():
    """The loss is assembled in loss.py alone: one ``penalty_terms`` (the training layer's evaluation helper is
    ``penalty_values``), one ``compose_loss``, one ``score_and_loss``."""
    for name in ("penalty_terms", "compose_loss", "score_and_loss", "head_cross_entropy"):
        (where,) = defined_functions(name)
        assert where.startswith("hf_tiednorm/modeling/loss/model_loss.py:"), (name, where)


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
FAMILY_FILES = tuple(PACKAGE / "modeling" / "families" / f"{name}.py" for name in (
    "table", "configuration", "configuration_wrapped", "configuration_encoder_decoder", "configuration_seq2seq",
    "configuration_bart", "configuration_causal", "encoder_decoder", "seq2seq", "bart", "causal", "wrapped",
))  # fmt: skip


def family_comparisons(path: Path) -> list[str]:
    """Where ``path`` compares a ``model_type`` or a class of the family table (a row's config/model class, a source or
    parent class): ``x.model_type == ...``/``in``/``startswith``, a row's ``model_type`` string, ``is``/``in``/
    ``isinstance`` against such a class."""
    import hf_tiednorm.modeling.families.table as table

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
    """Every per-family question is the table's (modeling/families/table.py: our families and the wrapper's row);
    the rest of the library, the scripts and the experiments ask it (issue 41), so a new family needs no branch
    anywhere else."""
    paths = [
        *(p for p in package_files() if p not in FAMILY_FILES),
        *(REPO_ROOT / "scripts").glob("*.py"),
        *(REPO_ROOT / "experiments").rglob("*.py"),
    ]
    found = [hit for path in paths for hit in family_comparisons(path)]
    assert not found, found


def test_the_scripts_take_every_family_class_from_the_table():
    """The training scripts and the multi-GPU worker build and load models through the family table (no tiny-family
    table or hard-coded causal classes of their own), so a new family reaches them without an edit."""
    import hf_tiednorm.modeling.families.table as table

    classes = set(table.public_classes())
    for path in (REPO_ROOT / "scripts").glob("*.py"):
        named = {n.attr for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Attribute)}
        named |= {n.id for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Name)}
        assert not named & classes, (path.name, sorted(named & classes))


def test_the_model_layer_is_exactly_what_a_saved_models_code_inlines():
    """The modules of ``hf_tiednorm/modeling/`` are the modules the two generated files inline (the closure of every
    row's configuration and model classes over relative imports: utils/generate_remote_code.py), the family table
    excepted; everything else (conversion, export, training, publishing) lives in another sub-package."""
    import generate_remote_code

    modules = generate_remote_code.read_modules()
    inlined = {name for config_roots, model_roots in generate_remote_code.family_roots().values()
               for name in (*generate_remote_code.closure(config_roots, modules),
                            *generate_remote_code.closure(model_roots, modules))}  # fmt: skip
    assert set(modules) - NOT_INLINED == inlined


def test_no_module_imports_a_higher_layer():
    """head < loss < the shared checks < families < conversion (and its public names convert/, export/) <
    publishing < training: a module imports its own layer and those below (the training layer writes cards, the card
    does not read the training layer)."""
    found = upward_imports(PACKAGE)
    assert not found, found


def test_no_import_cycle():
    """Not even one under ``TYPE_CHECKING`` or inside a function: a cycle means two modules are one concept."""
    assert not cycles(internal_graph(all_imports()))


def test_the_longest_import_chain():
    """How many modules one import sets loading in a row (issue 50: 16 before the split by concern). A deeper chain
    is a module importing across its concern; raise the bound only with a reason."""
    chain = longest_chain(internal_graph(all_imports()))
    assert len(chain) <= 15, chain


# Seven ways a model-layer module (here in modeling/head/) can import the training layer; a text reader of import
# lines (this file before issue 50) caught only the first.
UPWARD_FORMS = {
    "dotted_from": "from hf_tiednorm.training.steps import run\n",
    "relative_package": "from ...training import steps\n",
    "relative_name": "from ... import training\n",
    "absolute_package": "from hf_tiednorm import training\n",
    "import_as": "import hf_tiednorm.training as t\n",
    "lazy": "def later():\n    import hf_tiednorm.training\n",
    "import_module": "import importlib\nimportlib.import_module('hf_tiednorm.training')\n",
}


def test_every_form_of_an_upward_import_is_caught(tmp_path):
    """A synthetic package: one model-layer module per form, each caught by the resolver and the layers contract."""
    root = tmp_path / "hf_tiednorm"
    for folder in ("training", "modeling", "modeling/head"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "training" / "steps.py").write_text("def run():\n    pass\n")
    for name, source in UPWARD_FORMS.items():
        (root / "modeling" / "head" / f"{name}.py").write_text(source)
    caught = {line.split(":")[0].split(".")[-1] for line in upward_imports(root)}
    assert caught == set(UPWARD_FORMS), sorted(set(UPWARD_FORMS) - caught)


def test_a_lower_layer_importing_a_higher_one_inside_the_model_is_caught(tmp_path):
    """The head imports nothing of the loss (the loss takes a head), so a head module importing the loss fails."""
    root = tmp_path / "hf_tiednorm"
    for folder in ("modeling", "modeling/head", "modeling/loss"):
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "modeling" / "loss" / "token.py").write_text("from ..head.layer import Head\n")
    (root / "modeling" / "head" / "layer.py").write_text("Head = object\n\n\ndef f():\n    from ..loss import token\n")
    assert upward_imports(root) == ["hf_tiednorm.modeling.head.layer:5 imports hf_tiednorm.modeling.loss.token"]


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
    import hf_tiednorm.modeling.head.modes as head_modes
    import hf_tiednorm.modeling.head.settings as head_options

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
    assert not dead & set(dir(importlib.import_module("hf_tiednorm.modeling.head.layer")))
