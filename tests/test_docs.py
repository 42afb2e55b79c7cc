"""Docs that cannot rot: README.md and docs/*.md checked against the repository.

* every relative link (``[text](path#anchor)``) points at a file that exists, and an anchor at a heading of it;
* every repository path quoted anywhere in the text (``scripts/…``, ``hf_tiednorm/…``, ``results/…``, ``tests/…``,
  ``docs/…``, ``model_cards/…``, ``experiments/…``, ``.ci/…``; ``{a,b}`` and ``*`` expanded) exists — output folders
  such as ``runs/…`` and placeholders with ``<…>`` are not repository paths and are not checked;
* every ``hf_tiednorm.<module>[.<attribute>]`` named in backticks imports and resolves;
* every ``--flag`` of a quoted command (a ```bash block line, or an inline code span that starts with ``python``,
  ``bash``, ``accelerate`` or ``tiednorm-``) is an option of the script or console script it is passed to, as that
  one's ``--help`` lists it;
* (tests/test_docs_run.py runs every command and snippet of these pages.)
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import io
import itertools
import re
import shlex
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path: one of the tracked top-level folders, not preceded by a path character (so /home/x/scripts/...
# or ../shared/... are not taken for one).
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:hf_tiednorm|scripts|tests|docs|results|model_cards|experiments|\.ci)/[\w.{},*/<>-]*)"
)
DOTTED = re.compile(r"`(?:python -m )?(hf_tiednorm(?:\.\w+)+)")
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
COMMAND_SPAN = re.compile(r"`((?:python|bash|accelerate|ACCELERATE_USE_CPU=true|tiednorm-)[^`]*)`")
SCRIPT = re.compile(r"^(?:scripts|experiments)/[\w/]+\.(?:py|sh)$")
# Console scripts (setup.cfg) and their modules, each with build_parser().
CONSOLE_SCRIPTS = {
    "tiednorm-convert": "hf_tiednorm.convert",
    "tiednorm-card": "hf_tiednorm.publishing.model_card",
    "tiednorm-push": "hf_tiednorm.publishing.hub",
    "tiednorm-export": "hf_tiednorm.export",
}


def markdown_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"^```.*?^```", "", path.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {github_anchor(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def expand_braces(path: str) -> list[str]:
    parts = re.split(r"\{([^{}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def broken_links(md: Path) -> list[str]:
    """Relative links of ``md`` whose target file (or heading anchor) does not exist."""
    broken = []
    for target in LINK.findall(md.read_text(encoding="utf-8")):
        if re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        path = (md.parent / file_part).resolve() if file_part else md
        if not path.exists():
            broken.append(f"{md.name}: link {target!r}: {path} does not exist")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{md.name}: link {target!r}: no heading with anchor #{anchor} in {path.name}")
    return broken


def broken_repo_paths(md: Path, repo: Path = REPO) -> list[str]:
    """Repository paths quoted in ``md`` that do not exist under ``repo``."""
    broken = []
    for quoted in REPO_PATH.findall(md.read_text(encoding="utf-8")):
        quoted = quoted.rstrip(".,")
        if "<" in quoted or ">" in quoted:  # a placeholder such as results/paper_summary_<budget>.json
            continue
        for path in expand_braces(quoted):
            if not (list(repo.glob(path)) if "*" in path else (repo / path).exists()):
                broken.append(f"{md.name}: quoted path {path!r} does not exist in the repository")
    return broken


def unresolved_names(md: Path) -> list[str]:
    """``hf_tiednorm.x.y`` names in backticks that are neither a module nor an attribute of one."""
    unresolved = []
    for name in sorted(set(DOTTED.findall(md.read_text(encoding="utf-8")))):
        parts = name.split(".")
        for split in range(len(parts), 0, -1):
            module_name = ".".join(parts[:split])
            try:
                if importlib.util.find_spec(module_name) is None:
                    continue
            except ModuleNotFoundError:  # a name below a module that is no package
                continue
            obj = importlib.import_module(module_name)
            try:
                for attribute in parts[split:]:
                    obj = getattr(obj, attribute)
            except AttributeError:
                unresolved.append(f"{md.name}: {name!r}: {module_name} has no {'.'.join(parts[split:])}")
            break
        else:
            unresolved.append(f"{md.name}: {name!r} is no module")
    return unresolved


def quoted_commands(text: str) -> list[str]:
    """The commands a markdown text quotes: lines of ```bash blocks (``\\`` continuations joined) and inline code
    spans that start like a command."""
    commands = []
    for block in BASH_BLOCK.findall(text):
        commands += [line.strip() for line in block.replace("\\\n", " ").splitlines() if line.strip()]
    outside_blocks = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return commands + COMMAND_SPAN.findall(outside_blocks)


@functools.cache
def options_of(program: str) -> frozenset[str]:
    """The options that ``program`` (a console script, an ``hf_tiednorm`` module, or a script path; main_job.sh
    passes its flags on to run_translation.py) lists in its ``--help``."""
    module = CONSOLE_SCRIPTS.get(program, program if program.startswith("hf_tiednorm.") else None)
    if module is not None:
        parser = importlib.import_module(module).build_parser()
        return frozenset(option for action in parser._actions for option in action.option_strings)
    if program == "scripts/main_job.sh":
        return options_of("scripts/run_translation.py") | {"--quick"}
    path = REPO / program
    name = "docs_check_" + "_".join(path.relative_to(REPO).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    sys.path.insert(0, str(path.parent))  # as when the script runs: its folder first
    argv, out = sys.argv, io.StringIO()
    try:
        spec.loader.exec_module(module)
        sys.argv = [str(path), "--help"]
        with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
            module.main()
    finally:
        sys.argv = argv
        sys.path.remove(str(path.parent))
    return frozenset(re.findall(r"--[\w.-]+", out.getvalue()))


def unknown_flags(md: Path) -> list[str]:
    """``--flags`` of quoted commands that the program they are passed to does not have."""
    unknown = []
    for command in quoted_commands(md.read_text(encoding="utf-8")):
        try:
            tokens = shlex.split(command, comments=True)
        except ValueError:  # an unbalanced quote in a table cell
            tokens = command.split()
        for position, token in enumerate(tokens):
            module = token.startswith("hf_tiednorm.") and tokens[position - 1] == "-m"  # python -m hf_tiednorm.x
            if token in CONSOLE_SCRIPTS or module or SCRIPT.match(token):
                if not (token in CONSOLE_SCRIPTS or module or (REPO / token).exists()):
                    break  # a missing script is reported by test_quoted_repo_paths_exist
                known = options_of(token)
                for flag in tokens[position + 1 :]:
                    name = flag.split("=")[0]
                    if name.startswith("--") and name not in known:
                        unknown.append(f"{md.name}: {token} has no option {name} (in `{command}`)")
                break
    return unknown


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_relative_links_exist(md):
    assert broken_links(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_quoted_repo_paths_exist(md):
    assert broken_repo_paths(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_quoted_module_names_resolve(md):
    assert unresolved_names(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_quoted_command_flags_exist(md):
    assert unknown_flags(md) == []


def test_checks_fail_on_a_broken_reference(tmp_path):
    """The checks above can fail: a markdown file with a broken link, anchor, path and name is reported."""
    (tmp_path / "other.md").write_text("# A heading\n", encoding="utf-8")
    md = tmp_path / "page.md"
    md.write_text(
        "See [that](other.md#a-heading), [gone](missing.md), [bad anchor](other.md#no-such-heading).\n"
        "Run `python scripts/run_translation.py scripts/configs/no_such_config.yaml`, read\n"
        "`results/paper_summary_full.{md,nope}` and `hf_tiednorm/no_such_module.py`, not `/home/x/scripts/a.py`\n"
        "nor `runs/out` nor `results/paper_summary_<budget>.json`; call `hf_tiednorm.convert.no_such_function`.\n"
        "```bash\ntiednorm-convert a b --head-mode cosine --no-such-option \\\n    --generic\n"
        "python scripts/run_clm.py --head_mode cosine --no_such_flag 1\n```\n",
        encoding="utf-8",
    )
    links = broken_links(md)
    assert len(links) == 2 and "missing.md" in links[0] and "#no-such-heading" in links[1]
    paths = broken_repo_paths(md)
    assert [p.split("'")[1] for p in paths] == [
        "scripts/configs/no_such_config.yaml", "results/paper_summary_full.nope", "hf_tiednorm/no_such_module.py"
    ]
    assert unresolved_names(md) == ["page.md: 'hf_tiednorm.convert.no_such_function': hf_tiednorm.convert has no "
                                    "no_such_function"]
    assert [flag.split(" (in")[0] for flag in unknown_flags(md)] == [
        "page.md: tiednorm-convert has no option --no-such-option",
        "page.md: scripts/run_clm.py has no option --no_such_flag",
    ]
    good = tmp_path / "good.md"
    good.write_text(
        "[ok](other.md#a-heading) `scripts/run_translation.py` `hf_tiednorm.convert`\n"
        "`python scripts/run_clm.py --head_mode cosine --output_dir=runs/x` `tiednorm-card folder --languages de en`\n",
        encoding="utf-8",
    )
    assert broken_links(good) == broken_repo_paths(good) == unresolved_names(good) == unknown_flags(good) == []



def test_readme_step_one_loads_the_tokenizer_with_trust_remote_code_too():
    """A converted folder's tokenizer loads without a y/N prompt only with ``trust_remote_code`` (or after ``import
    hf_tiednorm``): README's first step says so (issue 60; docs/converting.md explains why)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    step = text[text.index("## 1. "):text.index("## 2. ")]
    assert re.search(r"AutoTokenizer\.from_pretrained\([^)]*trust_remote_code=True\)", step)
