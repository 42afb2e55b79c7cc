"""The fused training loss of the normalized head (issue 39): the scale folded into W (folded_weight.py, whose own
checks are tests/modeling/head/test_folded_head.py), the paths
of fused_loss.py (torch's F.linear_cross_entropy, the chunked loop; liger-kernel on CUDA) against the plain path, in
fp64 for W, g, b and h across every mode, option and label smoothing; the chunked loop's device, dtype and host
synchronization; the models' forwards (no logits from a fused path, skip_logits)."""

from __future__ import annotations

import os

import pytest
import torch
from testing_utils import (
    FAMILIES,
    HEAD_VARIANTS,
    assert_same_loss_and_grads,
    head_loss_and_grads,
    model_inputs,
    tiny_model,
    variant_head,
)
from torch.utils._python_dispatch import TorchDispatchMode

from hf_tiednorm.modeling.loss import head_loss, policy
from hf_tiednorm.modeling.loss.chunked import chunked_linear_cross_entropy
from hf_tiednorm.modeling.loss.head_loss import head_linear_cross_entropy
from hf_tiednorm.modeling.loss.policy import (
    AUTO_MIN_LOGITS,
    choose_loss_path,
    torch_linear_cross_entropy_available,
)
from hf_tiednorm.modeling.loss.token import token_cross_entropy


def _labels(n=29, vocab=37, seed=1):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(1, vocab, (n,), generator=generator)
    labels[::5] = -100  # padding
    return labels


def _hidden(n=29, dim=8, dtype=torch.float64, seed=2):
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed)).to(dtype)


def _plain(smoothing):
    return lambda head, h, y: token_cross_entropy(head(h), y, smoothing)


def _fused(path, smoothing, chunk=None):
    def loss(head, h, y):
        return head_linear_cross_entropy(head, h, y, path, smoothing, chunk) / (y != -100).sum()

    return loss


@pytest.mark.parametrize("head_mode", ["cosine", "square", "l2", "distance"])
def test_the_plain_path_of_a_bf16_normalized_head_keeps_no_fp32_copy_of_w(head_mode):
    # The fold used to be (W.float() * scale).to(bf16): autograd saved the (V, d) fp32 copy for the backward.
    head = variant_head(head_mode, "vector", True, vocab=64, dim=8, dtype=torch.bfloat16)
    hidden = _hidden(n=80, dtype=torch.bfloat16)  # tokens > d: the scale is folded into the rows
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        head(hidden).sum().backward()
    copies = [t for t in saved if t.dtype == torch.float32 and tuple(t.shape) == (64, 8)]
    assert not copies, "an fp32 copy of W was saved for the backward"


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize(("head_mode", "logit_scale", "logit_bias"), HEAD_VARIANTS)
def test_the_chunked_path_equals_the_plain_one_in_fp64(head_mode, logit_scale, logit_bias, smoothing):
    head = variant_head(head_mode, logit_scale, logit_bias)
    hidden, labels = _hidden(), _labels()
    expected = head_loss_and_grads(head, hidden, labels, _plain(smoothing))
    for chunk in (4, 29, None):  # a last chunk shorter than the others, one chunk, the default size
        got = head_loss_and_grads(head, hidden, labels, _fused("chunked", smoothing, chunk))
        assert_same_loss_and_grads(got, expected)


@pytest.mark.skipif(not torch_linear_cross_entropy_available(), reason="torch < 2.13 has no F.linear_cross_entropy")
@pytest.mark.parametrize(("head_mode", "logit_scale", "logit_bias"), HEAD_VARIANTS)
def test_torch_linear_cross_entropy_on_the_folded_weight_equals_the_plain_path_in_fp64(
    head_mode, logit_scale, logit_bias
):
    head = variant_head(head_mode, logit_scale, logit_bias)
    hidden, labels = _hidden(), _labels()
    expected = head_loss_and_grads(head, hidden, labels, _plain(0.0))
    assert_same_loss_and_grads(head_loss_and_grads(head, hidden, labels, _fused("torch", 0.0)), expected)
    with pytest.raises(ValueError, match="without label smoothing"):
        _fused("torch", 0.1)(head, hidden, labels)


