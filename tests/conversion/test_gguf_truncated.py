"""A truncated ``.gguf`` given to ``tiednorm-convert`` is named, with its size and the word "truncated", whether it is
cut off in its header or in its tensor data (it used to fail with a bare ``struct.error`` / numpy reshape error)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hf_tiednorm.convert import main

gguf = pytest.importorskip("gguf")


def write_gguf(path) -> int:
    """A small valid GGUF file (llama metadata, two fp32 tensors); returns its size in bytes."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(64)
    writer.add_embedding_length(32)
    writer.add_tensor("token_embd.weight", np.ones((61, 32), dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.stat().st_size


@pytest.mark.parametrize("keep", [40, 200, -100])  # in the header, in the metadata/tensor infos, in the tensor data
def test_a_truncated_gguf_is_named_as_truncated(keep, tmp_path):
    complete = tmp_path / "complete.gguf"
    size = write_gguf(complete)
    gguf.GGUFReader(complete)  # the untruncated file reads
    cut = tmp_path / "model.gguf"
    cut.write_bytes(complete.read_bytes()[: keep if keep > 0 else size + keep])
    with pytest.raises(ValueError, match=rf"{re.escape(str(cut))} .*truncated"):
        main([str(cut), str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
