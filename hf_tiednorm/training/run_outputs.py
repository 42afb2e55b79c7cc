"""What --overwrite_output_dir may delete: the files a run of ours wrote, and nothing another run still uses.

A folder handed to --output_dir can hold more than a previous run's outputs: the YAML/JSON config the run was started
from, notes, data, or another run training in a sub-folder. Deleting the folder's whole contents destroyed those
(a live run lost its checkpoints and lock; ``run_translation.py run.yaml --output_dir .`` deleted run.yaml). So the
deletion is by name: only the entries a run of ours writes (``RUN_OUTPUT_PATTERNS``: its model, tokenizer, copied
remote code, checkpoints, results, card, plots, token counts, run record), and never while a live run holds a
lock anywhere beneath the folder (``live_locks_beneath``). Every other entry is kept and named in the log.

Nor may it delete an input of the run (``run_inputs``: the model, tokenizer, data files, resumed checkpoint, config
file): ``--model_name_or_path X --output_dir X --overwrite_output_dir`` deleted X's model before loading it, since
only an input lying *beneath* a deleted entry was protected. ``check_inputs_kept`` compares every path through which
an input is read (``reached_through``: relative, trailing slash, symlinks along the way; a folder's files, which may
be links) with the entries to delete, by path and by file identity (device and inode: a bind mount of the model
folder as --output_dir), and refuses by name before anything is deleted.
"""

from __future__ import annotations

import fcntl
import fnmatch
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from ..conversion.path_identity import ancestor_ids, file_id
from ..conversion.saved_code import LEGACY_MODULES, REMOTE_CODE_MODULES
from .arguments import config_file_argument

logger = logging.getLogger(__name__)

# A saved model's remote code: the two generated files, or (a folder saved by an earlier version) one copy of each
# model-layer module (conversion/saved_code.py).
REMOTE_CODE_FILES = tuple(sorted(f"{module}.py" for module in {*REMOTE_CODE_MODULES, *LEGACY_MODULES}))

# The names a run of the training scripts writes into --output_dir (transformers' Trainer and save_pretrained
# included): its outputs, and the only entries --overwrite_output_dir deletes.
RUN_OUTPUT_PATTERNS = (
    "checkpoint-*", "scored-*", "runs",  # checkpoints, scoring sub-folders, TensorBoard logs
    "config.json", "generation_config.json", "model.safetensors", "model-*.safetensors", "model.safetensors.index.json",
    "pytorch_model*.bin", "pytorch_model.bin.index.json", "adapter_model.safetensors", "adapter_config.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.json", "merges.txt",
    "added_tokens.json", "chat_template.jinja",
    "training_args.bin", "trainer_state.json", "*_results.json", "test_predictions.txt", "token_counts.pt",
    "README.md", "*.png", "run_record.json", *REMOTE_CODE_FILES,
)


def is_run_output(path: Path) -> bool:
    """Whether ``path`` (an entry of --output_dir) has a name that a run of ours writes."""
    return any(fnmatch.fnmatchcase(path.name, pattern) for pattern in RUN_OUTPUT_PATTERNS)


def live_locks_beneath(folder: Path) -> list[Path]:
    """The run lock files (``.<name>.lock``) beneath ``folder`` that a live process holds: each is tried with a
    non-blocking shared ``flock``, which fails exactly while a run holds its exclusive lock."""
    live = []
    for path in folder.rglob(".*.lock"):
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            live.append(path)
        finally:
            os.close(fd)
    return live


def reached_through(path: str | os.PathLike) -> list[Path]:
    """Every path the file system walks to reach ``path``: each component as named (a symlink itself included),
    with the components before it resolved, then the real path. A spelling through a link (``run/model`` where
    ``run`` links elsewhere, or a link that is an entry of --output_dir) is reached through that link, which a
    deletion of the link would break although its target stays."""
    current = Path.cwd()
    visited = []
    for part in Path(path).parts:
        if part == os.sep:
            current = Path(part)
        elif part == "..":
            current = current.parent
        elif part != ".":
            visited.append(current / part)
            try:
                current = (current / part).resolve()
            except (OSError, RuntimeError):  # a symlink loop: it reads nothing beyond the link
                current = current / part
    return [*visited, current]


