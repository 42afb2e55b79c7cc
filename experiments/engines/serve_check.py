"""``transformers serve`` / ``transformers chat`` with a normalized folder and with its export (issue 57): whether the
loader behind them builds the model, and if it does, whether its greedy tokens are ``from_pretrained``'s.

The loader is transformers' own (``transformers.cli.serving.model_manager.ModelManager.load_model_and_processor``, what
every request of the server runs; the HTTP layer, fastapi and uvicorn, is not needed to reach it)::

    python experiments/engines/serve_check.py FOLDER [FOLDER ...] [--tokens 8] [--output results/serve.json]

Each folder's entry of the JSON is replaced, the others kept.
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch


def served(folder: str, tokens: int) -> dict:
    """What the server's loader does with ``folder`` (``trust_remote_code=True``, as ``transformers serve
    --trust-remote-code`` passes it), and the greedy continuation of a short prompt."""
    from transformers import AutoModelForCausalLM
    from transformers.cli.serving.model_manager import ModelManager

    manager = ModelManager(device="cpu", dtype="float32", trust_remote_code=True)
    try:
        model, processor = manager.load_model_and_processor(folder)
    except Exception as error:  # noqa: BLE001  (a failure is a result)
        return {"outcome": "failed", "message": f"{type(error).__name__}: {error}"}
    prompt = processor("A man rides a bike", return_tensors="pt")
    expected = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    settings = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False}
    with torch.no_grad():
        got = model.generate(**prompt, **settings)
        want = expected.generate(**prompt, **settings)
    return {"outcome": "served", "class": type(model).__name__, "greedy_tokens_equal": bool(torch.equal(got, want))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="+", help="saved causal LM folders: normalized (remote code) or exported")
    parser.add_argument("--tokens", type=int, default=8, help="greedy tokens compared (default: %(default)s)")
    parser.add_argument("--output", default="results/serve.json", help="JSON written (default: %(default)s)")
    args = parser.parse_args(argv)

    import transformers

    path = Path(args.output)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["versions"] = {"transformers": transformers.__version__, "torch": torch.__version__,
                           "cpu": platform.processor() or platform.machine()}
    for folder in args.folders:
        results[Path(folder).name] = served(folder, args.tokens)
        print(Path(folder).name, json.dumps(results[Path(folder).name]), flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
