"""llama.cpp serves a plain export: ``convert_to_gguf`` writes it as GGUF with the converter llama.cpp ships,
``llama_greedy`` continues token-id prompts greedily in llama-cpp-python, ``transformers_greedy`` does the same in
transformers (the reference). experiments/engines/llama_cpp_check.py runs them on the SmolLM2-135M export
(docs/deploy.md); tests/test_export_llama_cpp.py (``slow``) checks the continuations agree.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch


def convert_to_gguf(plain: Path, llama_cpp: Path, outtype: str, out: Path) -> Path:
    """``convert_hf_to_gguf.py plain --outtype outtype`` with the gguf-py it ships (llama_cpp: the llama.cpp tree)."""
    env = {**os.environ, "PYTHONPATH": str(llama_cpp / "gguf-py"), "NO_LOCAL_GGUF": ""}
    command = [sys.executable, str(llama_cpp / "convert_hf_to_gguf.py"), str(plain), "--outtype", outtype,
               "--outfile", str(out)]  # fmt: skip
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"convert_hf_to_gguf.py failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return out


def llama_greedy(
    path: Path, prompts: list[list[int]], new_tokens: int, suppress: tuple[int, ...] = ()
) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy continuations by llama.cpp of token-id ``prompts`` (fed as ids: no second tokenizer involved), and the
    logits of each prompt's last position. ``suppress``: token ids never chosen (the end-of-sequence ids, as
    transformers' ``min_new_tokens`` forbids them until the last token: without it the two engines follow different
    decoding rules once a model wants to stop)."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=torch.get_num_threads())
    continuations, last_logits = [], []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        last_logits.append(np.array(llm.scores[len(ids) - 1], dtype=np.float32))
        out = []
        for _ in range(new_tokens):
            scores = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            scores[list(suppress)] = -np.inf
            token = int(np.argmax(scores))
            out.append(token)
            llm.eval([token])
        continuations.append(out)
    return continuations, last_logits


@torch.no_grad()
def transformers_greedy(model, prompts: list[list[int]], new_tokens: int, margins: list | None = None):
    """Greedy continuations and last-prompt-position logits by transformers; with ``margins`` (a list), append per
    prompt the top-1 minus top-2 logit of each generated step (a near-tie is a small margin)."""
    continuations, last_logits = [], []
    for ids in prompts:
        tensor = torch.tensor([ids], device=model.device)
        last_logits.append(model(input_ids=tensor).logits[0, -1].float().cpu().numpy())
        generated = model.generate(
            tensor, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
        continuations.append(generated.sequences[0, len(ids):].tolist())
        if margins is not None:
            top2 = [step[0].float().topk(2).values for step in generated.logits]
            margins.append([float(v[0] - v[1]) for v in top2])
    return continuations, last_logits
