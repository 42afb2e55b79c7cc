"""GGUF in: ``drop_quantization_state`` (a dequantized GGUF model loses the loader's quantization state, so it
saves and fine-tunes as a plain model) and ``check_gguf_file``: a GGUF file is read whole before the conversion
starts, so that a truncated or corrupt file is named as such.

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

from transformers import PreTrainedModel


def drop_quantization_state(model: PreTrainedModel) -> None:
    """Remove the GGUF loader's quantization state from ``model`` (and its config) in place; refuse a model whose
    weights are still quantized.

    transformers dequantizes a GGUF file into plain tensors but keeps ``quantization_config`` (quant_method "gguf")
    and an ``hf_quantizer``: such a model refuses ``save_pretrained``, and a folder saved with that config reloads
    as "quantized", which the Trainer refuses to fine-tune.
    """
    quantizer = getattr(model, "hf_quantizer", None)
    config = getattr(model.config, "quantization_config", None)
    if quantizer is None and config is None:
        return
    method = getattr(config, "quant_method", None) if not isinstance(config, dict) else config.get("quant_method")
    method = getattr(method, "value", method)
    if method != "gguf":
        raise ValueError(
            f"{type(model).__name__} is quantized ({method}): its weights are not plain tensors, so the normalized "
            "head could not read their row norms and the conversion could not be saved; load it unquantized"
        )
    if quantizer is not None:
        quantizer.remove_quantization_config(model)
    elif hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False



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


__all__ = ["drop_quantization_state", "check_gguf_file"]
