"""The training scripts' set-up on CPU keeps freed tensor memory for reuse instead of page-faulting it in again every
step (hf_tiednorm/training/cpu_memory.py), unless --keep_freed_cpu_memory false."""

import json
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings"
)

# A child process (malloc settings are process-wide): the minor page faults of allocating, touching and freeing a
# 64 MiB tensor four times (16 384 faults each with glibc's defaults), before and after the set-up under test.
FAULTS_OF_LARGE_TEMPORARIES = """
import json, resource, sys
import torch

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        torch.empty(2**24).fill_(1.0)  # 64 MiB, freed at once
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = faults()
exec(sys.argv[1])
faults()  # the heap grows to hold the block once
print(json.dumps({"default": default, "after": faults()}))
"""


def faults_before_and_after(setup: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS_OF_LARGE_TEMPORARIES, setup], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("keep", [True, False])
def test_setup_run_keeps_freed_memory_on_cpu_unless_opted_out(keep, tmp_path):
    setup = (
        "from hf_tiednorm.training.arguments import RunArguments; "
        "from hf_tiednorm.training.precision import TiedNormTrainingArguments; "
        "from hf_tiednorm.training.steps import setup_run; "
        f"setup_run(RunArguments(keep_freed_cpu_memory={keep}, num_threads=1), "
        f"TiedNormTrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, bf16=False, report_to=[]))"
    )
    faults = faults_before_and_after(setup)
    assert faults["default"] > 4 * 10_000, faults  # glibc unmaps each freed 64 MiB block: the premise of the module
    assert (faults["after"] < 1_000) is keep, faults


def test_the_set_up_starts_no_process(monkeypatch):
    """Every training run set up on a CPU asks for glibc's mallopt: ctypes.util.find_library("c") started
    `ldconfig -p` each time (one process launch per run, most of the test suite's launches); the process's own
    symbols hold mallopt already."""
    from hf_tiednorm.training import cpu_memory

    launched, original = [], subprocess.Popen.__init__

    def counting(self, *args, **kwargs):
        launched.append(args)
        original(self, *args, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", counting)
    assert "stays in the process" in cpu_memory.keep_freed_memory()
    assert launched == []