def test_liger_with_a_frozen_body_still_trains_the_head(monkeypatch):
    """Issue 48 (13): liger-kernel computes the weight and bias gradients only when the hidden states require grad
    (0.8.5, measured on a CPU under Triton's interpreter), so head-only training with a frozen body got ∇W = ∇g = 0
    and ∇b = None. liger does not run on this CPU: the stand-in below behaves as it does; the head's gradients must
    be the plain path's, and with a trained body liger itself still serves the loss."""
    calls = []

    def liger_like(hidden, weight, bias, labels, smoothing, ignore_index):
        calls.append(hidden.requires_grad)
        if not hidden.requires_grad:  # what liger-kernel 0.8.5 does: no weight or bias gradient
            weight, bias = weight.detach(), None if bias is None else bias.detach()
        return chunked_linear_cross_entropy(hidden, weight, bias, labels, None, smoothing, ignore_index)

    monkeypatch.setattr(head_loss, "_liger_loss", liger_like)
    head = variant_head("cosine", "vector", True)
    hidden, labels = _hidden(), _labels()
    expected = head_loss_and_grads(head, hidden, labels, _plain(0.1))
    head.zero_grad(set_to_none=True)
    _fused("liger", 0.1)(head, hidden, labels).backward()  # a frozen body: h needs no gradient
    got = {"W": head.weight.grad, "g": head.logit_scale.grad, "b": head.logit_bias.grad}
    assert_same_loss_and_grads(got, {name: expected[name] for name in got})
    assert calls == []  # the chunked loop served it
    trained_body = head_loss_and_grads(head, hidden, labels, _fused("liger", 0.1))
    assert calls == [True]
    assert_same_loss_and_grads(trained_body, expected)


@pytest.mark.slow  # liger-kernel under Triton's interpreter on a CPU (TRITON_INTERPRET=1), or on CUDA
@pytest.mark.skipif(not policy.liger_installed() or not (torch.cuda.is_available()
                                                           or os.environ.get("TRITON_INTERPRET") == "1"),
                    reason="needs liger-kernel, and CUDA or TRITON_INTERPRET=1")
def test_real_liger_with_a_frozen_body_trains_the_head():
    """Issue 48 (13) with liger-kernel itself: called directly with hidden states that need no gradient it gives the
    head ∇W = ∇g = 0 and ∇b = None (0.8.5); the liger path of head_linear_cross_entropy gives the plain gradients."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    head = variant_head("cosine", "vector", True, dtype=torch.float32).to(device)
    hidden, labels = _hidden(dtype=torch.float32).to(device), _labels().to(device)
    expected = head_loss_and_grads(head, hidden, labels, _fused("chunked", 0.1))
    head.zero_grad(set_to_none=True)
    _fused("liger", 0.1)(head, hidden, labels).backward()
    got = {"W": head.weight.grad, "g": head.logit_scale.grad, "b": head.logit_bias.grad}
    assert_same_loss_and_grads(got, {name: expected[name] for name in got}, rtol=1e-4, atol=1e-5)


def test_auto_picks_the_plain_path_for_small_logits_and_a_fused_one_for_large():
    head = variant_head("cosine", "none", False, vocab=1000, dim=8, dtype=torch.float32)
    assert choose_loss_path("auto", head, 16) == "plain"
    assert choose_loss_path("auto", head, AUTO_MIN_LOGITS // 1000 + 1) == "chunked"  # the CPU's fused path
    assert choose_loss_path("auto", head, 16, chunk_size=8) == "chunked"  # loss_chunk_size picks the loop
    assert choose_loss_path("fused", head, 16) == "chunked"
    assert choose_loss_path("plain", head, 10**9) == "plain"
    with pytest.raises(ValueError, match="loss_implementation must be one of"):
        choose_loss_path("liger", head, 16)
    multi30k = variant_head("cosine", "none", False, vocab=8000, dim=256, dtype=torch.float32)
    assert choose_loss_path("auto", multi30k, 64 * 40) == "plain"  # its longest batches keep one path
    llm = variant_head("cosine", "none", False, vocab=49152, dim=8, dtype=torch.float32)  # SmolLM2's vocabulary
    assert choose_loss_path("auto", llm, 2048) == "chunked"


def test_the_chunked_loop_runs_its_matmuls_in_bf16_and_accumulates_in_fp32():
    head = variant_head("cosine", "vector", True, vocab=64, dim=16, dtype=torch.bfloat16)
    hidden, labels = _hidden(n=50, dim=16, dtype=torch.bfloat16), _labels(n=50, vocab=64)
    seen = []

    class Matmuls(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func in (torch.ops.aten.mm.default, torch.ops.aten.mm.out, torch.ops.aten.addmm.out):
                seen.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
            return func(*args, **(kwargs or {}))

    with Matmuls():
        got = head_loss_and_grads(head, hidden, labels, _fused("chunked", 0.1, 8))
    assert seen and all(set(dtypes) == {torch.bfloat16} for dtypes in seen)
    reference = variant_head("cosine", "vector", True, vocab=64, dim=16, dtype=torch.float64)
    with torch.no_grad():
        reference.weight.copy_(head.weight)
        reference.logit_scale.copy_(head.logit_scale)
        reference.logit_bias.copy_(head.logit_bias)
    expected = head_loss_and_grads(reference, hidden.double(), labels, _plain(0.1))
    torch.testing.assert_close(got["loss"].double(), expected["loss"], rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got["W"].double(), expected["W"], rtol=5e-2, atol=5e-3)


class _Syncs(TorchDispatchMode):
    """Counts the ops that read a tensor's value on the host (item / bool / nonzero)."""

    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.nonzero.default):
            self.ops.append(func)
        return func(*args, **(kwargs or {}))


