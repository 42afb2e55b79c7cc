"""A saved model carries exactly two generated Python files (issue 50), generated for its own family (issue 56):
``configuration_tiednorm.py`` and ``modeling_tiednorm.py``, built from the package by ``utils/generate_remote_code.py``
into ``hf_tiednorm/remote_code/<family>/``.

Checked here: the committed files are what the generator writes now (``--check``, and that it fails when one is
stale); each family's files hold that family's code only; every family and the wrapper save them alone, with
``auto_map`` into them, and load from them with ``trust_remote_code=True`` where the package is not installed, with
the package's logits; folders saved by earlier versions (7bdafef: one file per package module; bcb37a5: two files
for every family) still load, with the package and without it."""

from __future__ import annotations

import ast
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import torch
from testing_utils import (
    FAMILIES,
    REPO_ROOT,
    TINY_DECODER,
    TINY_ENCODER_DECODER,
    model_inputs,
    run_without_package,
    tiny_model,
)
from tiny_architectures import inputs_for, source_model
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

import hf_tiednorm
from hf_tiednorm.conversion.saved_code import GENERATED_DIR, REMOTE_CODE_MODULES, foreign_auto_map
from hf_tiednorm.convert import normalize_tied_head

sys.path.insert(0, str(REPO_ROOT / "utils"))
import generate_remote_code  # noqa: E402

CODE_FILES = [f"{module}.py" for module in REMOTE_CODE_MODULES]
FAMILY_CODE = {path.name: path for path in sorted(GENERATED_DIR.iterdir()) if path.is_dir()}  # row name -> folder
# Earlier versions whose saved folders must still load: 7bdafef (one file per package module), bcb37a5 (two generated
# files holding every family's code, before issue 56).
EARLIER_VERSIONS = {"7bdafef": "modeling_tiednorm_", "bcb37a5": "modeling_tiednorm"}  # version -> its module's name


def test_the_generated_files_are_current():
    """CI's check: `python utils/generate_remote_code.py --check` (run it without --check to regenerate)."""
    assert generate_remote_code.main(["--check"]) == 0, "run `python utils/generate_remote_code.py`"


def test_the_check_fails_naming_a_stale_file(tmp_path, monkeypatch, capsys):
    shutil.copytree(GENERATED_DIR, tmp_path, dirs_exist_ok=True)
    edited = tmp_path / "causal" / CODE_FILES[1]
    edited.write_text(edited.read_text() + "# edited by hand\n")
    (tmp_path / "retired").mkdir()
    (tmp_path / "retired" / CODE_FILES[0]).write_text("# a family no row generates any more\n")
    monkeypatch.setattr(generate_remote_code, "OUTPUT", tmp_path)
    assert generate_remote_code.main(["--check"]) == 1
    assert "causal/modeling_tiednorm.py" in capsys.readouterr().err
    assert generate_remote_code.main([]) == 0  # regenerates, and removes what no family generates
    assert generate_remote_code.main(["--check"]) == 0
    assert not (tmp_path / "retired" / CODE_FILES[0]).exists()


