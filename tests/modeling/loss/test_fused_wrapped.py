"""The wrapper's causal LMs with the fused loss, a patched forward refused at the first training step (issue 43.5),
and ``use_liger_kernel=True`` served or refused by name (issues 39, 43.5)."""

from __future__ import annotations

import functools
import sys
import types

import pytest
import torch
from testing_utils import tiny_model
from tiny_architectures import inputs_for, source_model
from transformers import LlamaForCausalLM, TrainingArguments

from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.loss import policy
from hf_tiednorm.training import liger
from hf_tiednorm.training.trainers import TiedNormTrainer


def _wrapped(name, implementation, dtype=torch.float64):
    model = normalize_tied_head(source_model(name), "cosine", logit_scale_kind="vector", logit_bias=True, generic=True)
    model.config.loss_implementation = implementation
    with torch.no_grad():
        model.get_output_embeddings().logit_bias.normal_(0, 0.3, generator=torch.Generator().manual_seed(0))
    return model.to(dtype).train()


def _train_step(model, inputs):
    model.zero_grad(set_to_none=True)
    torch.manual_seed(0)  # the same dropout masks (GPT-2 trains with dropout)
    out = model(**inputs)
    out.loss.backward()
    return out, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen3"])
def test_a_wrapped_causal_lm_trains_with_the_fused_loss_exactly(name):
    inputs = inputs_for(source_model(name))
    inputs["labels"] = inputs["input_ids"].clone()
    inputs["labels"][0, :3] = -100
    expected, expected_grads = _train_step(_wrapped(name, "plain"), {**inputs, "num_items_in_batch": torch.tensor(9)})
    got, grads = _train_step(_wrapped(name, "fused"), {**inputs, "num_items_in_batch": torch.tensor(9)})
    assert got.logits is None and expected.logits is not None
    # transformers' ForCausalLMLoss scores the fp64 logits in fp32 (logits.float()): fp32 tolerances.
    torch.testing.assert_close(got.loss, expected.loss.double(), rtol=1e-6, atol=1e-7)
    assert grads.keys() == expected_grads.keys()
    for key in grads:
        # An entry near zero of a gradient whose entries reach ~5 carries that gradient's fp32 rounding (eps x its
        # largest entry, ~6e-7 here): the absolute tolerance scales with it, not a fixed 1e-7.
        atol = torch.finfo(torch.float32).eps * expected_grads[key].abs().max().item()
        torch.testing.assert_close(grads[key], expected_grads[key], rtol=1e-5, atol=atol, msg=key)


def test_an_architecture_with_more_around_its_head_keeps_its_forward_or_refuses_a_named_fused_loss():
    inputs = inputs_for(source_model("gemma2"))  # final-logit soft-capping after the head
    inputs["labels"] = inputs["input_ids"]
    assert _wrapped("gemma2", "auto")(**inputs).logits is not None
    with pytest.raises(ValueError, match="'gemma2'.*loss_implementation='auto' or 'plain'"):
        _wrapped("gemma2", "fused")(**inputs)
    inputs = inputs_for(source_model("bart"))  # an encoder-decoder: the wrapped model's own loss only
    inputs["labels"] = inputs.pop("decoder_input_ids")
    assert _wrapped("bart", "auto")(**inputs).logits is not None
    with pytest.raises(ValueError, match="'bart' encoder-decoder's forward"):
        _wrapped("bart", "chunked")(**inputs)


def _liger_like_forward(self, input_ids=None, attention_mask=None, labels=None, **kwargs):
    """A stand-in of liger-kernel's lce_forward: the training loss from lm_head.weight directly."""
    hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    logits = hidden @ self.lm_head.weight.t()
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten())
    return types.SimpleNamespace(loss=loss, logits=None)


def test_a_class_level_patched_forward_is_refused_at_the_first_training_step(monkeypatch):
    model = _wrapped("llama", "auto", torch.float32)
    monkeypatch.setattr(LlamaForCausalLM, "forward", _liger_like_forward)  # as apply_liger_kernel_to_llama() does
    inputs = inputs_for(model)
    with pytest.raises(ValueError, match=r"LlamaForCausalLM's forward \(LlamaForCausalLM\.forward, test_fused_wrapped"
                                         r"\._liger_like_forward\) computed the training loss without calling its "
                                         r"output layer, the normalized head.*bypassing the head"):
        model(**inputs, labels=inputs["input_ids"])
    monkeypatch.undo()
    assert model(**inputs, labels=inputs["input_ids"]).loss is not None  # the class's own forward again