def test_the_chunked_loop_reads_nothing_on_the_host_but_the_cpu_label_check():
    head = variant_head("cosine", "vector", True)
    hidden, labels = _hidden(), _labels()
    with _Syncs() as syncs:
        head_loss_and_grads(head, hidden, labels, _fused("chunked", 0.1, 4))
    # Old code: nonzero() to drop ignored tokens and an .any() in an if, whatever the device. Now one read: the
    # CPU's by-name label check (off the CPU it is torch._assert_async).
    assert syncs.ops == [torch.ops.aten._local_scalar_dense.default]


def test_the_chunked_loop_builds_every_tensor_on_its_inputs_device():
    # A device-less factory (the old torch.full((n, 1), ...)) would build a meta tensor here and fail to mix.
    head = variant_head("distance", "scalar", True)
    hidden, labels = _hidden(), _labels()
    with torch.device("meta"):
        got = head_loss_and_grads(head, hidden, labels, _fused("chunked", 0.1, 4))
    assert got["W"].device.type == "cpu"


def test_out_of_vocabulary_labels_are_named():
    head = variant_head("cosine", "none", False)
    labels = _labels()
    labels[3] = 37
    with pytest.raises(IndexError, match="label 37"):
        head_linear_cross_entropy(head, _hidden(), labels, "chunked")


def test_no_tokens_with_a_target_give_zero_loss_and_zero_gradients():
    head = variant_head("cosine", "vector", True)
    labels = torch.full((29,), -100)
    got = head_loss_and_grads(head, _hidden(), labels, lambda hd, h, y: head_linear_cross_entropy(hd, h, y, "chunked"))
    assert got["loss"] == 0 and not got["W"].any() and not got["h"].any()
    assert chunked_linear_cross_entropy(_hidden(), torch.randn(37, 8, dtype=torch.float64), None, labels) == 0


def _family_model(family, **config):
    return tiny_model(family, logit_scale_kind="vector", logit_bias=True, **config).double()