# What a family's folder must not carry: the other families' modules and what no saved model runs (issue 56: a causal
# folder carried the Marian, BART, wrapper and translation-pipeline code, 1,155 lines, and the conversion's).
OTHER_FAMILIES = {
    "causal": ("seq2seq.py", "bart.py", "wrapped.py", "wrapped_loss.py", "configuration_encoder_decoder.py",
               "translation_pipeline.py", "accumulated.py"),
    "seq2seq": ("causal.py", "bart.py", "wrapped.py", "configuration_causal.py", "configuration_bart.py"),
    "bart": ("causal.py", "wrapped.py", "configuration_causal.py", "configuration_seq2seq.py"),
    "wrapped": ("causal.py", "seq2seq.py", "bart.py", "configuration_encoder_decoder.py", "configuration_causal.py"),
}  # fmt: skip


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
def test_each_familys_files_hold_its_own_model_layer_modules_as_readable_code(family):
    """Only the model layer's modules are inlined (no conversion, export, card, liger-kernel, registration or training
    module), only the family's own, each under a rule naming its file, with its docstring and comments; the
    configuration file imports no torch."""
    config_text, model_text = ((FAMILY_CODE[family] / name).read_text() for name in CODE_FILES)
    text = config_text + model_text
    inlined = re.findall(r"^# -{30} (\S+) -+$", text, flags=re.MULTILINE)
    assert "hf_tiednorm/modeling/head/layer.py" in inlined
    assert all(re.fullmatch(r"hf_tiednorm/modeling/([a-z_]+/)?[a-z_0-9]+\.py", label) for label in inlined), inlined
    assert not [label for label in inlined if label.rsplit("/", 1)[-1] in OTHER_FAMILIES[family]], inlined
    assert "register_with_liger" not in text and "serve_liger_request" not in text  # training/liger.py's wiring
    assert len(set(inlined)) == len(inlined)
    assert hf_tiednorm.TiedNormHead.__doc__.splitlines()[0] in text  # docstrings kept
    assert "# the tied weight was resized in place" in text  # comments kept
    imports = {node.module if isinstance(node, ast.ImportFrom) else alias.name
               for node in ast.walk(ast.parse(config_text)) if isinstance(node, (ast.Import, ast.ImportFrom))
               for alias in node.names}  # fmt: skip
    assert not {name for name in imports if name and name.split(".")[0] == "torch"}, imports


def _synthetic_package(tmp_path: Path, files: dict[str, str]) -> dict:
    root = tmp_path / "pkg"
    root.mkdir()
    for name, text in {"__init__.py": "", **files}.items():
        (root / name).write_text(text)
    return generate_remote_code.read_modules(root, layer="pkg")


BASE = '''"""Base: the scale."""

from __future__ import annotations

import math

SCALE = math.pi  # a comment that stays
'''
MODEL = '''from __future__ import annotations

import math

from .base import SCALE as S


def scaled(x: int) -> float:
    from .base import SCALE  # a lazy import: its name is in the same file now

    return x * S * SCALE / math.pi
'''


def test_the_generator_inlines_a_closure_in_dependency_order(tmp_path):
    modules = _synthetic_package(tmp_path, {"base.py": BASE, "model.py": MODEL, "unused.py": "X = 1\n"})
    order = generate_remote_code.closure(["pkg.model"], modules)
    assert order == ["pkg.base", "pkg.model"]  # what model needs, dependencies first; unused is left out
    text = generate_remote_code.render("modeling_pkg", order, modules, set())
    namespace = {}
    exec(compile(text, "modeling_pkg.py", "exec"), namespace)
    assert namespace["scaled"](2) == pytest.approx(2 * 3.141592653589793)
    assert text.index("pkg/base.py") < text.index("pkg/model.py") and text.count("import math\n") == 1
    assert '"""Base: the scale."""' in text and "# a comment that stays" in text and "from .base" not in text


def test_the_generator_leaves_out_what_no_root_reaches(tmp_path):
    """Tree shaking: a helper nothing in the file reaches from the roots, and an import only it used, stay out."""
    unused = "import os\n\n\ndef unused_helper():\n    return os.sep\n\n\ndef kept():\n    return scaled(1)\n"
    modules = _synthetic_package(tmp_path, {"base.py": BASE, "model.py": MODEL + "\n\n" + unused})
    order = generate_remote_code.closure(["pkg.model"], modules)
    text = generate_remote_code.render("modeling_pkg", order, modules, set(), "", None)
    assert "def unused_helper" in text and "import os" in text  # no roots given: nothing is shaken
    shaken = generate_remote_code.unreached(order, modules, {"kept"})
    text = generate_remote_code.render("modeling_pkg", order, modules, set(), "", shaken)
    namespace = {}
    exec(compile(text, "modeling_pkg.py", "exec"), namespace)
    assert namespace["kept"]() == pytest.approx(3.141592653589793)
    assert "unused_helper" not in text and "import os" not in text and "def scaled" in text


