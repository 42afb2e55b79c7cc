"""What a newcomer meets before any model: the package metadata and the set-up script.

* setup.cfg declares the license the modern way (an SPDX expression and the LICENSE file, no deprecated license
  classifier) and lists every Python package under hf_tiednorm/ (setuptools warns about, and may drop, an importable
  folder that is absent from ``packages``);
* ``scripts/main_job.sh`` installs into the repository's own virtual environment ``.venv``, never into the Python that
  is active: checked with stand-in ``python3``/``python`` executables that only record how they were called.
"""

from __future__ import annotations

import configparser
import os
import stat
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_setup_cfg_license_and_packages():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    metadata = config["metadata"]
    assert metadata.get("license_expression") == "Apache-2.0"
    assert "License ::" not in metadata.get("classifiers", "")
    assert metadata.get("license_files") == "LICENSE"
    assert "Apache License" in (REPO / "LICENSE").read_text(encoding="utf-8").splitlines()[0]

    packages = set(config["options"]["packages"].split())
    importable = {
        ".".join(init.parent.relative_to(REPO).parts) for init in (REPO / "hf_tiednorm").rglob("*.py")
        if "__pycache__" not in init.parts
    }
    assert importable <= packages, f"absent from setup.cfg packages: {sorted(importable - packages)}"


def _executable(path: Path, text: str) -> None:
    path.write_text(text, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_main_job_installs_into_the_project_venv(tmp_path):
    repo = tmp_path / "clone"
    (repo / "scripts").mkdir(parents=True)
    (repo / "scripts" / "main_job.sh").write_text((REPO / "scripts" / "main_job.sh").read_text(encoding="utf-8"))
    data = tmp_path / "shared" / "data" / "multi30k"
    data.mkdir(parents=True)
    (data / "train.de.gz").write_bytes(b"")
    log = tmp_path / "calls.log"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # The active Python: any call to it is pollution.
    _executable(bin_dir / "python", f'#!/bin/sh\necho "active $*" >> {log}\n')
    # python3 -m venv DIR makes a stand-in venv whose python records its calls.
    _executable(
        bin_dir / "python3",
        f"""#!/bin/sh
echo "python3 $*" >> {log}
[ "$1 $2" = "-m venv" ] || exit 1
mkdir -p "$3/bin"
printf '#!/bin/sh\\necho "venv $*" >> {log}\\n' > "$3/bin/python"
chmod +x "$3/bin/python"
echo "PATH=\\"$(cd "$3" && pwd)/bin:\\$PATH\\"; export PATH" > "$3/bin/activate"
""",
    )
    env = {**os.environ, "PATH": f"{bin_dir}:/usr/bin:/bin"}
    env.pop("VIRTUAL_ENV", None)
    env.pop("TIEDNORM_VENV", None)
    for _ in range(2):  # the second run reuses the venv
        subprocess.run(["bash", "scripts/main_job.sh", "--quick"], cwd=repo, env=env, check=True, timeout=60)

    calls = log.read_text(encoding="utf-8").splitlines()
    assert not [c for c in calls if c.startswith("active")], calls
    assert calls.count("python3 -m venv .venv") == 1, calls
    assert (repo / ".venv" / "bin" / "python").exists()
    assert calls[1:4] == [
        "venv -m pip install torch==2.13.0",
        "venv -m pip install -e .",
        "venv scripts/run_translation.py scripts/configs/multi30k_de_en_quick.yaml",
    ], calls


def test_deprecations_from_our_code_fail_the_tests():
    """setup.cfg's filters: a FutureWarning / DeprecationWarning attributed to an hf_tiednorm module is an error (an
    upcoming transformers/torch removal that our code triggers); elsewhere they are shown, never ignored."""
    import warnings

    import pytest

    for category in (FutureWarning, DeprecationWarning):
        with pytest.raises(category):
            warnings.warn_explicit("removed in v6", category, "hf_tiednorm/x.py", 1, module="hf_tiednorm.x")
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg", encoding="utf-8")
    filters = config["tool:pytest"]["filterwarnings"].split()
    assert not [f for f in filters if f.startswith("ignore::") and ("Deprecation" in f or "FutureWarning" in f)]
