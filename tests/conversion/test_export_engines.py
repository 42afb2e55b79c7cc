"""A plain export served by engines nobody here wrote (issue 32): torch's own ONNX exporter and ONNX Runtime give the
normalized model's logits (within 1e-3) and its greedy continuation, for a causal LM (one graph) and an
encoder-decoder (encoder + decoder step). Tiny models here; SmolLM2-135M and a Multi30k-sized model in
experiments/engines/onnx_export.py (results/onnx_runtime.json)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from testing_utils import tiny_model

from hf_tiednorm.conversion.export import export_plain

pytest.importorskip("onnxruntime", reason="ONNX Runtime serves the export: pip install onnxruntime onnxscript")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript")
from hf_tiednorm.conversion.engines.onnx import (  # noqa: E402  (needs onnxruntime and onnxscript)
    export_causal,
    export_seq2seq,
    greedy_causal_eager,
    greedy_causal_onnx,
    greedy_seq2seq_eager,
    greedy_seq2seq_onnx,
    session,
)


@torch.no_grad()
def normalized(family: str):
    model = tiny_model(family, head_mode="cosine", logit_scale_kind="vector", logit_bias=family != "causal")
    head = model.get_output_embeddings()
    head.logit_scale.uniform_(5.0, 15.0)
    if head.logit_bias is not None:
        head.logit_bias.normal_()
    return model


def test_causal_export_runs_in_onnx_runtime_with_the_normalized_logits(tmp_path):
    model = normalized("causal")
    sess = session(export_causal(export_plain(model).model, tmp_path))
    ids = torch.randint(4, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        expected = model(input_ids=ids).logits.numpy()
    assert np.abs(sess.run(None, {"input_ids": ids.numpy()})[0] - expected).max() <= 1e-3
    np.testing.assert_array_equal(greedy_causal_onnx(sess, ids.numpy(), 5), greedy_causal_eager(model, ids, 5))


@pytest.mark.slow  # two dynamo exports: ~20 s of CPU on its own, a minute on a shared 2-core machine
def test_seq2seq_export_runs_in_onnx_runtime_as_encoder_and_decoder_step(tmp_path):
    model = normalized("seq2seq")
    encoder_path, decoder_path = export_seq2seq(export_plain(model).model, tmp_path)
    encoder, decoder = session(encoder_path), session(decoder_path)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (3, 9), generator=generator)
    decoder_ids = torch.randint(4, model.config.vocab_size, (3, 6), generator=generator)
    mask = np.ones(ids.shape, dtype=np.int64)
    with torch.no_grad():
        expected = model(input_ids=ids, decoder_input_ids=decoder_ids).logits.numpy()
    hidden = encoder.run(None, {"input_ids": ids.numpy(), "attention_mask": mask})[0]
    feeds = {"decoder_input_ids": decoder_ids.numpy(), "encoder_hidden_states": hidden, "attention_mask": mask}
    assert np.abs(decoder.run(None, feeds)[0] - expected).max() <= 1e-3
    start = model.config.decoder_start_token_id
    np.testing.assert_array_equal(
        greedy_seq2seq_onnx(encoder, decoder, ids.numpy(), start, 5), greedy_seq2seq_eager(model, ids, start, 5)
    )


@pytest.mark.slow  # one or two more dynamo exports (~10-20 s each); the exports' ONNX checks above are the way shown
@pytest.mark.parametrize("family", ["causal", "seq2seq"])
def test_a_normalized_folder_itself_runs_in_onnx_runtime_with_its_head(family, tmp_path):
    """Not only the plain export: torch's exporter traces the model loaded from a normalized folder (its own code,
    ``trust_remote_code=True``), head included, and ONNX Runtime gives that model's logits (docs/deploy.md's table)."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    normalized(family).save_pretrained(tmp_path / "folder")
    auto = AutoModelForSeq2SeqLM if family == "seq2seq" else AutoModelForCausalLM
    model = auto.from_pretrained(tmp_path / "folder", trust_remote_code=True).eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (3, 9), generator=generator)
    if family == "causal":
        sess = session(export_causal(model, tmp_path / "onnx"))
        got = sess.run(None, {"input_ids": ids.numpy()})[0]
        with torch.no_grad():
            expected = model(input_ids=ids).logits.numpy()
    else:
        encoder_path, decoder_path = export_seq2seq(model, tmp_path / "onnx")
        decoder_ids = torch.randint(4, model.config.vocab_size, (3, 6), generator=generator)
        mask = np.ones(ids.shape, dtype=np.int64)
        hidden = session(encoder_path).run(None, {"input_ids": ids.numpy(), "attention_mask": mask})[0]
        feeds = {"decoder_input_ids": decoder_ids.numpy(), "encoder_hidden_states": hidden, "attention_mask": mask}
        got = session(decoder_path).run(None, feeds)[0]
        with torch.no_grad():
            expected = model(input_ids=ids, decoder_input_ids=decoder_ids).logits.numpy()
    assert np.abs(got - expected).max() <= 1e-4