@pytest.mark.parametrize(("files", "message"), [
    ({"base.py": "_helper = 1\n", "model.py": "from .base import _helper as h\n_helper = 2\n"},
     "pkg/model.py and pkg/base.py both define '_helper'"),
    ({"model.py": "from .training import steps\n"}, "imports pkg.training, which a saved model's code cannot carry"),
    ({"model.py": "import pkg.base\n", "base.py": ""}, "an absolute import of the package"),
])  # fmt: skip
def test_the_generator_stops_naming_the_module_it_cannot_inline(tmp_path, files, message):
    modules = _synthetic_package(tmp_path, files)
    with pytest.raises(SystemExit, match=re.escape(message)):
        order = generate_remote_code.closure(["pkg.model"], modules)
        generate_remote_code.render("modeling_pkg", order, modules, set())


# The wrapper's two classes: around a causal LM and around an encoder-decoder.
WRAPPED_SOURCES = {"wrapped": "gpt2", "wrapped_seq2seq": "m2m_100"}


def _save(family: str, folder: Path):
    if family in WRAPPED_SOURCES:
        model = normalize_tied_head(source_model(WRAPPED_SOURCES[family]), "cosine")
    else:
        model = tiny_model(family)
    model.eval().save_pretrained(folder)
    return model


def _load_and_compare(folder: Path, data: Path, auto_class: str, label: str) -> str:
    """Isolated-process code: load ``folder`` with remote code, print whether its logits equal those in ``data``."""
    return (
        f"data = torch.load({str(data)!r})\n"
        f"model = {auto_class}.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()\n"
        "with torch.no_grad():\n"
        "    same = torch.equal(model(**data['inputs']).logits, data['logits'])\n"
        f"print({label!r}, type(model).__module__.rsplit('.', 1)[-1], same)\n"
    )


OLD_PACKAGE_SCRIPT = """
import json, sys, torch
import hf_tiednorm
from hf_tiednorm.convert import normalize_tied_head
from transformers import GPT2Config, GPT2LMHeadModel
assert hf_tiednorm.__file__.startswith(sys.argv[1]), hf_tiednorm.__file__
sizes = json.loads(sys.argv[3])
for family in json.loads(sys.argv[2]):
    torch.manual_seed(0)
    if family == "wrapped":
        model = normalize_tied_head(GPT2LMHeadModel(GPT2Config(vocab_size=96, n_embd=32, n_layer=2, n_head=4,
                                                               n_positions=64)), "cosine")
    else:
        row = hf_tiednorm.FAMILIES[family]
        config = row.config_class(**sizes["encoder_decoder" if row.is_encoder_decoder else "decoder"],
                                  head_mode="cosine")
        model = row.lm_class(config)
    model.eval().save_pretrained(f"old/{family}")
    ids = torch.randint(4, model.config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    inputs = {"input_ids": ids}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = ids[:, :5]
    with torch.no_grad():
        torch.save({"inputs": inputs, "logits": model(**inputs).logits}, f"old/{family}.pt")
print("saved")
"""


def _saved_by(version: str, root: Path) -> Path:
    """Folders of every family and the wrapper saved by the package as it was at git commit ``version`` (its
    ``hf_tiednorm/`` extracted from the history and run in a process of its own), with their inputs and logits."""
    archive = root / "old.tar"
    made = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "-o", str(archive), version, "hf_tiednorm"],
                          capture_output=True, text=True)  # fmt: skip
    if made.returncode != 0:
        pytest.skip(f"needs a git checkout holding {version}: {made.stderr.strip()}")
    with tarfile.open(archive) as tar:
        tar.extractall(root / "source", filter="data")
    sizes = {"encoder_decoder": TINY_ENCODER_DECODER | {"dropout": 0.0}, "decoder": TINY_DECODER}
    out = subprocess.run(
        [sys.executable, "-c", OLD_PACKAGE_SCRIPT, str(root / "source"), json.dumps(OLD_FAMILIES), json.dumps(sizes)],
        cwd=root, env={**__import__("os").environ, "PYTHONPATH": str(root / "source")}, capture_output=True, text=True,
    )  # fmt: skip
    assert out.returncode == 0 and "saved" in out.stdout, out.stderr[-3000:]
    return root / "old"


OLD_FAMILIES = [*FAMILIES, "wrapped"]


@pytest.fixture(scope="module")
def old_folders(tmp_path_factory):
    """{version: the folder holding its saved folders} for every ``EARLIER_VERSIONS``."""
    return {version: _saved_by(version, tmp_path_factory.mktemp(f"saved_by_{version}")) for version in EARLIER_VERSIONS}


