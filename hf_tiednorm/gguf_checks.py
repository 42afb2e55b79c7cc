"""A GGUF file is read whole before the conversion starts, so that a truncated or corrupt file is named as such.

transformers parses a GGUF file with the ``gguf`` package, which fails on a cut-off file with whatever the first
short read raises: ``struct.error: unpack_from requires a buffer of at least 101 bytes`` in the header, ``cannot
reshape array of size 214336 into shape (49152,612)`` in the tensor data, naming neither the file nor the cause.
``check_gguf_file`` parses the header and maps every tensor (cheap: a memory map) and turns any such failure into an
error naming the file, its size and that it is truncated or corrupt.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path


def check_gguf_file(path: str | os.PathLike) -> None:
    """Raise ``ValueError`` naming ``path`` when it is not a complete GGUF file (cut off in its header, its metadata
    or its tensor data, or not GGUF at all); do nothing for a readable one, or when the ``gguf`` package is missing
    (transformers then says to install it)."""
    try:
        from gguf import GGUFReader
    except ImportError:
        return
    path = Path(path)
    size = path.stat().st_size
    try:
        reader = GGUFReader(path)
        end = max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors), default=0)
    except (struct.error, ValueError, IndexError, EOFError, OverflowError) as error:
        raise ValueError(
            f"{path} ({size} bytes) is not a complete GGUF file: it is truncated or corrupt (reading it failed with "
            f"{type(error).__name__}: {error}); download or copy it again"
        ) from error
    if end > size:
        raise ValueError(
            f"{path} is truncated: its tensors end at byte {end} but the file has {size} bytes; download or copy it "
            "again"
        )


__all__ = ["check_gguf_file"]