def _loss_and_grads(model, inputs, **kwargs):
    model.zero_grad(set_to_none=True)
    out = model(**inputs, **kwargs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("implementation", ["fused", "chunked"])
def test_every_family_trains_with_the_fused_loss_exactly_and_returns_no_logits(family, implementation):
    plain = _family_model(family, label_smoothing=0.1, loss_implementation="plain").train()
    fused = _family_model(family, label_smoothing=0.1, loss_implementation=implementation).train()
    fused.load_state_dict(plain.state_dict())
    inputs = model_inputs(plain)
    inputs["labels"] = inputs.get("decoder_input_ids", inputs["input_ids"]).clone()
    inputs["labels"][:, :2] = -100
    torch.manual_seed(0)
    expected, expected_grads = _loss_and_grads(plain, inputs)
    torch.manual_seed(0)
    got, grads = _loss_and_grads(fused, inputs)
    assert got.logits is None and expected.logits is not None
    torch.testing.assert_close(got.loss, expected.loss, rtol=1e-10, atol=1e-12)
    assert grads.keys() == expected_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], expected_grads[name], rtol=1e-8, atol=1e-10, msg=name)
    fused.eval()  # evaluation: logits, unless the Trainer asks to skip them (use_liger_kernel, prediction_loss_only)
    with torch.no_grad():
        assert fused(**inputs).logits is not None
        skipped = fused(**inputs, skip_logits=True)
    assert skipped.logits is None
    torch.testing.assert_close(skipped.loss, expected.loss, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_trainers_label_smoother_with_a_named_fused_loss_is_refused_by_name(family):
    model = _family_model(family, loss_implementation="fused").train()
    inputs = model_inputs(model)  # no labels: the Trainer's label smoother scores the logits itself
    with pytest.raises(ValueError, match="label_smoothing_factor"):
        model(**inputs, num_items_in_batch=torch.tensor(5))
    model.config.loss_implementation = "auto"  # auto lets the Trainer score the logits
    assert model(**inputs, num_items_in_batch=torch.tensor(5)).logits is not None


def test_the_adaptive_softmax_refuses_a_named_fused_loss():
    with pytest.raises(Exception, match="loss_implementation='fused'"):
        tiny_model("causal", adaptive_cutoffs=[20], loss_implementation="fused")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (docs/benchmarks.md: to be measured)")
@pytest.mark.parametrize(("head_mode", "logit_scale", "logit_bias"), HEAD_VARIANTS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_fused_path_on_cuda_equals_the_plain_path(head_mode, logit_scale, logit_bias, smoothing):
    # Whatever "fused" picks there (liger-kernel where installed, else torch's op or the chunked loop), in fp32.
    head = variant_head(head_mode, logit_scale, logit_bias, vocab=1000, dim=64, dtype=torch.float32).cuda()
    hidden, labels = _hidden(n=300, dim=64, dtype=torch.float32).cuda(), _labels(n=300, vocab=1000).cuda()
    path = choose_loss_path("fused", head, labels.numel(), smoothing)
    expected = head_loss_and_grads(head, hidden, labels, _plain(smoothing))
    got = head_loss_and_grads(head, hidden, labels, _fused(path, smoothing))
    assert_same_loss_and_grads(got, expected, rtol=1e-4, atol=1e-5)


# slow: a subprocess importing torch and transformers (≈ 10 s idle, over a minute on the busy 2-core CPU)
@pytest.mark.slow
def test_the_lm_head_loss_benchmark_runs_and_reports_the_ratios(tmp_path):
    import json
    import os
    import subprocess
    import sys

    from testing_utils import REPO_ROOT

    output = tmp_path / "bench.json"
    subprocess.run(
        # Large enough (8 MiB of fp32 logits) for the CPU peaks to be read above the allocator's noise.
        [sys.executable, "experiments/benchmark_lm_head_loss.py", "--vocab", "4096", "--dim", "16", "--tokens", "512",
         "--head_modes", "cosine", "--paths", "plain,fused,chunked", "--reps", "1", "--output", str(output)],
        cwd=REPO_ROOT, check=True, capture_output=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},  # the benchmark sets glibc's mmap threshold itself
    )  # fmt: skip
    report = json.loads(output.read_text())
    table = report["results"]["float32:N=512"]
    assert set(table) == {"plain", "cosine:plain", "cosine:fused", "cosine:chunked"}
    assert table["cosine:fused"]["kernel"] == "chunked"  # the CPU's fused path
    assert table["plain"]["time_ratio"]["median"] == 1.0 and table["plain"]["peak_mib"]["median"] > 4
    assert 0 < table["cosine:fused"]["memory_ratio"]["median"] < 1
    assert abs(table["cosine:fused"]["loss"] - table["cosine:plain"]["loss"]) < 1e-4


class _BlockOps(TorchDispatchMode):
    """Names every op but views given a (chunk × V) block of logits (or its transpose) as an argument or ``out``."""

    def __init__(self, shape):
        super().__init__()
        self.shapes, self.ops = {tuple(shape), tuple(shape)[::-1]}, []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        tensors = [t for t in (*args, *(kwargs or {}).values()) if isinstance(t, torch.Tensor)]
        if not func.is_view and any(tuple(t.shape) in self.shapes for t in tensors):
            self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
def test_the_chunked_loop_passes_over_a_block_of_logits_once_per_step_of_the_math(bias):
    # One chunk of 16 tokens: its product (the bias added by the matmul), the label's logit, max, exp, sum, the
    # softmax division (which zeroes ignored tokens: it was followed by a masking pass), the label's -1, the two
    # gradient matmuls; a bias's gradient by one matrix-vector product (it was a column sum, a slow strided reduction).
    vocab, dim, tokens = 64, 8, 16
    hidden, labels = _hidden(n=tokens, dim=dim, dtype=torch.float32).requires_grad_(True), _labels(tokens, vocab)
    weight = torch.randn(vocab, dim, requires_grad=True)
    logit_bias = torch.randn(vocab, requires_grad=True) if bias else None
    with _BlockOps((tokens, vocab)) as seen:
        chunked_linear_cross_entropy(hidden, weight, logit_bias, labels, chunk_size=tokens).backward()
    expected = ["addmm" if bias else "mm", "gather", "amax", "sub_", "exp_", "sum", "div_", "scatter_add_"]
    assert seen.ops == expected + ["addmv_"] * bias + ["addmm_", "mm"], seen.ops