def test_a_patch_dressed_as_the_classs_own_forward_is_refused(monkeypatch):
    """Judged by what ran, not by who installed it: before, a patch that ``functools.wraps`` the class's forward (its
    ``__module__`` and ``__wrapped__`` then name transformers' own) passed, and trained without the head."""
    model = _wrapped("llama", "auto", torch.float32)
    patch = _liger_like_forward
    copied = types.FunctionType(patch.__code__, patch.__globals__, patch.__name__, patch.__defaults__)
    dressed = functools.wraps(LlamaForCausalLM.forward)(copied)  # (wraps sets its attributes on the function itself)
    monkeypatch.setattr(LlamaForCausalLM, "forward", dressed)
    inputs = inputs_for(model)
    with pytest.raises(ValueError, match=r"\(LlamaForCausalLM\.forward, test_fused_wrapped\._liger_like_forward, "
                                         r"wrapping "):
        model(**inputs, labels=inputs["input_ids"])


def test_an_instance_level_patched_forward_is_refused():
    model = _wrapped("llama", "auto", torch.float32)
    model.model.forward = types.MethodType(_liger_like_forward, model.model)
    inputs = inputs_for(model)
    with pytest.raises(ValueError, match=r"\(set on the instance, test_fused_wrapped\._liger_like_forward\) computed"):
        model(**inputs, labels=inputs["input_ids"])


def test_a_wrapper_that_calls_the_wrapped_models_forward_trains():
    """A forward set on the wrapped model that calls its architecture's forward (accelerate's hooks, a logging
    wrapper) trains through the head: before, every forward set on the instance was refused."""
    from accelerate.hooks import ModelHook, add_hook_to_module

    inputs = inputs_for(source_model("llama"))
    expected = _wrapped("llama", "plain", torch.float32)(**inputs, labels=inputs["input_ids"]).loss
    logged = _wrapped("llama", "plain", torch.float32)
    forward = logged.model.forward
    logged.model.forward = lambda *args, **kwargs: forward(*args, **kwargs)
    hooked = _wrapped("llama", "plain", torch.float32)
    add_hook_to_module(hooked.model, ModelHook())  # accelerate's functools.partial on the instance
    for model in (logged, hooked):
        assert "forward" in vars(model.model)
        torch.testing.assert_close(model(**inputs, labels=inputs["input_ids"]).loss, expected, rtol=0, atol=0)


def _args(tmp_path, **kwargs):
    return TrainingArguments(output_dir=str(tmp_path), use_liger_kernel=True, report_to=[], use_cpu=True, **kwargs)


