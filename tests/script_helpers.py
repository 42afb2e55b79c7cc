"""Running the training scripts of scripts/ (and the experiment scripts of experiments/) in-process (fast) or as
subprocesses, on a few Multi30k sentences."""

from __future__ import annotations

import gzip
import importlib.util
import os
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = REPO_ROOT / "scripts"
EXPERIMENTS = REPO_ROOT / "experiments"  # the experiments (conftest.py puts it on sys.path)

# A tiny encoder-decoder and a small joint vocabulary: a few seconds per run on one CPU thread. fp32: at this size
# bf16 gains nothing, and the tests' tolerances were set in fp32 (tests/test_bf16_and_contender.py runs bf16).
TINY_TRANSLATION_FLAGS = [
    "--vocab_size", "300", "--d_model", "32", "--encoder_layers", "1", "--decoder_layers", "1",
    "--encoder_ffn_dim", "64", "--decoder_ffn_dim", "64", "--encoder_attention_heads", "2",
    "--decoder_attention_heads", "2", "--dropout", "0", "--attention_dropout", "0",
    "--max_source_length", "32", "--max_target_length", "32", "--generation_max_length", "24",
    "--report_to", "none", "--num_threads", "1", "--dataloader_pin_memory", "false", "--bf16", "false",
]


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


def run_script(name: str, args: list[str], monkeypatch) -> None:
    """Run scripts/<name>.py's main() in this process with ``args`` as its command line."""
    module = load_script(name)
    monkeypatch.setattr(sys, "argv", [f"{name}.py", *map(str, args)])
    threads = torch.get_num_threads()
    try:
        module.main()
    finally:
        torch.set_num_threads(threads)  # the script sets it for the whole process


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def read_lines(path: Path, limit: int) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.rstrip("\n") for _, line in zip(range(limit), handle)]
