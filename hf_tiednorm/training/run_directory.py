"""One run per --output_dir (HF examples' --overwrite_output_dir rule), resuming only the last *complete* checkpoint
of a run with the same architecture, and a final save that never leaves a new config.json over old weights:
``lock_output_dir``, ``prepare_output_dir``, ``checkpoint_problems``, ``is_complete_checkpoint``,
``last_complete_checkpoint``, ``resolve_resume_checkpoint``, ``check_resume_config``, ``scored_run_folder``,
``save_final_model``.

What no run may do silently (issue 24, docs/run_safety.md):

* **Two runs on one folder.** ``lock_output_dir`` takes an exclusive ``flock`` on ``.<output_dir>.lock`` beside the
  folder before anything else and holds it for the process's lifetime. The kernel drops it when the process ends,
  however it ends, so a lock file left by a dead process is only named (its pid) and taken over.
* **A resume that drifts.** A checkpoint is *complete* when it holds everything the resume restores: loadable weights
  (a safetensors file whose header and size agree, a torch archive that reads), its ``config.json``,
  ``optimizer.pt``, ``scheduler.pt``, the RNG state and a ``trainer_state.json`` holding the step. Without the
  optimizer and scheduler (``--save_only_model``) the learning-rate schedule restarted and the weights drifted from
  an uninterrupted run; such a checkpoint is refused by name (fine-tune its weights with ``--model_name_or_path``
  instead).
* **A score that destroys the run.** Evaluating or predicting without ``--do_train`` in a finished run folder scores
  its trained weights and writes into a new sub-folder (``scored_run_folder``), never over the run's results.
* **A card that describes other weights.** The final save removes the previous model card and plots before the new
  weights move in; the script writes the new ones after.
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import shutil
import time
from pathlib import Path

from transformers import AutoConfig, PretrainedConfig, Trainer, TrainingArguments
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from ..conversion.path_identity import is_same_or_inside
from ..conversion.staging_checks import safetensors_problem
from .checkpoint_reading import archive_problems, missing_weight_names, trainer_state_problem
from .run_outputs import check_inputs_kept, overwritable_entries

logger = logging.getLogger(__name__)


# A launcher may create --output_dir with the run's own log in it before the run starts (experiments/reproduce_paper.py
# writes run.log there): log files are neither another run's outputs nor deleted by --overwrite_output_dir.
LOG_PATTERN = "*.log"
# What a run writes after training; stale once a resumed run goes on training (save_metrics would merge into them).
END_OF_RUN_FILES = (
    "all_results.json", "train_results.json", "eval_results.json", "test_results.json", "test_predictions.txt",
)


# The run's lock: held by this process for its lifetime (one per output folder), released when it exits.
_HELD_LOCKS: dict[Path, int] = {}


def lock_path(output_dir: str | os.PathLike) -> Path:
    """``.<name>.lock`` beside --output_dir (not inside it: --overwrite_output_dir empties the folder)."""
    folder = Path(output_dir).resolve()
    return folder.with_name(f".{folder.name}.lock")


def _read_owner(path: Path, wait_seconds: float = 2.0) -> str:
    """The holder's "pid …, host …, started …" line. The holder writes it just after taking the lock, so a run refused
    in between finds the file empty for a moment: wait for the line (briefly) rather than name no one."""
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            owner = path.read_text().strip()
        except OSError:
            owner = ""
        if owner or time.monotonic() > deadline:
            return owner or "unknown"
        time.sleep(0.02)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def lock_output_dir(output_dir: str | os.PathLike, process_index: int | None = None) -> Path | None:
    """Hold --output_dir for this run: an exclusive, non-blocking ``flock`` on ``lock_path(output_dir)``, taken by the
    main process (``process_index`` 0; the other ranks of a launch share its run) before anything else and kept until
    the process exits. ``RuntimeError`` naming the holder's pid when another live run holds it; a lock file left by
    a dead process (the kernel released its lock) is named in a warning and taken over. Returns the lock file (None
    on other ranks). ``process_index`` None reads the launcher's ``RANK`` (the Trainer's group is not formed yet)."""
    if process_index is None:
        process_index = int(os.environ.get("RANK", "0"))
    if process_index != 0:
        return None
    path = lock_path(output_dir)
    if path in _HELD_LOCKS:  # this process holds it already (a second main() in one process, as tests do)
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RuntimeError(
                f"--output_dir {output_dir} is in use by another run ({_read_owner(path)}; lock file {path}): wait "
                "for it to finish or choose another --output_dir"
            ) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if same_file:
            break
        os.close(fd)  # the holder removed the file between our open and flock: lock the new one
    previous = os.read(fd, 4096).decode(errors="replace").strip()
    if previous:
        pid = previous.split("pid ", 1)[-1].split(",", 1)[0]
        state = "dead" if pid.isdigit() and not _pid_alive(int(pid)) else "ended"
        logger.warning("--output_dir %s: taking over the stale lock of a %s run (%s)", output_dir, state, previous)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, f"pid {os.getpid()}, host {os.uname().nodename}, started {time.strftime('%Y-%m-%d %H:%M:%S')}"
             .encode())
    os.fsync(fd)
    _HELD_LOCKS[path] = fd
    return path


def release_output_dir_locks() -> None:
    """Remove and unlock every lock file this process holds (at exit; the kernel would drop the locks anyway)."""
    for path, fd in list(_HELD_LOCKS.items()):
        try:
            path.unlink(missing_ok=True)  # while still locked, so no other run sees a half-released lock
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
            del _HELD_LOCKS[path]


atexit.register(release_output_dir_locks)


# Weights files of a checkpoint (one of them, or a sharded index), as the Trainer and accelerate save them.
WEIGHTS_NAMES = (
    "model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json",
    "adapter_model.safetensors",
)
OPTIMIZER_NAME = "optimizer.pt"
SCHEDULER_NAME = "scheduler.pt"


def checkpoint_problems(folder: Path) -> list[str]:
    """What keeps ``folder`` from resuming exactly where its run stopped: each missing or broken file the resume
    needs (weights, ``config.json``, ``optimizer.pt``, ``scheduler.pt``, the RNG state, a ``trainer_state.json``
    holding the step: ``checkpoint_reading.trainer_state_problem``), each
    archive that cannot be read and each model tensor the weights lack (``checkpoint_reading``); [] for a complete
    checkpoint. The Trainer writes trainer_state.json last (``Trainer._save_checkpoint``), so a save killed
    half-way lacks it. DeepSpeed and FSDP checkpoints keep their weights and optimizer in ``global_step*`` /
    ``pytorch_model_fsdp*`` / ``optimizer_*`` entries, which count as present."""
    problems = []
    state_problem = trainer_state_problem(folder / TRAINER_STATE_NAME)
    if state_problem:
        problems.append(state_problem)
    names = {path.name for path in folder.iterdir()} if folder.is_dir() else set()
    if CONFIG_NAME not in names and "adapter_config.json" not in names:
        problems.append(f"no {CONFIG_NAME} (the model's architecture)")
    sharded = any(name.startswith(("global_step", "pytorch_model_fsdp")) for name in names)
    weights = [name for name in WEIGHTS_NAMES if name in names]
    if not weights and not sharded:
        problems.append("no weights (model.safetensors)")
    for name in sorted(names):  # every safetensors file, the shards of a sharded save included
        if name.endswith(".safetensors"):
            problem = safetensors_problem(folder / name)
            if problem:
                problems.append(problem)
    if OPTIMIZER_NAME not in names and not sharded and not any(name.startswith("optimizer") for name in names):
        problems.append(f"no {OPTIMIZER_NAME}")
    if SCHEDULER_NAME not in names:
        problems.append(f"no {SCHEDULER_NAME}")
    if not any(name.startswith("rng_state") for name in names):
        problems.append("no rng_state*.pth")
    if not problems:  # every file there: can each be read? (cheap: zip directories, the weights' names)
        problems += archive_problems(folder)
        missing = missing_weight_names(folder)
        if missing:
            problems.append(f"model.safetensors lacks the model's {', '.join(missing[:5])}"
                            + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""))
    return problems


def is_complete_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds every file its resume needs (``checkpoint_problems``)."""
    return not checkpoint_problems(folder)


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The complete ``checkpoint-N`` folder of ``output_dir`` with the highest N, skipping (with a warning) newer ones
    whose save was interrupted."""
    steps = {}
    for folder in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and step.isdigit():
            steps[int(step)] = folder
    for step in sorted(steps, reverse=True):
        problems = checkpoint_problems(steps[step])
        if not problems:
            return steps[step]
        logger.warning("skipping %s: it cannot resume exactly (%s)", steps[step], "; ".join(problems))
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
                f"--resume_from_checkpoint {resume}: no complete checkpoint in {output_dir} (a complete one holds "
                f"the weights, {OPTIMIZER_NAME}, {SCHEDULER_NAME}, rng_state*.pth and a valid {TRAINER_STATE_NAME}; "
                "the log names what each checkpoint lacks)"
            )
        return str(last)
    if resume is not None:
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder")
        problems = checkpoint_problems(Path(resume))
        if problems:
            raise ValueError(
                f"--resume_from_checkpoint {resume} is incomplete ({'; '.join(problems)}): it cannot resume exactly. "
                "Without the optimizer and scheduler the "
                "learning-rate schedule and optimizer moments restart and the weights drift from an uninterrupted "
                "run. Pass an earlier checkpoint or 'last' (the newest complete one), or fine-tune its weights "
                f"knowingly with --model_name_or_path {resume} (a new schedule) in a new --output_dir"
            )
    return resume


def _inside(path: str | os.PathLike, folder: Path) -> bool:
    return is_same_or_inside(path, folder)  # by device and inode: a bind mount too (path_identity.py)


def prepare_output_dir(
    training_args: TrainingArguments, overwrite: bool, resume: str | None, inputs: dict[str, str | None]
) -> None:
    """One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
    --overwrite_output_dir, which deletes them so the run starts clean (no old checkpoints, results, predictions or
    tokenizer left beside the new ones): only the entries a run of ours writes, never while a run holds a lock
    beneath the folder (``overwritable_entries``). A run resuming a checkpoint of --output_dir continues that
    folder; only the previous end-of-run results go. ``inputs`` maps flags to the paths they read
    (--model_name_or_path, --tokenizer_name, data files, the resumed checkpoint, the config file): a deletion that
    would remove one, however it is spelled (``run_outputs.check_inputs_kept``), is refused before anything is
    deleted. Every rank checks before any rank writes; the main process cleans."""
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
        check_inputs_kept([path for path in stale if path.exists() or path.is_symlink()], inputs)
    elif previous:
        if not overwrite:
            names = ", ".join(path.name for path in previous[:5]) + (", ..." if len(previous) > 5 else "")
            raise FileExistsError(
                f"--output_dir {training_args.output_dir} already holds another run's outputs ({names}). Pass "
                "--overwrite_output_dir to delete them and start clean, --resume_from_checkpoint last to continue "
                "that run, or choose a new --output_dir"
            )
        stale = overwritable_entries(output_dir, previous, inputs)  # a run's outputs only; no live run beneath
        logger.warning("--overwrite_output_dir: deleting the previous run's outputs in %s", output_dir)
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


def scored_run_folder(output_dir: str | os.PathLike) -> tuple[Path, Path]:
    """For evaluating / predicting without --do_train in a run folder: (the folder's trained model, a new sub-folder
    ``scored-<UTC time>`` for this scoring's results), so the run's own results, card and plots stay as they are.
    ``FileNotFoundError`` when --output_dir holds no final model (config.json and weights)."""
    folder = Path(output_dir)
    has_weights = any((folder / name).is_file() for name in WEIGHTS_NAMES)
    if not ((folder / CONFIG_NAME).is_file() and has_weights):
        raise FileNotFoundError(
            f"--do_eval/--do_predict without --do_train score a trained model, but --output_dir {output_dir} holds "
            "none (no config.json and weights): pass --model_name_or_path <model or checkpoint folder>, or add "
            "--do_train"
        )
    for name in WEIGHTS_NAMES:
        if name.endswith(".safetensors") and (folder / name).is_file():
            problem = safetensors_problem(folder / name)
            if problem:
                raise ValueError(f"--output_dir {output_dir}: the trained model cannot load: {problem}")
    return folder, folder / time.strftime("scored-%Y%m%d-%H%M%S", time.gmtime())


def describe_write_error(error: BaseException, path: str | os.PathLike) -> OSError:
    """An ``OSError`` naming ``path`` for an error raised while writing it: "no space left on device while writing
    <path>" when the disk is full (torch.save reports that as ``RuntimeError: basic_ios::clear: iostream error`` or
    "file write failed", safetensors as ``No space left on device (os error 28)``)."""
    text = str(error)
    full = isinstance(error, OSError) and error.errno == errno.ENOSPC
    if not full and any(sign in text for sign in ("iostream error", "file write failed", "os error 28",
                                                   "No space left")):
        folder = Path(path)
        while not folder.exists() and folder != folder.parent:
            folder = folder.parent
        full = "os error 28" in text or "No space left" in text or shutil.disk_usage(folder).free < 2**26
    if full:
        return OSError(errno.ENOSPC, f"no space left on device while writing {path} ({type(error).__name__}: "
                                     f"{text.strip()[:200]}); free space and resume from the last complete checkpoint")
    return OSError(getattr(error, "errno", None) or errno.EIO,
                   f"writing {path} failed ({type(error).__name__}: {text.strip()[:300]})")


# What describes the final weights and is written after them (the model card and the plots): removed when new weights
# replace the old, so that a kill before they are rewritten leaves no card or plot of other weights.
DESCRIBING_FILES = ("README.md", "*.png")


def save_final_model(trainer: Trainer) -> None:
    """``trainer.save_model()`` (model, tokenizer, training arguments) into --output_dir, safe against a kill: every
    file is first written to a sibling staging folder, then the old config.json is removed and the files are renamed
    into --output_dir, config.json last. A kill at any point leaves either the previous complete model or a folder
    without config.json (which from_pretrained refuses), never a new config.json over old weights. The previous model
    card and plots go before the new weights move in (``DESCRIBING_FILES``); a failed write names its path
    (``describe_write_error``)."""
    output_dir = Path(trainer.args.output_dir).resolve()
    staging = output_dir.with_name(f".{output_dir.name}.saving")
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed save
    trainer.accelerator.wait_for_everyone()
    try:
        trainer.save_model(str(staging))  # on every rank: FSDP and DeepSpeed gather the weights
    except (OSError, RuntimeError) as error:
        raise describe_write_error(error, staging) from error
    if trainer.is_world_process_zero():
        output_dir.mkdir(parents=True, exist_ok=True)
        for pattern in DESCRIBING_FILES:  # they describe the weights being replaced; the script writes new ones
            for path in output_dir.glob(pattern):
                path.unlink()
        (output_dir / CONFIG_NAME).unlink(missing_ok=True)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == CONFIG_NAME):
            os.replace(path, output_dir / path.name)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()