def test_every_family_and_the_wrapper_save_two_files_and_load_from_them_without_the_package(old_folders, tmp_path):
    """One isolated process (no hf_tiednorm importable) loads, with trust_remote_code=True: each family's and the
    wrapper's new folder (around a causal LM and around an encoder-decoder; two files; logits equal to the
    package's) and each folder of the earlier versions (their own code)."""
    families = OLD_FAMILIES
    # The earlier versions' folders load first: once a new causal folder's code registered its type (issue 60), it
    # runs every folder of that type in the process (tests/training/test_trl.py says so once per folder).
    code, earlier = "", "import torch\nfrom transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM\n"
    for family in [*families, "wrapped_seq2seq"]:
        model = _save(family, tmp_path / family)
        assert sorted(path.name for path in (tmp_path / family).glob("*.py")) == CODE_FILES
        config = json.loads((tmp_path / family / "config.json").read_text())
        assert {value.split(".")[0] for value in config["auto_map"].values()} <= set(REMOTE_CODE_MODULES)
        assert config["auto_map"]["AutoConfig"] == f"configuration_tiednorm.{type(model.config).__name__}"
        assert f"modeling_tiednorm.{type(model).__name__}" in config["auto_map"].values()
        for entry in (config.get("custom_pipelines") or {}).values():
            assert entry["impl"] == "modeling_tiednorm.TiedNormTranslationPipeline"
        inputs = inputs_for(model) if family in WRAPPED_SOURCES else model_inputs(model)
        with torch.no_grad():
            torch.save({"inputs": inputs, "logits": model(**inputs).logits}, tmp_path / f"{family}.pt")
        auto = "AutoModelForSeq2SeqLM" if model.config.is_encoder_decoder else "AutoModelForCausalLM"
        code += _load_and_compare(tmp_path / family, tmp_path / f"{family}.pt", auto, f"new-{family}")
        for version, old in old_folders.items() if family in families else ():
            earlier += _load_and_compare(old / family, old / f"{family}.pt", auto, f"{version}-{family}")
    lines = run_without_package(earlier + code, cwd=tmp_path).strip().splitlines()
    assert "new-wrapped_seq2seq modeling_tiednorm True" in lines, lines
    for family in families:
        assert f"new-{family} modeling_tiednorm True" in lines, lines
        for version, module in EARLIER_VERSIONS.items():
            found = [line for line in lines if line.startswith(f"{version}-{family} ")]
            assert len(found) == 1 and found[0].split()[1].startswith(module) and found[0].endswith(" True"), lines


