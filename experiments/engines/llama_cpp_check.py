"""llama.cpp serves a plain export (issue 32): an exported causal LM goes through llama.cpp's own
``convert_hf_to_gguf.py`` (the copy vendored by the llama-cpp-python sdist) to GGUF (f32 and f16), and llama.cpp
(through llama-cpp-python) continues 10 prompts greedily as transformers does, with close logits in f32.

The export is the one of experiments/engines/onnx_export.py (SmolLM2-135M, cosine + lossless start, fine-tuned a few
steps); pass its folder, or let this script make it. Writes ``results/llama_cpp.json``::

    python experiments/engines/llama_cpp_check.py --llama-cpp-source /path/to/llama_cpp_python-0.3.36 [--plain DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
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


def llama_greedy(path: Path, prompts: list[list[int]], new_tokens: int) -> tuple[list[list[int]], list[np.ndarray]]:
    """Greedy continuations by llama.cpp of token-id ``prompts`` (fed as ids: no second tokenizer involved), and the
    logits of each prompt's last position."""
    from llama_cpp import Llama

    llm = Llama(model_path=str(path), n_ctx=512, logits_all=True, verbose=False, n_threads=torch.get_num_threads())
    continuations, last_logits = [], []
    for ids in prompts:
        llm.reset()
        llm.eval(ids)
        last_logits.append(np.array(llm.scores[len(ids) - 1], dtype=np.float32))
        out = []
        for _ in range(new_tokens):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            out.append(token)
            llm.eval([token])
        continuations.append(out)
    return continuations, last_logits


@torch.no_grad()
def transformers_greedy(model, prompts: list[list[int]], new_tokens: int):
    continuations, last_logits = [], []
    for ids in prompts:
        tensor = torch.tensor([ids])
        last_logits.append(model(input_ids=tensor).logits[0, -1].float().numpy())
        generated = model.generate(tensor, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
        continuations.append(generated[0, len(ids):].tolist())
    return continuations, last_logits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp-source", required=True, help="the llama-cpp-python sdist (has vendor/llama.cpp)")
    parser.add_argument("--plain", help="folder of an exported causal LM (default: make the SmolLM2 export)")
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt (default: %(default)s)")
    parser.add_argument("--output", default="results/llama_cpp.json", help="JSON result (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from onnx_export import _cpu, _sentences, smollm2_export
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix="tiednorm_llama_"))
    plain = Path(args.plain) if args.plain else None
    if plain is None:
        smollm2_export(work, 8)
        plain = work / "plain"
    tokenizer = AutoTokenizer.from_pretrained(plain)
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    prompts = [tokenizer(text)["input_ids"] for text in _sentences(74)[-10:]]
    expected, expected_logits = transformers_greedy(model, prompts, args.new_tokens)
    llama_cpp = Path(args.llama_cpp_source) / "vendor" / "llama.cpp"
    import llama_cpp as llama_cpp_python

    record = {"cpu": _cpu(), "llama_cpp_python": llama_cpp_python.__version__, "model": model.config.model_type,
              "exported_from": "SmolLM2-135M cosine + lossless start, fine-tuned, tiednorm-export",
              "prompts": len(prompts), "new_tokens": args.new_tokens}  # fmt: skip
    for outtype in ("f32", "f16"):
        gguf = convert_to_gguf(plain, llama_cpp, outtype, work / f"plain.{outtype}.gguf")
        continuations, logits = llama_greedy(gguf, prompts, args.new_tokens)
        same = sum(a == b for a, b in zip(continuations, expected))
        first_divergence = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(continuations, expected)
        ]
        record[outtype] = {
            "greedy_identical": f"{same}/{len(prompts)}",
            "first_divergent_token": first_divergence,
            "max_abs_last_logit_diff": max(float(np.abs(a - b).max()) for a, b in zip(logits, expected_logits)),
        }
    Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
