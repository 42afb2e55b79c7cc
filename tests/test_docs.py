"""Docs that cannot rot: README.md and docs/*.md checked against the repository.

* every relative link (``[text](path#anchor)``) points at a file that exists, and an anchor at a heading of it;
* every repository path quoted anywhere in the text (``scripts/…``, ``hf_tiednorm/…``, ``results/…``, ``tests/…``,
  ``docs/…``, ``model_cards/…``, ``experiments/…``, ``.ci/…``; ``{a,b}`` and ``*`` expanded) exists — output folders
  such as ``runs/…`` and placeholders with ``<…>`` are not repository paths and are not checked;
* every ``hf_tiednorm.<module>[.<attribute>]`` named in backticks imports and resolves;
* the README's Python snippets run, in order, in one namespace, offline, in a temporary folder (they use tiny
  configs built in code). A snippet that cannot run in a test says so on its **first line**, visibly:
  ``# not run by tests/test_docs.py: <reason>``.
"""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SKIP_MARKER = "# not run by tests/test_docs.py:"

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# A repository path: one of the tracked top-level folders, not preceded by a path character (so /work/x/scripts/...
# or ../shared/... are not taken for one).
REPO_PATH = re.compile(
    r"(?<![\w./~-])((?:hf_tiednorm|scripts|tests|docs|results|model_cards|experiments|\.ci)/[\w.{},*/<>-]*)"
)
DOTTED = re.compile(r"`(?:python -m )?(hf_tiednorm(?:\.\w+)+)")
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


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


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_relative_links_exist(md):
    assert broken_links(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_quoted_repo_paths_exist(md):
    assert broken_repo_paths(md) == []


@pytest.mark.parametrize("md", markdown_files(), ids=lambda p: p.name)
def test_quoted_module_names_resolve(md):
    assert unresolved_names(md) == []


def test_checks_fail_on_a_broken_reference(tmp_path):
    """The checks above can fail: a markdown file with a broken link, anchor, path and name is reported."""
    (tmp_path / "other.md").write_text("# A heading\n", encoding="utf-8")
    md = tmp_path / "page.md"
    md.write_text(
        "See [that](other.md#a-heading), [gone](missing.md), [bad anchor](other.md#no-such-heading).\n"
        "Run `python scripts/run_translation.py scripts/configs/no_such_config.yaml`, read\n"
        "`results/paper_summary_full.{md,nope}` and `hf_tiednorm/no_such_module.py`, not `/work/x/scripts/a.py`\n"
        "nor `runs/out` nor `results/paper_summary_<budget>.json`; call `hf_tiednorm.convert.no_such_function`.\n",
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
    good = tmp_path / "good.md"
    good.write_text("[ok](other.md#a-heading) `scripts/run_translation.py` `hf_tiednorm.convert`\n", encoding="utf-8")
    assert broken_links(good) == broken_repo_paths(good) == unresolved_names(good) == []


def test_readme_python_snippets_run(tmp_path, monkeypatch):
    blocks = PYTHON_BLOCK.findall((REPO / "README.md").read_text(encoding="utf-8"))
    assert blocks, "README.md has no Python snippet"
    monkeypatch.chdir(tmp_path)  # the snippets save models into the current folder
    namespace = {"__name__": "__readme__"}
    ran = 0
    for number, block in enumerate(blocks, 1):
        if block.startswith(SKIP_MARKER):
            assert block[len(SKIP_MARKER):].split("\n")[0].strip(), f"README snippet {number} skipped without a reason"
            continue
        if re.search(r"^from peft |^import peft", block, re.M) and importlib.util.find_spec("peft") is None:
            continue  # the optional extra ".[peft]" is not installed here
        exec(compile(block, f"README.md snippet {number}", "exec"), namespace)  # noqa: S102
        ran += 1
    assert ran >= 2
