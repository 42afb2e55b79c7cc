"""What must not be staged for upload or export: a token, a path of this machine, a file that cannot be read, another
model's tokenizer, a head mode the staged code does not define; and how a folder is staged (atomically).

``tiednorm-push`` publishes a checkpoint folder written on a private machine. Transformers' ``training_args.bin``
pickles ``TrainingArguments`` with ``hub_token`` in clear (the training scripts strip it since; older folders may
hold one); a card or config written by an older run may name the local folder it was fine-tuned from; a corrupt
``tokenizer.json`` failed half-way through staging with a bare JSONDecodeError. ``training_args_token`` reads the
pickle's opcodes without running it; ``check_staged_files`` refuses a staged folder with an absolute path of this
machine in its card or JSON files; ``check_tokenizer_files`` names an unreadable tokenizer JSON before staging;
``check_tokenizer_fits`` refuses a tokenizer whose ids the model cannot look up (another model's, issue 40 S8);
``unshipped_head_mode`` says why the remote code copied beside a model would not define its head mode (a mode
registered at runtime, issue 40 S6); ``check_new_folder`` refuses an output folder that is a file, not empty, or
inside the folder read from; ``staged_folder`` writes a folder beside its target and renames it into place, so that
a failure leaves nothing half-written (issue 40 U6).
"""

from __future__ import annotations

import json
import os
import pickletools
import re
import shutil
import struct
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from transformers import AutoTokenizer

from ..modeling.head import modes as head_modes
from .path_identity import is_same_or_inside

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


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def find_tokenizer(
    checkpoint: Path | None, tokenizer: str | os.PathLike | None, *, required: bool = False
) -> Path | None:
    """The folder whose tokenizer is staged: ``tokenizer`` when given (``FileNotFoundError`` naming it when it is
    no folder or holds no tokenizer: it was asked for), else ``checkpoint`` when it holds one, else None
    (``FileNotFoundError`` with ``required``)."""
    if tokenizer is not None:
        source = Path(tokenizer)
        if not source.is_dir():
            raise FileNotFoundError(f"tokenizer folder not found: {source} (--tokenizer / tokenizer=)")
        if not any((source / name).is_file() for name in TOKENIZER_FILES):
            raise FileNotFoundError(f"no tokenizer ({' / '.join(TOKENIZER_FILES)}) in {source} (--tokenizer)")
        return source
    if checkpoint is not None and any((checkpoint / name).is_file() for name in TOKENIZER_FILES):
        return checkpoint
    if required:
        raise FileNotFoundError(
            f"no tokenizer ({' / '.join(TOKENIZER_FILES)}) in {checkpoint}; pass the tokenizer folder with "
            "`tokenizer=` (CLI: --tokenizer)"
        )
    return None


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


def check_new_folder(folder: Path, what: str, *, outside: Path | None = None) -> None:
    """Refuse ``folder`` as the folder a command writes: a file (or a path below a file), a folder that is not empty,
    or, with ``outside``, a folder that is or lies inside ``outside`` (the checkpoint read from). ``what`` names it."""
    existing = next(path for path in (folder, *folder.absolute().parents) if path.exists())
    if not existing.is_dir():
        named = "is a file" if existing == folder else f"lies below {existing}, which is a file"
        raise NotADirectoryError(f"{what} {folder} {named}: choose a new or empty folder")
    if outside is not None and is_same_or_inside(folder, outside):  # by device and inode (path_identity.py)
        raise ValueError(f"{what} {folder} must lie outside the checkpoint folder {outside}, which is only read")
    if folder.is_dir() and any(folder.iterdir()):
        raise FileExistsError(f"{folder} is not empty; choose a new or empty folder for the {what}")


