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

# The torch archives a Trainer checkpoint holds (torch.save's zip format).
ARCHIVE_PATTERNS = ("optimizer.pt", "scheduler.pt", "rng_state*.pth")


def archive_problem(path: Path) -> str | None:
    """Why the torch archive ``path`` cannot be read (not a zip archive, its central directory cut off, a member's
    data past the end), or None."""
    try:
        with zipfile.ZipFile(path) as archive:
            size = path.stat().st_size
            for info in archive.infolist():
                if info.header_offset + info.compress_size > size:
                    return f"{path.name} is truncated (member {info.filename} ends past the file's {size} bytes)"
    except (OSError, zipfile.BadZipFile, ValueError) as error:
        return f"{path.name} cannot be read as a torch archive ({type(error).__name__}: {error}; truncated?)"
    return None


def archive_problems(folder: Path) -> list[str]:
    """``archive_problem`` of every torch archive of the checkpoint ``folder``."""
    paths = sorted({path for pattern in ARCHIVE_PATTERNS for path in folder.glob(pattern)})
    return [problem for path in paths if (problem := archive_problem(path))]


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


__all__ = ["archive_problem", "archive_problems", "missing_weight_names"]
