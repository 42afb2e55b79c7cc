"""Running the training scripts of scripts/ (and the experiment scripts of experiments/) in-process (fast) or as
subprocesses, on a few Multi30k sentences."""

from __future__ import annotations

import contextlib
import fcntl
import gzip
import importlib.util
import inspect
import logging
import os
import random
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
EXPERIMENTS = REPO_ROOT / "experiments"  # the experiments (conftest.py puts it on sys.path)

# A tiny encoder-decoder and a small joint vocabulary: a few seconds per run on one CPU thread. fp32: at this size
# bf16 gains nothing, and the tests' tolerances were set in fp32 (tests/training/test_bf16_and_contender.py runs bf16).
TINY_TRANSLATION_FLAGS = [
    "--vocab_size", "300", "--d_model", "32", "--encoder_layers", "1", "--decoder_layers", "1",
    "--encoder_ffn_dim", "64", "--decoder_ffn_dim", "64", "--encoder_attention_heads", "2",
    "--decoder_attention_heads", "2", "--dropout", "0", "--attention_dropout", "0",
    "--max_source_length", "32", "--max_target_length", "32", "--generation_max_length", "24",
    "--report_to", "none", "--num_threads", "1", "--dataloader_pin_memory", "false", "--bf16", "false",
]


# The tiny finished run that most end-to-end tests start from (``finished_run`` in conftest.py; the run factory trains
# it once a session): checkpoints 1 and 2, test predictions and BLEU, model card and norm plot. Its folder already held
# the launcher's run.log (as experiments/reproduce_paper.py writes it), which does not make it another run's folder.
FINISHED_RUN_FLAGS = ("--do_train", "--do_predict", "--predict_with_generate", "--max_steps", "2", "--save_steps", "1")
FINISHED_RUN_FILES = {"run.log": "launcher log\n"}


