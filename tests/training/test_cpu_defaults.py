"""A CPU run's defaults are quiet and right: no pinned memory without an accelerator (torch warns on every CPU run
otherwise), and the scripts' normal status lines are INFO, not WARNING."""

from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import pytest
import torch
from testing_utils import tiny_model
from transformers import Trainer

from hf_tiednorm.training.callbacks import TiedWeightsCheck
from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments, TiedNormTrainingArguments

needs_cpu_only = pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the default without accelerator")


@needs_cpu_only
@pytest.mark.parametrize("arguments", [TiedNormTrainingArguments, TiedNormSeq2SeqTrainingArguments])
def test_no_pin_memory_on_cpu_unless_asked(arguments, tmp_path):
    assert arguments(output_dir=str(tmp_path)).dataloader_pin_memory is False
    assert arguments(output_dir=str(tmp_path), dataloader_pin_memory=True).dataloader_pin_memory is True


@needs_cpu_only
def test_cpu_training_dataloader_does_not_warn_about_pin_memory(tmp_path):
    args = TiedNormTrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=2, report_to="none")
    data = [{"input_ids": torch.arange(4, 12), "labels": torch.arange(4, 12)} for _ in range(4)]
    trainer = Trainer(model=tiny_model("causal"), args=args, train_dataset=data)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        next(iter(trainer.get_train_dataloader()))
    assert not [w for w in caught if "pin_memory" in str(w.message)]


def test_tie_check_and_step_count_are_info(caplog):
    model = tiny_model("causal")
    args = SimpleNamespace(process_index=0)
    callback = TiedWeightsCheck()
    with caplog.at_level(logging.INFO, logger="hf_tiednorm"):
        callback.on_train_begin(args, None, None, model=model)
        callback.on_train_end(args, SimpleNamespace(global_step=3), None)
    lines = {record.getMessage(): record.levelname for record in caplog.records}
    assert lines == {
        "rank 0: output layer tied to the decoder embedding after prepare: True": "INFO",
        "rank 0: trained 3 steps": "INFO",
    }