def test_use_liger_kernel_without_liger_is_refused_when_the_trainer_is_built(tmp_path, monkeypatch):
    monkeypatch.setattr(policy, "liger_installed", lambda: False)
    monkeypatch.setattr(liger, "liger_installed", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # a CUDA machine without liger-kernel
    args = _args(tmp_path)
    args.use_cpu = False  # built with use_cpu=True: TrainingArguments checks the real device
    with pytest.raises(ImportError, match="liger-kernel is not installed"):
        TiedNormTrainer(model=tiny_model("causal"), args=args)
    with pytest.raises(ImportError, match="liger-kernel is not installed"):
        liger.check_liger_installed(args)  # the scripts' check, at argument parsing


@pytest.mark.parametrize("installed", [False, True])
def test_use_liger_kernel_on_a_cpu_says_liger_needs_cuda_and_recommends_no_install(tmp_path, monkeypatch, installed):
    # 7bdafef: without liger-kernel, "pip install -e '.[gpu]'" (which cannot run on a CPU); with it, the refusal came
    # only from the model check, and a plain Trainer trained with nothing applied (test below).
    monkeypatch.setattr(policy, "liger_installed", lambda: installed)
    monkeypatch.setattr(liger, "liger_installed", lambda: installed)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for check in (lambda: liger.check_liger_installed(_args(tmp_path)),
                  lambda: TiedNormTrainer(model=tiny_model("causal"), args=_args(tmp_path)),
                  lambda: liger.serve_liger_request(model=tiny_model("causal"))):  # fmt: skip
        with pytest.raises(ValueError, match="need CUDA") as refusal:
            check()
        assert "pip install" not in str(refusal.value) and "cannot help" in str(refusal.value)


def test_liger_installed_without_cuda_registers_the_types_so_a_plain_trainer_refuses(monkeypatch):
    # 7bdafef: register_with_liger entered nothing without CUDA, so transformers' Trainer(use_liger_kernel=True)
    # found no entry for the model type, logged at INFO level and trained with nothing applied.
    table = {}
    stand_in = types.ModuleType("liger_kernel.transformers.monkey_patch")
    stand_in.MODEL_TYPE_TO_APPLY_LIGER_FN = table
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers.monkey_patch", stand_in)
    monkeypatch.setattr(liger, "liger_installed", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    model = tiny_model("causal")
    assert liger.register_with_liger(model.config.model_type)
    with pytest.raises(ValueError, match="cannot run liger-kernel on this TiedNormForCausalLM: .*need CUDA"):
        table[model.config.model_type](model=model)  # what _apply_liger_kernel_to_instance calls at train()


def test_use_liger_kernel_names_why_it_cannot_run_or_takes_the_fused_path(tmp_path, monkeypatch):
    monkeypatch.setattr(policy, "liger_installed", lambda: True)
    monkeypatch.setattr(liger, "liger_installed", lambda: True)
    model, args = tiny_model("causal"), _args(tmp_path)  # args first: they read the real device
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="need CUDA"):
            liger.check_use_liger_kernel(model, args)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    liger.check_use_liger_kernel(model, args)
    assert model.config.loss_implementation == "fused"  # every training step: the fused kernel, as Liger's
    plain = tiny_model("causal", loss_implementation="plain")
    with pytest.raises(ValueError, match="loss_implementation='plain'"):
        liger.check_use_liger_kernel(plain, args)
    with pytest.raises(ValueError, match="adaptive softmax"):
        liger.check_use_liger_kernel(tiny_model("causal", adaptive_cutoffs=[20]), args)
    with pytest.raises(ValueError, match="'gemma2' model has no fused loss"):
        liger.check_use_liger_kernel(_wrapped("gemma2", "auto"), args)
    args.use_liger_kernel = False
    liger.check_use_liger_kernel(plain, args)  # not set: nothing to check


def test_liger_kernels_own_dispatch_reaches_the_fused_loss_with_a_plain_trainer(monkeypatch):
    # transformers' Trainer(use_liger_kernel=True) calls liger's _apply_liger_kernel_to_instance, which looks the
    # model type up in MODEL_TYPE_TO_APPLY_LIGER_FN; hf_tiednorm enters its types there (a stand-in table here).
    table = {"llama": object()}
    model = tiny_model("causal")
    assert liger.register_with_liger(model.config.model_type, table)  # as the package's import does for each row
    assert set(table) == {"llama", model.config.model_type}
    monkeypatch.setattr(liger, "liger_installed", lambda: True)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="cannot run liger-kernel on this TiedNormForCausalLM: .*need CUDA"):
            table[model.config.model_type](model=model)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    table[model.config.model_type](model=model, swiglu=True)
    assert model.config.loss_implementation == "fused"


def test_run_clm_refuses_use_liger_kernel_without_liger_before_any_work(tmp_path, monkeypatch):
    from script_helpers import run_script

    monkeypatch.setattr(liger, "liger_installed", lambda: False)
    output = tmp_path / "run"
    error, message = (ImportError, "liger-kernel is not installed") if torch.cuda.is_available() else (
        ValueError, "no CUDA device: liger-kernel's kernels need CUDA")  # fmt: skip
    with pytest.raises(error, match=f"--use_liger_kernel is set but .*{message}"):
        run_script("run_clm", ["--output_dir", output, "--do_train", "--use_liger_kernel", "true",
                               "--train_file", tmp_path / "missing.txt", "--report_to", "none"], monkeypatch)
    assert not (output / "run_record.json").exists()  # refused at argument parsing: nothing prepared, loaded or read
