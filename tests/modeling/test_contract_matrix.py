"""The head's contract, as one matrix (issue 50): every head mode x learned terms (none; each logit-scale kind; the
logit bias; a learned scale and the bias) x every family and the wrapper x every loss path (plain; chunked; fused:
torch's ``F.linear_cross_entropy`` on the folded weight where this torch has it) gives the scores, the loss and the
gradient of every parameter of an independent fp64 reference. The reference is written from the formulas:
s = (f(W) h)·g + b (``testing_utils.reference_scores`` for f, no code shared with the head), cross-entropy over the
scored tokens (the causal label shift included) divided by ``num_items_in_batch``, backpropagated through the model's
own body from the hidden states its head receives.

The checks of one loss path against another at the head alone (label smoothing, chunk sizes, bf16, host syncs, the
fold's own gradient) stay in test_fused_loss.py and test_chunked_loss.py; the head's properties in test_head.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from testing_utils import FAMILIES, model_inputs, reference_scores, tiny_model
from tiny_architectures import inputs_for, source_model

import hf_tiednorm
from hf_tiednorm import HEAD_MODES
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.loss import policy
from hf_tiednorm.modeling.loss.policy import torch_linear_cross_entropy_available

FIXED_SCALE = 3.0
# The learned terms of the head: config fields of each column of the matrix.
TERMS = {
    "none": {},
    "fixed": {"logit_scale_kind": "fixed", "logit_scale_init": FIXED_SCALE},
    "scalar": {"logit_scale_kind": "scalar"},
    "vector": {"logit_scale_kind": "vector"},
    "bias": {"logit_bias": True},
    "vector+bias": {"logit_scale_kind": "vector", "logit_bias": True},
}
WRAPPER = "wrapper"  # normalize_tied_head(..., generic=True) around transformers' Llama
MODELS = (*FAMILIES, WRAPPER)
# "torch": loss_implementation "fused" on torch's kernel, which the CPU would not pick (the chunked loop is faster
# there): the kernel's choice is pinned to it, and the test sees F.linear_cross_entropy run.
PATHS = ("plain", "chunked", "torch") if torch_linear_cross_entropy_available() else ("plain", "chunked")
NUM_ITEMS = 9  # num_items_in_batch, as the Trainer passes it (not the count of scored tokens below)
# Small enough that the 14 tokens outnumber the hidden size: the head folds g into W's rows (its branch for a training
# batch); the wrapper's Llama (hidden size 32) takes the other branch (few tokens: g scales the logits).
SIZES = {"d_model": 8, "encoder_ffn_dim": 16, "decoder_ffn_dim": 16, "encoder_attention_heads": 2,
         "decoder_attention_heads": 2, "encoder_layers": 1, "decoder_layers": 1}
CAUSAL_SIZES = {"hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one CPU thread is faster than several (and than their waiting on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def contract_model(name: str, head_mode: str, terms: dict) -> torch.nn.Module:
    """A tiny fp64 model in training mode with random learned terms (so that their gradients are not trivial)."""
    if name == WRAPPER:
        model = normalize_tied_head(source_model("llama"), head_mode, generic=True, **terms)
    else:
        sizes = SIZES if hf_tiednorm.FAMILIES[name].is_encoder_decoder else CAUSAL_SIZES
        model = tiny_model(name, head_mode=head_mode, **sizes, **terms)
    model = model.double().train()
    head = model.get_output_embeddings()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if head.logit_scale is not None:
            head.logit_scale.copy_(torch.rand(head.logit_scale.shape, generator=generator, dtype=torch.float64) + 0.5)
        if head.logit_bias is not None:
            head.logit_bias.copy_(torch.randn(head.logit_bias.shape, generator=generator, dtype=torch.float64) * 0.3)
    return model


def reference_logits(head, hidden: torch.Tensor, head_mode: str, terms: dict) -> torch.Tensor:
    """s = (f(W) h)·g + b from the formulas, in fp64."""
    scores = reference_scores(head.weight, hidden, head_mode)
    if terms.get("logit_scale_kind") == "fixed":
        scores = scores * FIXED_SCALE
    elif terms.get("logit_scale_kind") in ("scalar", "vector"):
        scores = scores * head.logit_scale.double()
    return scores + head.logit_bias.double() if terms.get("logit_bias") else scores


def parameter_grads(model, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("terms", TERMS)
@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize("name", MODELS)
def test_every_loss_path_gives_the_reference_scores_loss_and_gradients(name, head_mode, terms, monkeypatch):
    terms = TERMS[terms]
    kernel_calls = []
    if "torch" in PATHS:
        monkeypatch.setattr(policy, "fused_kernel", lambda *args: "torch")
        torch_kernel = F.linear_cross_entropy
        monkeypatch.setattr(F, "linear_cross_entropy", lambda *a, **k: kernel_calls.append(1) or torch_kernel(*a, **k))
    model = contract_model(name, head_mode, terms)
    head = model.get_output_embeddings()
    inputs = inputs_for(model) if name == WRAPPER else model_inputs(model)
    labels = inputs.get("decoder_input_ids", inputs["input_ids"]).clone()
    labels[0, :2] = -100  # padding: not scored

    # The reference: the hidden states the head receives, scored and backpropagated by the formulas.
    seen = []
    hook = head.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    try:
        logits = model(**inputs).logits
    finally:
        hook.remove()
    expected_logits = reference_logits(head, seen[0], head_mode, terms)
    # The head computes its column terms (1/‖w‖, 1/‖w‖², g, b) and their gradients in fp32 by design, so the fp64
    # model meets the fp64 reference to fp32's precision (times the conditioning of square's 1/‖w‖² at d = 8, up to
    # ~1e-5 of a gradient's largest entry); the loss paths, which share those terms, meet each other to fp64's.
    reference_tolerance = {"rtol": 1e-4, "atol": 1e-4}
    torch.testing.assert_close(logits, expected_logits, **reference_tolerance, msg=lambda text: f"scores: {text}")
    scored, targets = (expected_logits, labels) if model.config.is_encoder_decoder else (
        expected_logits[:, :-1], labels[:, 1:])  # a causal LM predicts the next token
    expected_loss = F.cross_entropy(scored.reshape(-1, scored.shape[-1]), targets.reshape(-1), reduction="sum")
    expected_loss = expected_loss / NUM_ITEMS
    expected_grads = parameter_grads(model, expected_loss)
    results = {}
    for path in PATHS:
        model.config.loss_implementation = "fused" if path == "torch" else path
        out = model(**inputs, labels=labels, num_items_in_batch=torch.tensor(NUM_ITEMS))
        assert (out.logits is None) == (path != "plain"), f"{path}: a fused path returns no logits in training"
        results[path] = out.loss.detach().double(), parameter_grads(model, out.loss)
    assert bool(kernel_calls) == ("torch" in PATHS), "the torch path ran torch's F.linear_cross_entropy"
    model.eval()  # evaluation: logits again, whatever computes the training loss
    with torch.no_grad():
        assert model(**inputs, labels=labels).logits is not None

    plain_loss, plain_grads = results["plain"]
    for path, (loss, grads) in results.items():
        assert grads.keys() == expected_grads.keys(), path
        # transformers' loss of the wrapper's plain path scores the fp64 logits in fp32 (logits.float()).
        tight = {"rtol": 1e-5, "atol": 1e-6} if name == WRAPPER else {"rtol": 1e-9, "atol": 1e-12}
        for what, expected, tolerance in (("reference", (expected_loss, expected_grads), reference_tolerance),
                                          ("plain path", (plain_loss, plain_grads), tight)):
            torch.testing.assert_close(loss, expected[0], **tolerance,
                                       msg=lambda text, p=path, w=what: f"{p} vs {w}: loss: {text}")
            for key, value in expected[1].items():
                atol = tolerance["atol"] * max(1.0, value.abs().max().item())  # relative to the gradient's size
                torch.testing.assert_close(grads[key], value, rtol=tolerance["rtol"], atol=atol,
                                           msg=lambda text, p=path, w=what, k=key: f"{p} vs {w}: ∇{k}: {text}")
