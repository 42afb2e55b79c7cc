"""Whether a checkpoint's files can be read, checked cheaply before a resume commits to it.

The files' presence is not enough: a truncated ``optimizer.pt``, ``scheduler.pt`` or ``rng_state.pth`` passed the
completeness test, ``--resume_from_checkpoint last`` chose it over an earlier good one, and the run died after the
data preparation with "PytorchStreamReader failed ... central directory" naming no file; weights lacking a tensor of
the model (``model.shared.weight``) resumed with that tensor freshly initialized. ``archive_problem`` reads a torch
archive's zip central directory (a few kB at the end of the file, no tensor data); ``missing_weight_names`` compares
the safetensors header's tensor names with the model the checkpoint's config builds on the meta device (no memory),
counting tied tensors once and skipping the names the model does not save.
"""

from __future__ import annotations

import json
import re
import struct
import zipfile
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM
from transformers.trainer import TRAINER_STATE_NAME

# The torch archives a Trainer checkpoint holds (torch.save's zip format), its weights in torch's format included.
ARCHIVE_PATTERNS = ("optimizer.pt", "scheduler.pt", "rng_state*.pth", "pytorch_model*.bin")
# torch.save's legacy (pre-1.6, non-zip) format starts with a pickle: not an archive, and not checked here.
LEGACY_PATTERNS = ("pytorch_model*.bin",)


def archive_problem(path: Path) -> str | None:
    """Why the torch archive ``path`` cannot be read (not a zip archive, its central directory cut off, a member's
    data past the end, a zip without torch's records: no ``<name>/data.pkl``), or None. A ``pytorch_model*.bin``
    in torch's legacy pickle format (no zip) is not checked."""
    try:
        if any(path.match(pattern) for pattern in LEGACY_PATTERNS):
            with open(path, "rb") as handle:
                if handle.read(1) == b"\x80":  # a pickle's PROTO opcode: the legacy format
                    return None
        with zipfile.ZipFile(path) as archive:
            size = path.stat().st_size
            infos = archive.infolist()
            for info in infos:
                if info.header_offset + info.compress_size > size:
                    return f"{path.name} is truncated (member {info.filename} ends past the file's {size} bytes)"
            if not any(info.filename.endswith("data.pkl") for info in infos):
                names = ", ".join(info.filename for info in infos[:3]) or "none"
                return (f"{path.name} is a zip archive but not one torch.save wrote (no data.pkl record; its members: "
                        f"{names})")
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        return f"{path.name} cannot be read as a torch archive ({type(error).__name__}: {error}; truncated?)"
    return None


def archive_problems(folder: Path) -> list[str]:
    """``archive_problem`` of every torch archive of the checkpoint ``folder``."""
    paths = sorted({path for pattern in ARCHIVE_PATTERNS for path in folder.glob(pattern)})
    return [problem for path in paths if (problem := archive_problem(path))]


def trainer_state_problem(path: Path) -> str | None:
    """Why the Trainer's state ``path`` (``trainer_state.json``) cannot resume a run, or None: unreadable, not JSON
    (a save interrupted), or not an object with an integer ``global_step`` (``{}``, ``[]``, ``null``)."""
    try:
        state = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as error:
        return f"no valid {path.name} (its save was interrupted? {type(error).__name__}: {str(error)[:80]})"
    if not isinstance(state, dict):
        return f"{path.name} holds {type(state).__name__ if state is not None else 'null'}, not the Trainer's state"
    step = state.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return f"{path.name} has no global_step (a step count; it holds {step!r})"
    return None


def read_trainer_state(folder: str | Path) -> dict:
    """The checkpoint ``folder``'s ``trainer_state.json``; ``ValueError`` naming the file when it cannot serve
    (``trainer_state_problem``)."""
    path = Path(folder) / TRAINER_STATE_NAME
    problem = trainer_state_problem(path)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return json.loads(path.read_text())


def _saved_names(path: Path) -> set[str]:
    with open(path, "rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    return {name for name in header if name != "__metadata__"}


def missing_weight_names(folder: Path) -> list[str]:
    """The model tensors that the checkpoint's ``model.safetensors`` lacks: the model its ``config.json`` builds
    (on the meta device), a tied group counting as present when any of its names is saved, the names the model
    does not save or may miss at load (``_keys_to_ignore_on_save`` / ``_keys_to_ignore_on_load_missing``) left out.
    [] when the folder has no single model.safetensors or its config builds no model here (nothing to compare)."""
    weights, config_file = folder / "model.safetensors", folder / "config.json"
    if not (weights.is_file() and config_file.is_file()):
        return []
    try:
        saved = _saved_names(weights)
        config = AutoConfig.from_pretrained(folder)
        auto_class = AutoModelForSeq2SeqLM if getattr(config, "is_encoder_decoder", False) else AutoModelForCausalLM
        with torch.device("meta"):
            model = auto_class.from_config(config)
    except Exception:  # noqa: BLE001  (an unreadable header is safetensors_problem's to name; no model: no check)
        return []
    ignored = [*(getattr(model, "_keys_to_ignore_on_save", None) or []),
               *(getattr(model, "_keys_to_ignore_on_load_missing", None) or [])]
    groups: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not any(re.search(pattern, name) for pattern in ignored):
            groups.setdefault(id(tensor), []).append(name)
    return sorted(names[0] for names in groups.values() if not saved.intersection(names))


__all__ = [
    "archive_problem", "archive_problems", "missing_weight_names", "read_trainer_state", "trainer_state_problem",
]
