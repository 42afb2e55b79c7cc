"""The run record: what defines a run, written into its folder at start, so that a resume cannot become another run.

The Trainer restores weights, optimizer, schedule and RNG from a checkpoint, but takes everything else from the
command line of the resuming process: other data (even the test set), swapped languages, another objective or
regularizer (label smoothing, dropout), another precision, another seed (a new shuffle, of which it skips the first
N batches) or another --max_steps all continued with rc 0, and the final config and card described only the last
part. ``run_record`` collects what defines the run (the data files with a content hash, or size and mtime for large
ones; the data, model and head flags; precision, seed and the schedule); ``write_run_record`` puts it in
``run_record.json`` of --output_dir at start; ``check_resume_record`` compares a resume with the record of the run it
continues and refuses every difference by name (flag, old value, new value), except the flags named in
``--allow_run_change`` (the one opt-in for a knowing change) and a longer schedule (``EXTENDABLE``: --max_steps,
--num_train_epochs, warned); each accepted change is appended to the record's ``changes``. A --max_steps not beyond
the checkpoint's step is refused (the Trainer trained one step past it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from transformers import TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME

logger = logging.getLogger(__name__)

RECORD_NAME = "run_record.json"
# Files up to this size are hashed (Multi30k's are ~1 MB); larger ones are known by size and mtime.
HASH_LIMIT = 256 * 2**20
# The TrainingArguments that define what the run trains: data order, objective, schedule, precision.
TRAINING_FIELDS = (
    "seed", "data_seed", "max_steps", "num_train_epochs", "per_device_train_batch_size", "gradient_accumulation_steps",
    "learning_rate", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm", "lr_scheduler_type",
    "warmup_steps", "label_smoothing_factor", "optim", "bf16", "fp16",
)
# Data flags that do not change what is trained (scoring limits, workers); every other data flag is recorded.
DATA_FIELDS_NOT_RECORDED = (
    "max_eval_samples", "max_predict_samples", "preprocessing_num_workers", "validation_file", "test_file",
    "overwrite_cache",
)
# Model flags that do not change what is trained.
MODEL_FIELDS_NOT_RECORDED = ("length_penalty",)
# The schedule's length: a resume may extend it (the usual way to train on), with a warning and a recorded change.
EXTENDABLE = ("max_steps", "num_train_epochs")


def file_identity(path: Path) -> dict[str, Any]:
    """A data file's identity: sha256 of its bytes (size and mtime beyond ``HASH_LIMIT``), or ``missing``."""
    if not path.is_file():
        return {"missing": True}
    stat = path.stat()
    if stat.st_size > HASH_LIMIT:
        return {"size": stat.st_size, "mtime": stat.st_mtime}
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(2**20), b""):
            digest.update(block)
    return {"sha256": digest.hexdigest()}


def data_file_identities(data_args) -> dict[str, Any]:
    """The training data files by name (a ``{lang}`` pattern expanded for both languages) and their identities."""
    pattern = getattr(data_args, "train_file", None)
    if not pattern:
        return {}
    langs = [getattr(data_args, name, None) for name in ("source_lang", "target_lang")]
    paths = [pattern.format(lang=lang) for lang in langs if lang] if "{lang}" in pattern else [pattern]
    return {f"train_file {path}": file_identity(Path(path)) for path in paths}


def _plain(value: Any) -> Any:
    """A JSON-comparable form of a flag's value (enums and paths as strings, tuples as lists)."""
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(getattr(value, "value", value))


def run_record(model_args, data_args, training_args: TrainingArguments) -> dict[str, dict[str, Any]]:
    """What defines the run, by section: ``data`` (the data flags and the training files' identities), ``model``
    (every model flag: family, head, objective and regularizers such as label smoothing and dropout) and
    ``training`` (``TRAINING_FIELDS``: seed, schedule, precision)."""
    data = {field.name: _plain(getattr(data_args, field.name)) for field in dataclasses.fields(data_args)
            if field.name not in DATA_FIELDS_NOT_RECORDED}
    data.update(data_file_identities(data_args))
    model = {field.name: _plain(getattr(model_args, field.name)) for field in dataclasses.fields(model_args)
             if field.name not in MODEL_FIELDS_NOT_RECORDED}
    training = {name: _plain(getattr(training_args, name, None)) for name in TRAINING_FIELDS}
    training["precision"] = precision_name(training_args)
    return {"data": data, "model": model, "training": training}


