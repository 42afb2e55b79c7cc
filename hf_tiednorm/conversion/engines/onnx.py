"""ONNX Runtime serves a plain export (issue 32): the exported parent model goes through torch's own exporter
(``torch.onnx.export(..., dynamo=True)``, onnxscript) unchanged and runs in ``onnxruntime`` with PyTorch's logits.

* causal LM: one graph ``input_ids -> logits`` (no KV cache: ``use_cache=False``; decoding re-runs the prefix);
* encoder-decoder: two graphs, the encoder ``(input_ids, attention_mask) -> encoder_hidden_states`` and one decoder
  step ``(decoder_input_ids, encoder_hidden_states, attention_mask) -> logits`` of the whole decoder prefix (no KV
  cache), the split ``generate`` itself uses: encode once, decode step by step.

Needs the ``onnx`` extra (``python -m pip install -e ".[onnx]"``); tests/test_export_engines.py runs it on tiny
models and experiments/engines/onnx_export.py measures it on SmolLM2-135M and a Multi30k-sized Marian model
(docs/deploy.md).
"""


from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn


class CausalLogits(nn.Module):
    """``input_ids (batch, length) -> logits (batch, length, V)`` of a causal LM, without a KV cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, use_cache=False).logits


class EncoderStep(nn.Module):
    """``(input_ids, attention_mask) -> encoder_hidden_states`` of an encoder-decoder."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.get_encoder()

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class DecoderStep(nn.Module):
    """``(decoder_input_ids, encoder_hidden_states, attention_mask) -> logits`` of the whole decoder prefix, through
    the model's own forward (its output layer and ``final_logits_bias`` included), without a KV cache."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, decoder_input_ids, encoder_hidden_states, attention_mask):
        return self.model(
            encoder_outputs=(encoder_hidden_states,),
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            use_cache=False,
        ).logits


def export_onnx(module: nn.Module, args: tuple, names: list[str], path: Path, dynamic: dict) -> Path:
    """``torch.onnx.export`` (the dynamo exporter) of ``module`` called with ``args`` to ``path``; ``dynamic`` maps
    an input name to {axis: name} of its dynamic axes."""
    torch.onnx.export(
        module.eval(),
        args,
        str(path),
        input_names=names,
        output_names=["output"],
        dynamic_shapes={name: dynamic.get(name) for name in names},
        dynamo=True,
        external_data=False,
    )
    return path


def session(path: Path, threads: int | None = None):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    if threads is not None:
        options.intra_op_num_threads = threads
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def export_causal(model, folder: Path) -> Path:
    """The causal LM ``model`` as ``folder/model.onnx`` (batch and length dynamic)."""
    folder.mkdir(parents=True, exist_ok=True)
    example = (torch.randint(3, model.config.vocab_size, (2, 9)),)
    dims = {0: torch.export.Dim("batch", max=64), 1: torch.export.Dim("length", max=1024)}
    return export_onnx(CausalLogits(model), example, ["input_ids"], folder / "model.onnx", {"input_ids": dims})


def export_seq2seq(model, folder: Path) -> tuple[Path, Path]:
    """The encoder-decoder ``model`` as ``folder/encoder.onnx`` and ``folder/decoder_step.onnx``."""
    folder.mkdir(parents=True, exist_ok=True)
    batch, source, target = torch.export.Dim("batch", max=64), torch.export.Dim("source", max=512), torch.export.Dim(
        "target", max=512
    )
    ids = torch.randint(4, model.config.vocab_size, (2, 9))
    mask = torch.ones_like(ids)
    encoder = export_onnx(
        EncoderStep(model), (ids, mask), ["input_ids", "attention_mask"], folder / "encoder.onnx",
        {"input_ids": {0: batch, 1: source}, "attention_mask": {0: batch, 1: source}},
    )  # fmt: skip
    with torch.no_grad():
        hidden = EncoderStep(model)(ids, mask)
    decoder_ids = torch.randint(4, model.config.vocab_size, (2, 5))
    decoder = export_onnx(
        DecoderStep(model), (decoder_ids, hidden, mask), ["decoder_input_ids", "encoder_hidden_states",
                                                          "attention_mask"], folder / "decoder_step.onnx",
        {"decoder_input_ids": {0: batch, 1: target}, "encoder_hidden_states": {0: batch, 1: source},
         "attention_mask": {0: batch, 1: source}},
    )  # fmt: skip
    return encoder, decoder


def greedy_causal_onnx(sess, input_ids: np.ndarray, new_tokens: int) -> np.ndarray:
    """Greedy continuation by ONNX Runtime, re-running the prefix at every step (the graph has no cache)."""
    ids = input_ids
    for _ in range(new_tokens):
        logits = sess.run(None, {"input_ids": ids})[0]
        ids = np.concatenate([ids, logits[:, -1:].argmax(-1)], axis=1)
    return ids


@torch.no_grad()
def greedy_causal_eager(model, input_ids: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """The same decoding loop in PyTorch eager (no cache, as the ONNX graph), for a like-for-like speed ratio."""
    ids = input_ids
    for _ in range(new_tokens):
        logits = model(input_ids=ids, use_cache=False).logits
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids


def greedy_seq2seq_onnx(encoder, decoder, input_ids: np.ndarray, start: int, new_tokens: int) -> np.ndarray:
    mask = np.ones_like(input_ids)
    hidden = encoder.run(None, {"input_ids": input_ids, "attention_mask": mask})[0]
    ids = np.full((input_ids.shape[0], 1), start, dtype=np.int64)
    for _ in range(new_tokens):
        feeds = {"decoder_input_ids": ids, "encoder_hidden_states": hidden, "attention_mask": mask}
        logits = decoder.run(None, feeds)[0]
        ids = np.concatenate([ids, logits[:, -1:].argmax(-1)], axis=1)
    return ids


@torch.no_grad()
def greedy_seq2seq_eager(model, input_ids: torch.Tensor, start: int, new_tokens: int) -> torch.Tensor:
    mask = torch.ones_like(input_ids)
    hidden = model.get_encoder()(input_ids=input_ids, attention_mask=mask).last_hidden_state
    ids = torch.full((input_ids.shape[0], 1), start, dtype=torch.long)
    for _ in range(new_tokens):
        logits = model(encoder_outputs=(hidden,), attention_mask=mask, decoder_input_ids=ids, use_cache=False).logits
        ids = torch.cat([ids, logits[:, -1:].argmax(-1)], dim=1)
    return ids
