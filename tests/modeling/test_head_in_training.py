"""The head where real training puts it, through every model family and mode: a zeroed padding row at step 0,
fp16/bf16 weights, batches without targets, weights written behind autograd's back, autocast and torch.compile."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
from testing_utils import FAMILIES, model_inputs, tiny_model

from hf_tiednorm import HEAD_MODES, TiedNormHead
from hf_tiednorm.modeling.head.settings import HeadSettings

NORMALIZED_MODES = ("l2", "square", "cosine")  # the modes that divide by a row norm


def batch(model, batch_size: int = 16, length: int = 34) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Inputs and labels of a training batch; 16 × 34 tokens cover every row of the tiny vocabulary."""
    inputs = model_inputs(model, batch_size=batch_size, length=length)
    labels = inputs.pop("decoder_input_ids", inputs["input_ids"]).clone()
    return inputs, labels


@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_padding_row_does_not_dominate_the_first_gradient(family, head_mode):
    """HF initialization zeroes the padding row. Before, its gradient in l2/square/cosine was h/eps:
    max/median row-gradient norm 5e4 (cosine) to 4e9 (causal square) at step 0."""
    model = tiny_model(family, head_mode=head_mode).train()
    pad = model.config.pad_token_id
    assert model.lm_head.weight[pad].abs().sum() == 0
    inputs, labels = batch(model)
    model(**inputs, labels=labels).loss.backward()
    row_grads = model.lm_head.weight.grad.norm(dim=-1)  # (V,)
    assert row_grads.max() < 50 * row_grads.median()
    if head_mode in NORMALIZED_MODES:
        assert row_grads[pad] == 0  # the padding row stays zero: it is never a target


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_low_precision_training_batch_and_beam_search(family, head_mode, dtype):
    """Before, 1/eps of the zero padding row overflowed fp16 when folded into W: loss nan, beam search stopped."""
    model = tiny_model(family, head_mode=head_mode).to(dtype).train()
    inputs, labels = batch(model, batch_size=8, length=40)  # 8 × 38+ tokens > d = 32: the row-scaled branch
    loss = model(**inputs, labels=labels).loss
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    prompts = model_inputs(model, batch_size=16, length=6)["input_ids"]
    out = model.generate(  # 16 × 4 beams = 64 rows > d = 32
        prompts, num_beams=4, max_new_tokens=5, min_new_tokens=5, return_dict_in_generate=True, output_scores=True
    )
    assert torch.isfinite(out.sequences_scores).all()
    assert out.sequences.shape[1] == (1 if model.config.is_encoder_decoder else prompts.shape[1]) + 5


@pytest.mark.parametrize("chunk_size", [None, 3])
@pytest.mark.parametrize("num_items_in_batch", [None, 0])
@pytest.mark.parametrize("family", FAMILIES)
def test_batch_without_targets_has_zero_loss_and_zero_gradients(family, num_items_in_batch, chunk_size):
    """All labels -100 (masked prompts, truncation): before, loss nan — and nan gradients with the chunked loss,
    which one AdamW step spread to every embedding weight."""
    model = tiny_model(family, head_mode="cosine", loss_chunk_size=chunk_size).train()
    inputs, labels = batch(model, batch_size=2, length=7)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    out = model(**inputs, labels=torch.full_like(labels, -100), num_items_in_batch=num_items_in_batch)
    assert out.loss == 0
    out.loss.backward()
    assert all(torch.equal(p.grad, torch.zeros_like(p)) for p in model.parameters() if p.grad is not None)
    torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0).step()
    assert all(torch.equal(p, before[name]) for name, p in model.named_parameters())


@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_logits_are_fp32_in_every_mode_under_autocast(head_mode):
    """Before, bf16 autocast gave bf16 logits for baseline and fp32 for the other modes."""
    model = tiny_model("causal", head_mode=head_mode)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for batch_size in (1, 16):  # decoding (logits scaled) and training-sized (rows scaled) branches
            assert model(**model_inputs(model, batch_size=batch_size)).logits.dtype == torch.float32


@pytest.mark.parametrize("family", FAMILIES)
def test_generate_computes_the_norms_once_and_drops_them_after(family):
    model = tiny_model(family, head_mode="cosine")
    prompts = model_inputs(model, batch_size=2, length=5)["input_ids"]
    compute = TiedNormHead._compute_column_terms
    with mock.patch.object(TiedNormHead, "_compute_column_terms", autospec=True, side_effect=compute) as spy:
        model.generate(prompts, max_new_tokens=4, min_new_tokens=4, num_beams=2)
    assert spy.call_count == 1
    with torch.no_grad():  # a write after generation is seen by the next forward
        model.lm_head.weight.data.mul_(torch.rand(model.config.vocab_size, 1) + 0.5)
        hidden = torch.randn(3, model.config.hidden_size)
        weight = model.lm_head.weight
        expected = hidden @ (weight / weight.norm(dim=-1, keepdim=True).clamp_min(1e-30)).T
        expected[:, weight.norm(dim=-1) == 0] = 0
        torch.testing.assert_close(model.lm_head(hidden), expected)


@pytest.mark.parametrize("head_mode", HEAD_MODES)
def test_head_compiles_without_graph_breaks(head_mode):
    """Before, the inference cache compared data pointers: ``Unsupported: Data pointer comparison``."""
    torch._dynamo.reset()  # each shape / scope variant recompiles; don't carry other tests' compilations
    head = TiedNormHead(16, 50, settings=HeadSettings(head_mode=head_mode, logit_scale_kind="scalar"))
    compiled = torch.compile(head, fullgraph=True, backend="eager")
    hidden = {"decoding": torch.randn(2, 16), "batch": torch.randn(40, 16)}
    with torch.no_grad():
        for h in hidden.values():
            torch.testing.assert_close(compiled(h), head(h))
        with head.frozen_column_terms():
            for h in hidden.values():
                torch.testing.assert_close(compiled(h), head(h))


# torch.compile of a whole model takes 5-7 s a family: the causal one by default, the others with -m slow.
@pytest.mark.parametrize("family", [f if f == "causal" else pytest.param(f, marks=pytest.mark.slow) for f in FAMILIES])
def test_compiled_forward_generates_like_eager(family):
    torch._dynamo.reset()
    model = tiny_model(family, head_mode="cosine")
    prompts = model_inputs(model, batch_size=2, length=5)["input_ids"]
    expected = model.generate(prompts, max_new_tokens=4, do_sample=False)
    model.forward = torch.compile(model.forward, fullgraph=True, backend="eager")
    assert torch.equal(model.generate(prompts, max_new_tokens=4, do_sample=False), expected)