def precision_name(training_args: TrainingArguments) -> str:
    """"bf16", "fp16" or "fp32": the mixed precision the run trains in."""
    return "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"


def write_run_record(output_dir: str | Path, record: dict, changes: list | None = None) -> Path:
    """``run_record.json`` in ``output_dir``: ``record`` and the knowing ``changes`` made on resumes so far."""
    path = Path(output_dir) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**record, "changes": changes or []}, indent=2, sort_keys=True) + "\n")
    return path


def record_differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(flag, old value, new value) for every recorded flag whose value differs, in section order."""
    differences = []
    for section in ("data", "model", "training"):
        before, after = old.get(section, {}), new.get(section, {})
        for name in sorted(set(before) | set(after)):
            if before.get(name) != after.get(name):
                differences.append((name, before.get(name), after.get(name)))
    return differences


def check_resume_record(resume: str | None, output_dir: str | Path, record: dict, allowed: list[str]) -> list:
    """Refuse a resume that would continue another run than the checkpoint's: ``ValueError`` naming each recorded
    flag that differs (flag, old value, new value), unless it is named in ``allowed`` (--allow_run_change), and when
    --max_steps is below the checkpoint's step. The record is the one beside the checkpoint (its run folder); a run
    without one (written before records existed) is resumed with a warning. Returns the record's ``changes`` with
    the allowed ones appended, for ``write_run_record``."""
    if resume is None:
        return []
    checkpoint = Path(resume)
    max_steps = record["training"].get("max_steps") or 0
    try:
        step = json.loads((checkpoint / TRAINER_STATE_NAME).read_text())["global_step"]
    except (OSError, ValueError, KeyError):
        step = None
    if step is not None and 0 < max_steps <= step:
        raise ValueError(
            f"--max_steps {max_steps} is not beyond --resume_from_checkpoint {resume}, which is at step {step}: "
            f"the run would train past it anyway; give --max_steps above {step} or score the checkpoint with "
            "--model_name_or_path"
        )
    path = next((folder / RECORD_NAME for folder in (checkpoint.parent, Path(output_dir))
                 if (folder / RECORD_NAME).is_file()), None)
    if path is None:
        logger.warning("--resume_from_checkpoint %s: its run folder has no %s, so this resume cannot be checked "
                       "against the flags that started the run", resume, RECORD_NAME)
        return []
    saved = json.loads(path.read_text())
    differences = record_differences(saved, record)
    allowed = [*allowed, *EXTENDABLE]
    refused = [(name, old, new) for name, old, new in differences if name.split(" ")[0] not in allowed]
    if refused:
        listed = "; ".join(f"{name}: {old!r} -> {new!r}" for name, old, new in refused)
        names = " ".join(sorted({name.split(" ")[0] for name, _, _ in refused}))
        raise ValueError(
            f"--resume_from_checkpoint {resume} continues a run started with other settings ({path}): {listed}. "
            "Give the flags of that run, or pass --allow_run_change "
            f"{names} to change them knowingly from step {step} on (recorded in {RECORD_NAME})"
        )
    changes = list(saved.get("changes", []))
    for name, old, new in differences:
        logger.warning("resume: %s changes from %r to %r at step %s (recorded in %s)", name, old, new, step,
                       RECORD_NAME)
        changes.append({"step": step, "flag": name, "old": old, "new": new})
    return changes


__all__ = [
    "RECORD_NAME", "check_resume_record", "file_identity", "precision_name", "record_differences", "run_record",
    "write_run_record",
]