def write_tiny_parallel(folder: Path, n_train: int = 48, n_eval: int = 6) -> list[str]:
    """Tiny de-en text files (train/val/test.{de,en}) made in code; returns the script flags that name them."""
    subjects = [("ein hund", "a dog"), ("eine frau", "a woman"), ("ein kind", "a child"), ("ein mann", "a man")]
    verbs = [("läuft", "runs"), ("spielt", "plays"), ("liest", "reads"), ("schläft", "sleeps")]
    places = [("im park", "in the park"), ("am strand", "on the beach"), ("zu hause", "at home")]
    pairs = [(f"{s[0]} {v[0]} {p[0]} .", f"{s[1]} {v[1]} {p[1]} .") for s in subjects for v in verbs for p in places]
    flags = []
    for split, name, count in (("train", "train", n_train), ("validation", "val", n_eval), ("test", "test", n_eval)):
        for side, lang in enumerate(("de", "en")):
            lines = [pairs[i % len(pairs)][side] for i in range(count)]
            (folder / f"{name}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
        flags += [f"--{split}_file", str(folder / f"{name}.{{lang}}")]
    return flags


def script_path(name: str) -> Path:
    """scripts/<name>.py, or experiments/<name>.py for the experiment scripts."""
    path = SCRIPTS / f"{name}.py"
    return path if path.is_file() else EXPERIMENTS / f"{name}.py"


def tiny_translation_flags(data_flags: list[str], output_dir, *extra) -> list[str]:
    """run_translation.py flags of a tiny run on ``data_flags`` (the ``data_flags`` fixture) into ``output_dir``."""
    return [
        *data_flags, "--output_dir", output_dir, *TINY_TRANSLATION_FLAGS, "--per_device_train_batch_size", "8",
        "--max_predict_samples", "4", "--generation_max_length", "8", "--seed", "1", *extra,
    ]


def load_script(name: str):
    """scripts/<name>.py (or experiments/<name>.py) as a module (imported once)."""
    module_name = f"script_{name}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, script_path(name))
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # dataclasses resolve string annotations through sys.modules
        spec.loader.exec_module(module)
    return module


@contextlib.contextmanager
def isolated_process_state() -> Iterator[dict[str, str | None]]:
    """What a training script's ``main()`` changes in this process, restored when the block ends, so that an
    in-process run leaves the next test the process it found: environment variables (a run sets HF_TOKEN, accelerate
    its own), the working folder, ``sys.argv``, torch's CPU threads and default dtype, the random generators (the
    Trainer seeds them), the root logger (``logging.basicConfig``) and transformers' / datasets' verbosity, and the
    attention functions registered with transformers (the bf16 CPU attention). Yields a dict that holds, once the
    block has ended, the environment variables it changed ({name: new value, None where removed})."""
    import datasets
    import numpy as np
    import transformers
    from transformers import AttentionInterface

    environ, cwd, argv = dict(os.environ), os.getcwd(), list(sys.argv)
    threads, dtype = torch.get_num_threads(), torch.get_default_dtype()
    rng = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    verbosity = (transformers.utils.logging.get_verbosity(), datasets.utils.logging.get_verbosity())
    attention = dict(AttentionInterface._global_mapping)
    changed: dict[str, str | None] = {}
    try:
        yield changed
    finally:
        changed.update({name: os.environ.get(name) for name in {*environ, *os.environ}
                        if os.environ.get(name) != environ.get(name)})
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        sys.argv[:] = argv
        torch.set_num_threads(threads)
        torch.set_default_dtype(dtype)
        random.setstate(rng[0])
        np.random.set_state(rng[1])
        torch.set_rng_state(rng[2])
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
        transformers.utils.logging.set_verbosity(verbosity[0])
        datasets.utils.logging.set_verbosity(verbosity[1])
        AttentionInterface._global_mapping.clear()
        AttentionInterface._global_mapping.update(attention)


def run_script(name: str, args: list, monkeypatch=None) -> dict[str, str | None]:
    """Run scripts/<name>.py's ``main(args)`` in this process (``isolated_process_state``); returns the environment
    variables the run set (restored since). ``monkeypatch``: unused, kept for the callers that pass one."""
    module = load_script(name)
    with isolated_process_state() as changed_environ:
        if "argv" in inspect.signature(module.main).parameters:
            module.main([str(arg) for arg in args])
        else:  # an experiment script that reads sys.argv itself
            sys.argv = [f"{name}.py", *map(str, args)]
            module.main()
    return changed_environ


class RunFactory:
    """The session's run factory: ``runs(script, *flags)`` is the output folder of one in-process run of
    scripts/<script>.py with ``flags`` (the factory adds ``--output_dir``), made the first time any test asks for
    those arguments and shared by every later one, so that the tests needing "a tiny finished run" train it once.
    ``files`` ({name: text}) are written into the folder before the run (a launcher's run.log). The folder is shared:
    a test that changes it works on a copy (``copy``). A run that failed fails every test asking for it, with its
    error. The run's lock on its folder is released, as the end of its process would."""

    def __init__(self, root: Path):
        self.root = root
        self._runs: dict[tuple, Path | BaseException] = {}

    def __call__(self, script: str, *flags, files: dict[str, str] | None = None) -> Path:
        key = (script, tuple(map(str, flags)), tuple(sorted((files or {}).items())))
        if key not in self._runs:
            output_dir = self.root / f"{script}_{len(self._runs)}"
            output_dir.mkdir(parents=True)
            for name, text in (files or {}).items():
                (output_dir / name).write_text(text)
            from hf_tiednorm.training.run_directory import _HELD_LOCKS, lock_path

            try:
                run_script(script, [*flags, "--output_dir", output_dir])
                self._runs[key] = output_dir
            except Exception as error:  # noqa: BLE001  (re-raised for every test that asks for this run)
                self._runs[key] = error
            finally:
                fd = _HELD_LOCKS.pop(lock_path(output_dir), None)
                if fd is not None:  # as release_output_dir_locks at the end of the run's process
                    lock_path(output_dir).unlink(missing_ok=True)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    os.close(fd)
        result = self._runs[key]
        if isinstance(result, BaseException):
            raise RuntimeError(f"the shared run {script} {' '.join(key[1])} failed: {result!r}") from result
        return result

    def translation(self, data_flags: list[str], *extra, files: dict[str, str] | None = None) -> Path:
        """A tiny run_translation.py run on ``data_flags`` (``tiny_translation_flags``) with ``extra`` flags."""
        flags = tiny_translation_flags(data_flags, None, *extra)
        del flags[flags.index("--output_dir") : flags.index("--output_dir") + 2]  # the factory names the folder
        return self("run_translation", *flags, files=files)

    @staticmethod
    def copy(run: Path, destination: Path) -> Path:
        """A private copy of a shared run's folder, for a test that changes it."""
        shutil.copytree(run, destination)
        return destination


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def read_lines(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(limit), handle)]
