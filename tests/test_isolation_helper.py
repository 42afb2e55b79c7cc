"""The isolation helper (`testing_utils.run_without_package`) in a clone or venv whose path holds the package's name.

README's install block clones into a folder named `hf_tiednorm` and makes its venv inside it, so every site-packages
entry of that venv holds the package's name in its path. The helper must block the package by what it is (the
entries and finders it would be imported from), not by a substring of a path: filtering on the substring removed the
venv's site-packages too, and every remote-code test died with "No module named 'torch'" (issue 42)."""

from __future__ import annotations

import os
import sys
import venv

import pytest
from testing_utils import REPO_ROOT, run_without_package


def _venv_in_a_clone_named_like_the_package(root):
    """A venv at ``root/hf_tiednorm/.venv`` that reaches this process's packages (torch, transformers, ...) and the
    checkout only through paths beneath ``root/hf_tiednorm``: a `.pth` file lists symlinks to them."""
    clone = root / "hf_tiednorm"
    links = clone / "links"
    links.mkdir(parents=True)
    venv.create(clone / ".venv", with_pip=False, symlinks=True)
    site_packages = next((clone / ".venv" / "lib").glob("python*/site-packages"))
    entries = []
    for index, entry in enumerate(p for p in sys.path if p and os.path.isdir(p)):
        link = links / f"entry{index}"
        link.symlink_to(os.path.abspath(entry), target_is_directory=True)
        entries.append(str(link))
    checkout = links / "checkout"  # the package importable from a path entry, as from a clone's root
    checkout.symlink_to(REPO_ROOT, target_is_directory=True)
    entries.append(str(checkout))
    (site_packages / "reach_this_process.pth").write_text("\n".join(entries) + "\n")
    return clone, clone / ".venv" / "bin" / "python"


@pytest.fixture(scope="module")
def clone_venv(tmp_path_factory):
    """(clone folder, its venv's python), built once for the tests below."""
    return _venv_in_a_clone_named_like_the_package(tmp_path_factory.mktemp("clone"))


def test_isolation_keeps_the_venv_of_a_clone_named_hf_tiednorm(clone_venv):
    clone, python = clone_venv
    out = run_without_package(
        "import sys, torch, transformers\n"
        "assert all('hf_tiednorm' in p for p in (torch.__file__, transformers.__file__)), (torch.__file__,)\n"
        "print('torch', torch.__version__)\n",
        cwd=clone,
        python=str(python),
    )
    assert out.startswith("torch "), out


def test_isolation_still_blocks_the_package_reachable_from_that_clone(clone_venv):
    """The same venv reaches the checkout through `links/checkout`; the helper must still make the import fail."""
    clone, python = clone_venv
    out = run_without_package(
        "import importlib.util\n"
        "try:\n"
        "    import hf_tiednorm.modeling.head.modes\n"
        "except ImportError as error:\n"
        "    print('blocked:', error)\n",
        cwd=clone,
        python=str(python),
    )
    assert out.startswith("blocked:"), out


def test_a_script_in_the_shared_process_without_the_package_reads_an_empty_stdin(tmp_path):
    """The shared process reads its requests on stdin: a script's input() (transformers' "run the custom code?"
    prompt, 15 s timeout) must see end-of-file at once, as a fresh process given /dev/null does, and leave the next
    request alone."""
    import time

    started = time.monotonic()
    out = run_without_package("try:\n    input()\nexcept EOFError:\n    print('eof')\n", cwd=tmp_path)
    assert out.strip() == "eof" and time.monotonic() - started < 10
    assert run_without_package("print('next')\n", cwd=tmp_path).strip() == "next"
