"""The run record: what defines a run, written into its folder at start, so that a resume cannot become another run.

The Trainer restores weights, optimizer, schedule and RNG from a checkpoint, but takes everything else from the
command line of the resuming process: other data (even the test set), swapped languages, another objective or
regularizer (label smoothing, dropout), another precision, another seed (a new shuffle, of which it skips the first
N batches) or another --max_steps all continued with rc 0, and the final config and card described only the last
part. ``run_record`` collects what defines the run (the data files with a content hash, or size and mtime for large
ones; the data, model and head flags; every TrainingArguments field but those that cannot change the result, listed
in ``TRAINING_FIELDS_NOT_RECORDED``; the scripts' run flags); ``write_run_record`` puts it in
``run_record.json`` of --output_dir at start; ``check_resume_record`` compares a resume with the record of the run it
continues and refuses every difference by name (flag, old value, new value), except the flags named in
``--allow_run_change`` (the one opt-in for a knowing change) and a longer schedule (``EXTENDABLE``: --max_steps,
--num_train_epochs, warned); each accepted change is appended to the record's ``changes``. A schedule that ends at
or before the checkpoint's step is refused (``check_schedule_left``: the Trainer trained one step past a --max_steps,
or nothing at all for a --num_train_epochs already reached, and reported success). An unreadable
``run_record.json`` or ``trainer_state.json`` is named.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import logging
import math
from pathlib import Path
from typing import Any

from transformers import TrainingArguments

from .checkpoint_reading import read_trainer_state

logger = logging.getLogger(__name__)

RECORD_NAME = "run_record.json"
# Files up to this size are hashed (Multi30k's are ~1 MB); larger ones are known by size and mtime.
HASH_LIMIT = 256 * 2**20
# The TrainingArguments fields that cannot change the trained weights: every other field of the run's
# TrainingArguments (HF's and the scripts' subclass; a field a newer transformers adds included) is recorded, since a
# flag we did not think of (--train_sampling_strategy, --lr_scheduler_kwargs, --neftune_noise_alpha,
# --dataloader_drop_last) changed the run unrecorded. tests/training/test_run_record.py checks that each name is a
# field.
TRAINING_FIELDS_NOT_RECORDED = (
    # where the outputs go and what the run is called
    "output_dir", "run_name", "project", "trackio_space_id", "trackio_bucket_id", "trackio_static_space_id",
    # what this process does (train / score / resume from where), not what the run trains
    "do_train", "do_eval", "do_predict", "resume_from_checkpoint", "local_rank",
    # logging and reporting
    "logging_strategy", "logging_steps", "logging_first_step", "log_on_each_node", "logging_nan_inf_filter",
    "include_num_input_tokens_seen", "log_level", "log_level_replica", "disable_tqdm", "report_to",
    "skip_memory_metrics", "debug",
    # scoring during and after training: evaluation cadence, batch and precision, generation settings (recorded
    # with --load_best_model_at_end: BEST_MODEL_FIELDS)
    "eval_strategy", "eval_steps", "eval_delay", "per_device_eval_batch_size", "prediction_loss_only",
    "eval_on_start", "eval_do_concat_batches", "eval_use_gather_object", "eval_accumulation_steps",
    "include_for_metrics", "batch_eval_metrics", "bf16_full_eval", "fp16_full_eval", "predict_with_generate",
    "generation_max_length", "generation_num_beams", "generation_config", "generation_num_beams_during_training",
    # saving cadence and publishing
    "save_only_model", "save_strategy", "save_steps", "save_on_each_node", "save_total_limit",
    "enable_jit_checkpoint", "push_to_hub", "hub_token", "hub_private_repo", "hub_model_id", "hub_strategy",
    "hub_always_push", "hub_revision",
    # memory and speed only: the same batches in the same order, the same arithmetic (recomputed activations restore
    # the RNG state; our collators draw no random numbers, so worker processes change nothing)
    "gradient_checkpointing", "gradient_checkpointing_kwargs", "activation_checkpointing",
    "activation_checkpointing_kwargs", "torch_empty_cache_steps", "use_cache", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_persistent_workers", "dataloader_prefetch_factor",
    "dataloader_multiprocessing_context", "dataloader_in_order", "ddp_find_unused_parameters", "ddp_static_graph",
    "ddp_timeout",
)
# Data flags that do not change what is trained (scoring limits, workers); every other data flag is recorded.
DATA_FIELDS_NOT_RECORDED = (
    "max_eval_samples", "max_predict_samples", "preprocessing_num_workers", "validation_file", "test_file",
    "overwrite_cache",
)
# With --load_best_model_at_end (which --early_stopping_patience needs) the evaluations choose the final model among
# the checkpoints: what they score, how, and when, is recorded then.
BEST_MODEL_FIELDS = (
    "eval_strategy", "eval_steps", "eval_delay", "save_strategy", "save_steps", "prediction_loss_only",
    "bf16_full_eval", "fp16_full_eval", "predict_with_generate", "generation_max_length", "generation_num_beams",
    "generation_config", "generation_num_beams_during_training",
)
BEST_MODEL_DATA_FIELDS = ("validation_file", "max_eval_samples")
# Model flags that do not change what is trained (but the evaluations that choose the best model).
MODEL_FIELDS_NOT_RECORDED = ("length_penalty",)
# The scripts' run flags that do not change what is trained: threads and memory reuse, and this process's time
# budget (a stop, like a kill; the schedule is --max_steps / --num_train_epochs). --early_stopping_patience is
# recorded.
RUN_FIELDS_NOT_RECORDED = ("num_threads", "keep_freed_cpu_memory", "max_train_minutes")
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


def data_file_identities(data_args, flags: tuple[str, ...] = ("train_file",)) -> dict[str, Any]:
    """The data files of ``flags`` by name (a ``{lang}`` pattern expanded for both languages) and their
    identities."""
    identities = {}
    langs = [getattr(data_args, name, None) for name in ("source_lang", "target_lang")]
    for flag in flags:
        pattern = getattr(data_args, flag, None)
        if not pattern:
            continue
        paths = [pattern.replace("{lang}", lang) for lang in langs if lang] if "{lang}" in pattern else [pattern]
        identities.update({f"{flag} {path}": file_identity(Path(path)) for path in paths})
    return identities


def _plain(value: Any) -> Any:
    """A JSON-comparable form of a flag's value (enums and paths as strings, tuples as lists, mappings and
    dataclasses such as ``AcceleratorConfig`` as dicts with string keys)."""
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain({field.name: getattr(value, field.name) for field in dataclasses.fields(value)})
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(getattr(value, "value", value))


def _recorded(args, not_recorded: tuple[str, ...]) -> dict[str, Any]:
    return {field.name: _plain(getattr(args, field.name)) for field in dataclasses.fields(args)
            if field.name not in not_recorded}


def run_record(model_args, data_args, training_args: TrainingArguments, run_args=None) -> dict[str, dict[str, Any]]:
    """What defines the run, by section: ``data`` (the data flags and the training files' identities), ``model``
    (every model flag: family, head, objective and regularizers such as label smoothing and dropout), ``training``
    (every TrainingArguments field but ``TRAINING_FIELDS_NOT_RECORDED``: seed, schedule, optimizer, sampler,
    precision, ...; with --load_best_model_at_end also the evaluations that choose the final model,
    ``BEST_MODEL_FIELDS``, and the validation data) and ``run`` (the scripts' ``RunArguments`` but
    ``RUN_FIELDS_NOT_RECORDED``)."""
    best = bool(getattr(training_args, "load_best_model_at_end", False))
    data = _recorded(data_args, tuple(name for name in DATA_FIELDS_NOT_RECORDED
                                      if not (best and name in BEST_MODEL_DATA_FIELDS)))
    data.update(data_file_identities(data_args, ("train_file", "validation_file") if best else ("train_file",)))
    training = _recorded(training_args, tuple(name for name in TRAINING_FIELDS_NOT_RECORDED
                                              if not (best and name in BEST_MODEL_FIELDS)))
    training["precision"] = precision_name(training_args)
    model = _recorded(model_args, () if best else MODEL_FIELDS_NOT_RECORDED)  # the beam search's length penalty
    record = {"data": data, "model": model, "training": training}
    if run_args is not None:
        record["run"] = _recorded(run_args, RUN_FIELDS_NOT_RECORDED)
    return record


def precision_name(training_args: TrainingArguments) -> str:
    """"bf16", "fp16" or "fp32": the mixed precision the run trains in."""
    return "bf16" if training_args.bf16 else "fp16" if training_args.fp16 else "fp32"


def write_run_record(output_dir: str | Path, record: dict, changes: list | None = None) -> Path:
    """``run_record.json`` in ``output_dir``: ``record`` and the knowing ``changes`` made on resumes so far."""
    path = Path(output_dir) / RECORD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**record, "changes": changes or []}, indent=2, sort_keys=True) + "\n")
    return path


SECTIONS = ("data", "model", "training", "run")


def record_differences(old: dict, new: dict) -> list[tuple[str, Any, Any]]:
    """(flag, old value, new value) for every recorded flag whose value differs, in section order. A setting that
    ``old`` does not hold at all (a record written before it was recorded: older code, older transformers) is not
    compared (``unrecorded_settings`` names those), except another data file's identity ("train_file <path>")."""
    differences = []
    for section in SECTIONS:
        if section not in old:
            continue
        before, after = old[section], new.get(section, {})
        for name in sorted(set(before) | set(after)):
            if (name in before or " " in name) and before.get(name) != after.get(name):
                differences.append((name, before.get(name), after.get(name)))
    return differences


def unrecorded_settings(old: dict, new: dict) -> list[str]:
    """The settings of ``new`` that the record ``old`` does not hold (it predates them): a resume cannot check
    them."""
    return [name for section in SECTIONS for name in new.get(section, {})
            if name not in old.get(section, {}) and " " not in name]


def read_run_record(path: Path) -> dict:
    """The run record at ``path``; ``ValueError`` naming the file when it is not JSON (truncated, empty) or not a
    record (a list, sections that are not objects)."""
    remedy = ("it holds the flags that started the run, which a resume is checked against: restore it, or delete it "
              "to resume unchecked (warned)")
    try:
        saved = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise ValueError(f"{path} cannot be read ({type(error).__name__}: {error}); {remedy}") from None
    sections_ok = isinstance(saved, dict) and all(isinstance(saved.get(name, {}), dict) for name in SECTIONS)
    if not sections_ok or not isinstance(saved.get("changes", []), list):
        what = type(saved).__name__ if saved is not None else "null"
        raise ValueError(f"{path} holds {what}, not a run record (an object of data, model and training sections); "
                         f"{remedy}")
    return saved


def check_schedule_left(resume: str, training: dict, state: dict) -> None:
    """Refuse a resume whose schedule ends at or before the checkpoint's step: the Trainer trained one step past a
    --max_steps, or nothing at all for an epoch count already reached, and reported success (``train_loss 0.0``,
    the checkpoint's weights saved as the final model). The epoch-based end is ceil(--num_train_epochs × steps per
    epoch), the steps per epoch read from the checkpoint's step and epoch."""
    step, reached = state["global_step"], state.get("epoch")
    max_steps = training.get("max_steps") or 0
    if 0 < max_steps <= step:
        raise ValueError(
            f"--max_steps {max_steps} is not beyond --resume_from_checkpoint {resume}, which is at step {step}: "
            f"the run would train past it anyway; give --max_steps above {step} or score the checkpoint with "
            "--model_name_or_path"
        )
    epochs = training.get("num_train_epochs")
    if max_steps > 0 or not epochs or not isinstance(reached, (int, float)) or reached <= 0 or step <= 0:
        return
    per_epoch = step / reached
    if abs(per_epoch - round(per_epoch)) < 1e-6:
        per_epoch = round(per_epoch)
    if math.ceil(epochs * per_epoch - 1e-9) <= step:
        raise ValueError(
            f"--num_train_epochs {epochs:g} is not beyond --resume_from_checkpoint {resume}, which has trained "
            f"{reached:.4g} epochs (step {step}): nothing would be trained and the checkpoint's weights would replace "
            f"the final model; give --num_train_epochs above {reached:.4g} (or --max_steps above {step}), or score "
            "the checkpoint with --model_name_or_path"
        )


def check_resume_record(resume: str | None, output_dir: str | Path, record: dict, allowed: list[str]) -> list:
    """Refuse a resume that would continue another run than the checkpoint's: ``ValueError`` naming each recorded
    flag that differs (flag, old value, new value), unless it is named in ``allowed`` (--allow_run_change), and when
    the schedule ends at or before the checkpoint's step (``check_schedule_left``); a ``trainer_state.json`` or
    record that cannot be read is named (``read_trainer_state``, ``read_run_record``). The record is the one beside
    the checkpoint (its run folder); a run without one (written before records existed) is resumed with a warning.
    Returns the record's ``changes`` with the allowed ones appended, for ``write_run_record``."""
    if resume is None:
        return []
    checkpoint = Path(resume)
    state = read_trainer_state(checkpoint)
    step = state["global_step"]
    check_schedule_left(resume, record["training"], state)
    path = next((folder / RECORD_NAME for folder in (checkpoint.parent, Path(output_dir))
                 if (folder / RECORD_NAME).is_file()), None)
    if path is None:
        logger.warning("--resume_from_checkpoint %s: its run folder has no %s, so this resume cannot be checked "
                       "against the flags that started the run", resume, RECORD_NAME)
        return []
    saved = read_run_record(path)
    differences = record_differences(saved, record)
    unrecorded = unrecorded_settings(saved, record)
    if unrecorded:
        logger.warning("--resume_from_checkpoint %s: %s predates these settings, which this resume cannot check: %s",
                       resume, path, ", ".join(unrecorded))
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
    "RECORD_NAME", "TRAINING_FIELDS_NOT_RECORDED", "check_resume_record", "check_schedule_left", "file_identity",
    "precision_name", "read_run_record", "record_differences", "run_record", "unrecorded_settings", "write_run_record",
]
