"""Whether two paths are the same file or folder, by what the file system says (device and inode), not by spelling.

A path's spelling does not tell which file it reaches: a bind mount (``mount --bind model out``) shows one folder
under two paths that no ``resolve()`` relates, and ``--output_dir out --overwrite_output_dir`` then deleted the
model through ``out``. Every check that a command's output is not its input (the converter's output folder, the
training scripts' deletions) compares ``(st_dev, st_ino)`` here, as ``os.path.samefile`` does. A hard-linked file
has the identity of the file it links to as well: such a check then refuses where deleting the link would have
kept the other name, which errs on the side of keeping data.
"""

from __future__ import annotations

import os
from pathlib import Path

FileId = tuple[int, int]


def file_id(path: str | os.PathLike, *, follow_symlinks: bool = True) -> FileId | None:
    """(st_dev, st_ino) of ``path``, or None where it does not exist (or cannot be read); with
    ``follow_symlinks=False`` a symlink's own identity (what removing the link removes)."""
    try:
        stat = os.stat(path, follow_symlinks=follow_symlinks)
    except (OSError, ValueError):
        return None
    return stat.st_dev, stat.st_ino


def ancestor_ids(path: str | os.PathLike) -> list[FileId]:
    """The identities of ``path`` (itself, not followed if a link) and of every existing folder above it (absolute),
    innermost first: a file or folder with one of them is ``path`` or contains it."""
    path = Path(os.path.abspath(path))
    ids = [file_id(path, follow_symlinks=False)]
    ids += [file_id(parent) for parent in path.parents]
    return [found for found in ids if found is not None]


def is_same_or_inside(path: str | os.PathLike, folder: str | os.PathLike) -> bool:
    """Whether ``path`` (existing or not) is the folder ``folder`` or lies inside it, however either is spelled or
    mounted: ``folder``'s identity is that of ``path`` or of one of its ancestors (symlinks along ``path`` resolved
    first)."""
    target = file_id(folder)
    if target is None:
        return False
    resolved = Path(path).resolve()
    return target in {file_id(resolved), *(file_id(parent) for parent in resolved.parents)} - {None}


__all__ = ["FileId", "ancestor_ids", "file_id", "is_same_or_inside"]
