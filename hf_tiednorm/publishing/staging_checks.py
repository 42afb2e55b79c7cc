"""What must not be staged for upload: a token, a path of this machine, a file that cannot be read.

``tiednorm-push`` publishes a checkpoint folder written on a private machine. Transformers' ``training_args.bin``
pickles ``TrainingArguments`` with ``hub_token`` in clear (the training scripts strip it since; older folders may
hold one); a card or config written by an older run may name the local folder it was fine-tuned from; a corrupt
``tokenizer.json`` failed half-way through staging with a bare JSONDecodeError. ``training_args_token`` reads the
pickle's opcodes without running it; ``check_staged_files`` refuses a staged folder with an absolute path of this
machine in its card or JSON files; ``check_tokenizer_files`` names an unreadable tokenizer JSON before staging.
"""

from __future__ import annotations

import json
import pickletools
import zipfile
from pathlib import Path

from .provenance import local_paths_in

# Staged text files that the checkpoint's own run wrote (the .py code files are the package's).
CHECKED_PATTERNS = ("*.md", "*.json", "*.txt", "*.jinja")


def training_args_token(path: Path) -> bool:
    """Whether the pickled ``TrainingArguments`` in ``path`` (torch.save's zip) holds a ``hub_token`` that is not
    None. Reads the pickle's opcodes only (``pickletools``), so nothing in the file runs."""
    try:
        with zipfile.ZipFile(path) as archive:
            name = next(name for name in archive.namelist() if name.endswith("data.pkl"))
            data = archive.read(name)
    except (OSError, zipfile.BadZipFile, StopIteration):
        data = path.read_bytes()  # an old-style (non-zip) torch.save: a plain pickle
    try:
        ops = list(pickletools.genops(data))
    except Exception:  # noqa: BLE001  (unreadable: look for the key in the bytes instead)
        return b"hub_token" in data and b"hf_" in data
    memo_ops = ("BINPUT", "LONG_BINPUT", "MEMOIZE", "PUT")
    for index, (_, arg, _) in enumerate(ops):
        if arg == "hub_token":
            following = [op.name for op, _, _ in ops[index + 1:] if op.name not in memo_ops]
            return bool(following) and following[0] != "NONE"
    return False


def check_no_token(checkpoint: Path) -> None:
    """``ValueError`` when the checkpoint's ``training_args.bin`` holds a Hub token (``training_args_token``)."""
    path = checkpoint / "training_args.bin"
    if path.is_file() and training_args_token(path):
        raise ValueError(
            f"{path} holds a Hub token (TrainingArguments.hub_token, pickled in clear): revoke that token, delete or "
            "re-save the file without it, then stage again (training_args.bin is never uploaded, but a folder "
            "holding a token is not one to publish from)"
        )


def check_tokenizer_files(folder: Path) -> None:
    """``ValueError`` naming the tokenizer JSON file of ``folder`` that does not parse."""
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, ValueError) as error:
                raise ValueError(f"{path} is not valid JSON ({error}): the tokenizer cannot load; re-save it") from None


def check_staged_files(folder: Path) -> None:
    """``ValueError`` naming each staged card/JSON file of ``folder`` that holds an absolute path of this machine."""
    leaks = {}
    for pattern in CHECKED_PATTERNS:
        for path in sorted(folder.glob(pattern)):
            found = local_paths_in(path.read_text(encoding="utf-8", errors="replace"))
            if found:
                leaks[path.name] = found
    if leaks:
        listed = "; ".join(f"{name}: {', '.join(paths[:3])}" for name, paths in leaks.items())
        raise ValueError(f"the files to upload name paths of this machine ({listed}); remove them (a card's "
                         "base_model must be a Hub id) and stage again")


__all__ = ["check_no_token", "check_staged_files", "check_tokenizer_files", "training_args_token"]