@contextmanager
def staged_folder(folder: Path) -> Iterator[Path]:
    """A new folder beside ``folder`` to write into; renamed to ``folder`` (new or empty, checked by the caller) when
    the block ends, removed when it raises: a failed staging leaves no half-written ``folder`` (which made the
    rerun refuse it as "not empty")."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    partial = folder.parent / f".{folder.name}.staging-{uuid.uuid4().hex[:8]}"
    partial.mkdir()  # mkdir, not mkdtemp: the folder gets the user's umask, not 0700
    try:
        yield partial
        if folder.exists():
            folder.rmdir()  # empty (checked)
        os.replace(partial, folder)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def check_weight_files(folder: Path) -> None:
    """``ValueError`` naming each ``*.safetensors`` file of ``folder`` that is truncated or has no valid header (the
    loader's own error names no file)."""

    problems = [problem for path in sorted(folder.glob("*.safetensors")) if (problem := safetensors_problem(path))]
    if problems:
        raise ValueError(f"the weights in {folder} cannot load: {'; '.join(problems)}; save the model again")


def _ids(value) -> set[int]:
    if value is None:
        return set()
    return {int(v) for v in value} if isinstance(value, (list, tuple)) else {int(value)}


def check_tokenizer_fits(tokenizer, model, tokenizer_source: Path | str, model_source: Path | str) -> None:
    """``ValueError`` naming both folders when ``tokenizer`` is not one ``model`` can use: an id it produces (its
    vocabulary, its special tokens) that the model's embedding has no row for, or an end-of-sequence token other
    than the model's (config, text config and generation config) where both define one. Another model's tokenizer
    passed silently and failed at the first use with an IndexError."""
    config = model.config
    configs = (config, config.get_text_config()) if hasattr(config, "get_text_config") else (config,)
    vocab_size = max(getattr(c, key, None) or 0 for c in configs for key in ("vocab_size", "decoder_vocab_size"))
    where = f"the tokenizer of {tokenizer_source} does not belong to the model of {model_source}"
    special = [getattr(tokenizer, f"{name}_token_id", None) for name in ("pad", "bos", "eos", "unk")]
    highest = max([len(tokenizer) - 1, *(i for i in special if i is not None)])
    if highest >= vocab_size:
        raise ValueError(
            f"{where}: it has {len(tokenizer)} tokens (ids up to {highest}), the model's vocab_size is {vocab_size}, "
            "so its ids would index past the embedding. Pass the model's own tokenizer (--tokenizer / tokenizer=)"
        )
    generation = getattr(model, "generation_config", None)
    expected = set().union(*(_ids(getattr(c, "eos_token_id", None)) for c in (*configs, generation) if c is not None))
    if tokenizer.eos_token_id is not None and expected and tokenizer.eos_token_id not in expected:
        raise ValueError(
            f"{where}: its end-of-sequence token id is {tokenizer.eos_token_id}, the model's is {sorted(expected)} "
            "(config.json / generation_config.json), so generation would not stop where the model learned to. Pass "
            "the model's own tokenizer (--tokenizer / tokenizer=)"
        )


def unshipped_head_mode(name: str) -> str | None:
    """Why the package's code, generated into a saved model's folder as its remote code, would not score as this process
    does in head mode ``name``: a mode added or redefined at runtime (``register_head_mode``) lives only in this
    process. None for a mode the code defines itself."""
    mode = head_modes.get_head_mode(name)
    cls = type(mode)
    if cls.__module__ == head_modes.__name__ and getattr(head_modes, cls.__name__, None) is cls and not vars(mode):
        return None
    return (
        f"head_mode {name!r} was registered at runtime (register_head_mode: {cls.__module__}.{cls.__qualname__}); "
        "the remote code saved with the model (modeling_tiednorm.py, generated from "
        "hf_tiednorm/modeling/head/modes.py) "
        "does not define it, so from_pretrained(..., trust_remote_code=True) would refuse the model"
    )


_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[\w.@+-]+(?:/[\w.@+-]+)+")


def local_paths_in(text: str) -> list[str]:
    """The absolute paths of this machine (that exist here) named in ``text``."""
    found = []
    for candidate in _ABSOLUTE_PATH.findall(text):
        path = candidate.rstrip(".,;:)")
        if os.path.exists(path) or os.path.exists(os.path.dirname(path)) and os.path.dirname(path) != "/":
            found.append(path)
    return sorted(set(found))


def safetensors_problem(path: Path) -> str | None:
    """Why the safetensors file ``path`` cannot load (unreadable or malformed header, truncated data), or None.
    Reads the header only: 8 bytes of length, then the JSON header whose offsets give the data size."""
    try:
        with open(path, "rb") as handle:
            (length,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(length))
    except (OSError, struct.error, ValueError) as error:
        return f"{path.name} has no valid safetensors header ({type(error).__name__})"
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    expected, size = 8 + length + end, path.stat().st_size
    if size < expected:
        return f"{path.name} is truncated ({size} of {expected} bytes)"
    return None


def has_chat_template(folder: Path) -> bool:
    """Whether the folder's tokenizer has a chat template (``chat_template.jinja``, or ``chat_template`` in
    ``tokenizer_config.json``): the card's usage snippet then goes through it."""
    if (folder / "chat_template.jinja").is_file() or (folder / "chat_template.json").is_file():
        return True
    try:
        return bool(json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8")).get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


def copy_tokenizer(source: str | os.PathLike, output_dir: str | os.PathLike, **load_options):
    """Re-save the tokenizer of ``source`` into ``output_dir`` without this machine's load settings (the converter
    and ``tiednorm-push`` ship a tokenizer so), and return it; ``load_options``: more ``AutoTokenizer.from_pretrained``
    arguments."""
    tokenizer = AutoTokenizer.from_pretrained(source, **load_options)
    # Load-time bookkeeping that transformers keeps in init_kwargs describes this machine (e.g. offline mode), not
    # the tokenizer; published, it would make every user's load local-only.
    for key in ("is_local", "local_files_only"):
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(output_dir)
    return tokenizer



def save_staged(model, output_dir: Path, source: Path, has_tokenizer: bool, load: dict) -> None:
    """Save ``model`` and the source's tokenizer to ``output_dir``, staged beside it and renamed into place: a failure
    (a tokenizer that does not load, a full disk) leaves no half-written output folder, as the exports do
    (``staged_folder``)."""
    with staged_folder(output_dir) as partial:
        model.save_pretrained(partial)
        if has_tokenizer:
            try:
                copy_tokenizer(source, partial, **load)
            except (OSError, ValueError, TypeError, KeyError, RuntimeError) as error:
                raise ValueError(
                    f"the tokenizer of {source} does not load ({type(error).__name__}: {error}); nothing was "
                    f"written to {output_dir}: repair or re-save the source's tokenizer files"
                ) from error


__all__ = [
    "copy_tokenizer", "has_chat_template", "save_staged",
    "local_paths_in", "safetensors_problem",
    "check_new_folder",
    "check_no_token",
    "check_staged_files",
    "check_tokenizer_files",
    "check_tokenizer_fits",
    "check_weight_files",
    "find_tokenizer",
    "staged_folder",
    "training_args_token",
    "unshipped_head_mode",
]
