"""The lowest torch and transformers versions setup.cfg declares are tested (issue 49): .ci/lowest_versions.sh builds a
venv with exactly those and runs a representative slice of the suite in it; the lent GPU machine's versions (torch
2.11, transformers 5.17) are inside the declared range."""

from __future__ import annotations

import configparser
import os
import re
import subprocess

import pytest
from testing_utils import REPO_ROOT

# What a lent GPU machine has installed (../shared/device-recipe.md): the range must include it.
LENT_MACHINE = {"torch": (2, 11), "transformers": (5, 17)}


def declared_lowest() -> dict[str, tuple[int, ...]]:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / "setup.cfg")
    found = {}
    for line in config["options"]["install_requires"].split("\n"):
        match = re.fullmatch(r"\s*([\w-]+)>=([\d.]+).*", line)
        if match:
            found[match.group(1)] = tuple(int(x) for x in match.group(2).split("."))
    return found


def test_the_lent_machines_torch_and_transformers_are_inside_the_declared_range():
    lowest = declared_lowest()
    for name, version in LENT_MACHINE.items():
        assert name in lowest, f"setup.cfg declares no lowest {name} version"
        assert lowest[name] <= version, f"setup.cfg: {name}>={lowest[name]} excludes the lent machine's {version}"
    script = (REPO_ROOT / ".ci/lowest_versions.sh").read_text()
    assert 'lowest torch' in script and 'lowest transformers' in script  # the venv takes them from setup.cfg


# Slow: it builds a venv (torch's ~530 MB wheel, transformers and the data stack: minutes, once; kept for reruns in
# ${TMPDIR:-/tmp}/hf_tiednorm_lowest_venv) and runs ~150 tests in it (~10 minutes on a busy 2-core machine).
@pytest.mark.slow
def test_a_representative_slice_passes_with_the_lowest_declared_versions():
    lowest = declared_lowest()
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    done = subprocess.run(["bash", ".ci/lowest_versions.sh"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=3600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    torch_version = ".".join(map(str, lowest["torch"]))
    transformers_version = ".".join(map(str, lowest["transformers"]))
    assert re.search(rf"lowest versions: torch {re.escape(torch_version)}(\.0)?\S* transformers "
                     rf"{re.escape(transformers_version)}(\.0)?\b", done.stdout), done.stdout[:2000]
    assert re.search(r"\d+ passed", done.stdout) and " failed" not in done.stdout.splitlines()[-1]
