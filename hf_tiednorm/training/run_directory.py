"""One run per --output_dir (HF examples' --overwrite_output_dir rule), resuming only the last *complete* checkpoint
of a run with the same architecture, and a final save that never leaves a new config.json over old weights:
``prepare_output_dir``, ``is_complete_checkpoint``, ``last_complete_checkpoint``, ``resolve_resume_checkpoint``,
``check_resume_config``, ``save_final_model``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig, Trainer, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

logger = logging.getLogger(__name__)


# A launcher may create --output_dir with the run's own log in it before the run starts (experiments/reproduce_paper.py
# writes run.log there): log files are neither another run's outputs nor deleted by --overwrite_output_dir.
LOG_PATTERN = "*.log"
# What a run writes after training; stale once a resumed run goes on training (save_metrics would merge into them).
END_OF_RUN_FILES = (
    "all_results.json", "train_results.json", "eval_results.json", "test_results.json", "test_predictions.txt",
)


def is_complete_checkpoint(folder: Path) -> bool:
    """A checkpoint folder is complete once its trainer_state.json parses: the Trainer writes that file last, after
    the weights, optimizer, scheduler and RNG states (``Trainer._save_checkpoint``), so a save killed half-way leaves a
    folder without it (or with a truncated one)."""
    try:
        json.loads((folder / TRAINER_STATE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The complete ``checkpoint-N`` folder of ``output_dir`` with the highest N, skipping (with a warning) newer ones
    whose save was interrupted."""
    steps = {}
    for folder in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and step.isdigit():
            steps[int(step)] = folder
    for step in sorted(steps, reverse=True):
        if is_complete_checkpoint(steps[step]):
            return steps[step]
        logger.warning("skipping %s: its save did not complete (no valid %s)", steps[step], TRAINER_STATE_NAME)
    return None


def resolve_resume_checkpoint(training_args: TrainingArguments) -> str | None:
    """--resume_from_checkpoint as a checkpoint folder: "last" (or "true") is the newest *complete* one in
    --output_dir (``last_complete_checkpoint``). Fails before any work when there is none or the folder given is
    incomplete, rather than after the data is prepared."""
    output_dir = Path(training_args.output_dir)
    resume = training_args.resume_from_checkpoint
    if resume in ("last", "true", "True"):
        last = last_complete_checkpoint(output_dir) if output_dir.is_dir() else None
        if last is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {resume}: no complete checkpoint in {output_dir} "
                f"(a complete one holds a valid {TRAINER_STATE_NAME})"
            )
        return str(last)
    if resume is not None:
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder")
        if not is_complete_checkpoint(Path(resume)):
            raise ValueError(
                f"--resume_from_checkpoint {resume} is incomplete (no valid {TRAINER_STATE_NAME}: its save was "
                "interrupted); pass an earlier checkpoint or 'last' (the newest complete one)"
            )
    return resume


def _inside(path: str | os.PathLike, folder: Path) -> bool:
    resolved = Path(path).resolve()
    return resolved == folder or folder in resolved.parents


def prepare_output_dir(
    training_args: TrainingArguments, overwrite: bool, resume: str | None, inputs: dict[str, str | None]
) -> None:
    """One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
    --overwrite_output_dir, which deletes them so the run starts clean (no old checkpoints, results, predictions or
    tokenizer left beside the new ones). A run resuming a checkpoint of --output_dir continues that folder; only the
    previous end-of-run results go. ``inputs`` maps flags to the paths they read (--model_name_or_path, data files),
    which --overwrite_output_dir must not delete. Every rank checks before any rank writes; the main process cleans."""
    output_dir = Path(training_args.output_dir).resolve()
    previous = []
    if output_dir.is_dir():
        previous = sorted(path for path in output_dir.iterdir() if not path.match(LOG_PATTERN))
    stale: list[Path] = []
    if resume is not None and _inside(resume, output_dir):
        if overwrite:
            raise ValueError(
                f"--overwrite_output_dir would delete --resume_from_checkpoint {resume}; drop one of the two flags"
            )
        stale = [output_dir / name for name in END_OF_RUN_FILES]
    elif previous:
        if not overwrite:
            names = ", ".join(path.name for path in previous[:5]) + (", ..." if len(previous) > 5 else "")
            raise FileExistsError(
                f"--output_dir {training_args.output_dir} already holds another run's outputs ({names}). Pass "
                "--overwrite_output_dir to delete them and start clean, --resume_from_checkpoint last to continue "
                "that run, or choose a new --output_dir"
            )
        for flag, path in inputs.items():
            if path is not None and _inside(path, output_dir):
                raise ValueError(f"--overwrite_output_dir would delete {flag} {path}, which lies in --output_dir")
        logger.warning("--overwrite_output_dir: deleting the contents of %s", output_dir)
        stale = previous
    with training_args.main_process_first(local=False, desc="preparing --output_dir"):
        if training_args.process_index == 0:
            for path in stale:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)


def check_resume_config(resume: str | None, config: PretrainedConfig, fields: tuple[str, ...]) -> None:
    """Refuse to resume a checkpoint whose model differs from the one this run builds in any of ``fields`` (the
    architecture flags): the Trainer would load, say, cosine-trained weights into an l2 model without a word."""
    if resume is None:
        return
    saved = AutoConfig.from_pretrained(resume)
    for name in ("model_type", *fields):
        if getattr(saved, name, None) != getattr(config, name, None):
            raise ValueError(
                f"--resume_from_checkpoint {resume} holds a model with {name}={getattr(saved, name, None)!r}, but this "
                f"run builds {name}={getattr(config, name, None)!r}; give the flags of the run that wrote the "
                "checkpoint, or start over in a new --output_dir (or with --overwrite_output_dir)"
            )


def save_final_model(trainer: Trainer) -> None:
    """``trainer.save_model()`` (model, tokenizer, training arguments) into --output_dir, safe against a kill: every
    file is first written to a sibling staging folder, then the old config.json is removed and the files are renamed
    into --output_dir, config.json last. A kill at any point leaves either the previous complete model or a folder
    without config.json (which from_pretrained refuses), never a new config.json over old weights."""
    output_dir = Path(trainer.args.output_dir).resolve()
    staging = output_dir.with_name(f".{output_dir.name}.saving")
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed save
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))  # on every rank: FSDP and DeepSpeed gather the weights
    if trainer.is_world_process_zero():
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / CONFIG_NAME).unlink(missing_ok=True)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == CONFIG_NAME):
            os.replace(path, output_dir / path.name)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()