def input_paths(value: str) -> list[Path]:
    """The paths an input named ``value`` is read through (``reached_through``): for a folder (a model, tokenizer or
    checkpoint: its files are read), also those of each of its entries, which may be links into another folder."""
    paths = reached_through(value)
    try:
        entries = list(paths[-1].iterdir()) if paths[-1].is_dir() else []
    except OSError:  # unreadable: the run fails reading it, before this check matters
        entries = []
    for entry in entries:
        paths += reached_through(entry)
    return paths


def check_inputs_kept(deleted: list[Path], inputs: dict[str, str | None]) -> None:
    """``ValueError`` naming the flag, its path and the entry, before anything is deleted, when deleting the entries
    ``deleted`` (each a path in a resolved folder; a link is removed, not followed) would remove or cut off an input
    of the run (``inputs``: flag → path: the model, tokenizer, data files, resumed checkpoint, config file), however
    the input is spelled (relative, trailing slash, through a symlink, the output folder itself) or mounted (a bind
    mount: the same device and inode under another path): the input is an entry to delete or lies beneath one, or one
    of its files is such an entry (--output_dir is the model folder)."""
    # By identity (device, inode) as well as by path: --output_dir may be a bind mount of the model folder, whose
    # entries no spelling relates to the model's files (path_identity.py).
    by_identity = {file_id(entry, follow_symlinks=False): entry for entry in deleted}
    by_identity.pop(None, None)
    for flag, value in inputs.items():
        if not value:
            continue
        for path in input_paths(value):
            hit = next((entry for entry in deleted if entry == path or entry in path.parents), None)
            if hit is None:
                hit = next((by_identity[found] for found in ancestor_ids(path) if found in by_identity), None)
            if hit is not None:
                raise ValueError(
                    f"--overwrite_output_dir would delete {hit}, which {flag} {value} reads: nothing has been deleted. "
                    "Give another --output_dir (the run's outputs then go there), or move the input out of it"
                )


def overwritable_entries(output_dir: Path, entries: list[Path], protected: dict[str, str | None]) -> list[Path]:
    """The entries of ``output_dir`` that --overwrite_output_dir deletes: those a run of ours wrote. Refuses
    (``RuntimeError``) when a live run holds a lock beneath ``output_dir``, and (``ValueError``, ``check_inputs_kept``)
    when deleting an entry would remove one of the ``protected`` paths (flag → path: the run's inputs, its config
    file). Logs the entries it keeps."""
    live = live_locks_beneath(output_dir)
    if live:
        holders = ", ".join(str(path) for path in live)
        raise RuntimeError(
            f"--overwrite_output_dir {output_dir}: another run is training beneath it (live lock {holders}); "
            "wait for it to finish or choose another --output_dir"
        )
    ours = [path for path in entries if is_run_output(path)]
    check_inputs_kept(ours, protected)
    kept = [path.name for path in entries if not is_run_output(path)]
    if kept:
        logger.warning("--overwrite_output_dir: keeping %d entries of %s that no run of ours wrote: %s",
                       len(kept), output_dir, ", ".join(kept[:10]) + (", ..." if len(kept) > 10 else ""))
    return ours


def run_inputs(
    model_args, files: dict[str, str], languages: Iterable[str] = (), resume: str | None = None
) -> dict[str, str | None]:
    """The paths a run reads, by flag, for ``prepare_output_dir`` (which refuses to delete one): the model, the
    tokenizer, each data file (a ``{lang}`` pattern for each of ``languages``), the resumed checkpoint and the config
    file."""
    languages = list(languages)
    data = {}
    for split, pattern in files.items():
        expand = "{lang}" in pattern and languages
        names = [pattern.replace("{lang}", lang) for lang in languages] if expand else [pattern]
        data.update({f"--{split}_file ({lang})" if len(names) > 1 else f"--{split}_file": name
                     for lang, name in zip(languages or [None], names)})
    return {"--model_name_or_path": model_args.model_name_or_path, "--tokenizer_name": model_args.tokenizer_name,
            **data, "--resume_from_checkpoint": resume, "the config file": config_file_argument()}


__all__ = [
    "RUN_OUTPUT_PATTERNS", "check_inputs_kept", "input_paths", "is_run_output", "live_locks_beneath",
    "overwritable_entries", "reached_through", "run_inputs",
]
