"""pytest setup shared by every test module: offline Hugging Face, the package imported (it registers the Auto
classes) and the fixtures. The helpers live in ``testing_utils.py``."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if os.environ.get("PYTEST_XDIST_WORKER"):
    # pytest-xdist's workers (setup.cfg's addopts): each keeps its own copy of the folders' remote code (transformers'
    # module cache, read when transformers is imported), so two workers never write one module file at once.
    os.environ["HF_MODULES_CACHE"] = os.path.join(
        tempfile.gettempdir(), f"hf_modules_{os.getpid()}_{os.environ['PYTEST_XDIST_WORKER']}"
    )
# The experiments (experiments/, outside the package): its scripts import paper_grid/ beside them, as
# `python experiments/<script>.py` finds it; the tests import it the same way.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))

import script_helpers  # noqa: E402, F401  (puts experiments/ on sys.path: tests import paper_grid from there)
from testing_utils import MULTI30K  # noqa: E402

import hf_tiednorm  # noqa: E402, F401  (registers the Auto classes)


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    if not (MULTI30K / "train.de.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K


@pytest.fixture(scope="session")
def data_flags(tmp_path_factory) -> list[str]:
    """Tiny de-en train/val/test files written in code, as script flags (script_helpers.write_tiny_parallel); shared
    by the session, so no test writes into them."""
    return script_helpers.write_tiny_parallel(tmp_path_factory.mktemp("data"))


@pytest.fixture(scope="session")
def runs(tmp_path_factory) -> script_helpers.RunFactory:
    """The session's run factory (script_helpers.RunFactory): ``runs(script, *flags)`` or
    ``runs.translation(data_flags, *flags)``, one in-process run per distinct arguments, shared by the tests."""
    return script_helpers.RunFactory(tmp_path_factory.mktemp("runs"))



@pytest.fixture(scope="session")
def finished_run(runs, data_flags) -> Path:
    """The session's tiny finished translation run (script_helpers.FINISHED_RUN_FLAGS), shared: copy it to change it."""
    return runs.translation(data_flags, *script_helpers.FINISHED_RUN_FLAGS, files=script_helpers.FINISHED_RUN_FILES)