@pytest.mark.parametrize("version", EARLIER_VERSIONS)
@pytest.mark.parametrize("family", OLD_FAMILIES)
def test_a_folder_of_an_earlier_version_loads_with_the_package(old_folders, version, family):
    """The package (no remote code) reads a folder an earlier version saved (one file per module; two files of every
    family's code): same logits; its auto_map is still ours (not refused as foreign by staging or dropped by a
    training run)."""
    old = old_folders[version]
    config = json.loads((old / family / "config.json").read_text())
    if version == "7bdafef":
        assert sorted(path.name for path in (old / family).glob("*.py")) != CODE_FILES  # the earliest form
    assert foreign_auto_map(config["auto_map"]) == {}
    auto = AutoModelForSeq2SeqLM if config.get("is_encoder_decoder") else AutoModelForCausalLM
    model = auto.from_pretrained(old / family).eval()
    assert type(model).__module__.startswith("hf_tiednorm.")
    data = torch.load(old / f"{family}.pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**data["inputs"]).logits, data["logits"], rtol=0, atol=0)


def test_a_config_saved_alone_carries_the_configuration_file_only(tmp_path):
    tiny_model("causal").config.save_pretrained(tmp_path)
    assert sorted(path.name for path in tmp_path.glob("*.py")) == ["configuration_tiednorm.py"]
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": "configuration_tiednorm.TiedNormCausalConfig"}


def test_the_readme_says_how_many_lines_a_reviewer_reads():
    """README's figure (rounded: "a causal model's about N lines") is within 10% of the causal family's files."""
    readme = (REPO_ROOT / "README.md").read_text()
    stated = int(re.search(r"a causal model's\s+about\s+([\d,]+)\s+lines", readme).group(1).replace(",", ""))
    lines = sum(len((FAMILY_CODE["causal"] / name).read_text().splitlines()) for name in CODE_FILES)
    assert abs(lines - stated) <= 0.1 * lines, f"README.md says about {stated} lines; the two files have {lines}"


def test_saving_over_an_earlier_folder_keeps_and_names_the_code_it_no_longer_uses(tmp_path):
    """Only a byte-identical copy of a package module (transformers' own copy, just made) is deleted; an earlier
    save's file of such a name that the model's save did not overwrite (here: the wrapper's, beside a causal model)
    is kept and named in a warning."""
    from transformers.testing_utils import CaptureLogger

    from hf_tiednorm.conversion import saved_code as remote_code_map

    (tmp_path / "modeling_tiednorm_wrapped.py").write_text("# an earlier version's copy\n")
    with CaptureLogger(remote_code_map.logger) as captured:
        tiny_model("causal").save_pretrained(tmp_path)
    assert (tmp_path / "modeling_tiednorm_wrapped.py").read_text() == "# an earlier version's copy\n"
    assert "['modeling_tiednorm_wrapped.py'], which the saved model does not use" in captured.out
    assert not (tmp_path / "normalized_head.py").exists()  # transformers' copies are gone


# What loading a folder's code may change in the process (issue 56): nothing of torch's global hooks, nothing of
# transformers' Auto name tables but a causal LM's own model type, which the Trainer's label smoother needs.
SIDE_EFFECTS_PROBE = """
import json, torch, transformers
from torch.nn.modules import module as torch_module
from transformers.models.auto import configuration_auto, modeling_auto
def hooks():
    return {name: len(value) for name, value in vars(torch_module).items()
            if name.startswith("_global_") and isinstance(value, dict)}
def tables():
    found = {name: dict(value) for name, value in vars(modeling_auto).items()
             if name.endswith("_MAPPING_NAMES") and isinstance(value, dict)}
    registered = {key: value.__name__ for key, value in configuration_auto.CONFIG_MAPPING._extra_content.items()}
    return found | {"CONFIG_MAPPING_NAMES": dict(configuration_auto.CONFIG_MAPPING_NAMES), "AutoConfig": registered}
def changes(folder, auto):
    hooks_before, tables_before = hooks(), tables()
    getattr(transformers, auto).from_pretrained(folder, trust_remote_code=True)
    hooks_after, tables_after = hooks(), tables()
    added = sorted(f"{table}[{key!r}]={value!r}" for table, entries in tables_after.items()
                   for key, value in entries.items() if tables_before[table].get(key) != value)
    return {"hooks": {name: hooks_after[name] - count for name, count in hooks_before.items()
                      if hooks_after[name] != count}, "tables": added}
"""
ALLOWED_TABLE_ENTRIES = {  # what loading each folder may add: a causal LM's own model type, for the label smoother
    # and for TRL's reference reload with trust_remote_code=False (issue 60)
    "causal": {"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES['tiednorm_causal']='TiedNormForCausalLM'",
               "AutoConfig['tiednorm_causal']='TiedNormCausalConfig'"},
    "wrapped": {"MODEL_FOR_CAUSAL_LM_MAPPING_NAMES['tiednorm_wrapped']='TiedNormWrappedForCausalLM'",
                "AutoConfig['tiednorm_wrapped']='TiedNormWrappedConfig'"},
}  # fmt: skip


def test_loading_a_folder_changes_no_global_hook_and_no_auto_table_but_a_causal_lms_own_type(tmp_path):
    """Each family's and the wrapper's folder loads in the process without the package: torch's global module,
    parameter and buffer hooks are as they were, and transformers' Auto name tables too, but for a causal LM's own
    model type (bcb37a5: 2 global hooks per folder; 2 entries added also when a Marian folder loaded)."""
    code = SIDE_EFFECTS_PROBE
    for family in [*OLD_FAMILIES, "wrapped_seq2seq"]:
        model = _save(family, tmp_path / family)
        auto = "AutoModelForSeq2SeqLM" if model.config.is_encoder_decoder else "AutoModelForCausalLM"
        code += f"print({family!r}, json.dumps(changes({str(tmp_path / family)!r}, {auto!r})))\n"
    lines = run_without_package(code, cwd=tmp_path).strip().splitlines()
    found = {line.split(" ", 1)[0]: json.loads(line.split(" ", 1)[1]) for line in lines if line[:1].isalpha()}
    assert sorted(found) == sorted([*OLD_FAMILIES, "wrapped_seq2seq"]), lines
    for family, changed in found.items():
        assert changed["hooks"] == {}, (family, changed)
        assert set(changed["tables"]) <= ALLOWED_TABLE_ENTRIES.get(family, set()), (family, changed)


@pytest.mark.parametrize("family", sorted(OTHER_FAMILIES))
def test_no_generated_file_reads_interpreter_frames(family):
    """No ``sys._getframe``, frame walk or traceback frame read in what a folder runs (bcb37a5: a ``__bool__`` read its
    caller's local ``component``, a frame walk placed a warning; until issue 55's end, the scoring guard's backbone
    pre-hook walked the call stack to find the replaced forward that ran the backbone: it now decides from counts)."""
    pattern = re.compile(r"_getframe|f_locals|f_back|f_globals|f_code|currentframe|tb_frame|inspect\.stack")
    for name in CODE_FILES:
        tree = ast.parse((FAMILY_CODE[family] / name).read_text())
        for node in tree.body:
            assert not pattern.search(ast.unparse(node)), (name, ast.unparse(node)[:200])


def _lines(family: str, name: str) -> int:
    return len((FAMILY_CODE[family] / name).read_text().splitlines())


# What a reviewer of a saved folder reads, in lines of Python (docstrings and comments included). Issue 56's budgets
# (HF's Llama: configuration 102 + modeling 503 lines): a causal folder 1,800, any other 2,200, a configuration file
# 400 without torch. The configuration files meet theirs; the folders do not yet (docs/layout.md gives the measured
# lines), so each is held at most at its ceiling here, a little above its lines at issue 56's end, until it does.
ISSUE_BUDGETS = {"causal": 1800, "seq2seq": 2200, "bart": 2200, "wrapped": 2200}
CEILINGS = {"causal": 2991, "seq2seq": 3291, "bart": 3254, "wrapped": 3205}
CONFIG_BUDGET = 400


@pytest.mark.parametrize("family", sorted(ISSUE_BUDGETS))
def test_a_folders_code_stays_within_its_budget(family):
    """bcb37a5: every folder carried 5,195 lines (configuration 2,015, importing torch; modeling 3,180)."""
    config, modeling = (_lines(family, name) for name in CODE_FILES)
    assert config <= CONFIG_BUDGET, f"{family}: configuration_tiednorm.py has {config} lines, over {CONFIG_BUDGET}"
    assert config + modeling <= CEILINGS[family], f"{family}: {config + modeling} lines, over {CEILINGS[family]}"


@pytest.mark.xfail(strict=True, reason="issue 56's folder budgets are not met yet (docs/layout.md, measured lines)")
@pytest.mark.parametrize("family", sorted(ISSUE_BUDGETS))
def test_a_folders_code_meets_issue_56s_budget(family):
    assert sum(_lines(family, name) for name in CODE_FILES) <= ISSUE_BUDGETS[family]


def test_docs_layout_gives_each_folders_lines_as_measured():
    """docs/layout.md's table of what a saved folder carries states each family's lines (within 10%)."""
    text = (REPO_ROOT / "docs" / "layout.md").read_text()
    for family in ISSUE_BUDGETS:
        row = re.search(rf"^\| {family}\b[^|]*\| ([\d,]+)[^|]*\| ([\d,]+) \| ([\d,]+) \|", text, flags=re.MULTILINE)
        assert row, f"docs/layout.md has no row for {family}"
        stated = [int(value.replace(",", "")) for value in row.groups()]
        measured = [_lines(family, CODE_FILES[0]), _lines(family, CODE_FILES[1])]
        measured.append(sum(measured))
        for said, real in zip(stated, measured, strict=True):
            assert abs(said - real) <= 0.1 * real, f"docs/layout.md: {family} {stated}, measured {measured}"
