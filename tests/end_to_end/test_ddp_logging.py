"""The loss terms logged under DDP (2 CPU processes, gloo) add up to the logged loss, as on one process.

With ``average_tokens_across_devices`` (the default) the model divides its cross-entropy by the token count of all
processes, and ``Trainer.compute_loss`` multiplies the loss by the number of processes so that DDP's gradient mean
comes out right; the logged ``loss`` carries that factor. The terms that ``LossTermsLoggingMixin`` logs next to it
(hf_tiednorm/training/trainers.py) must carry it too: without it ``cross_entropy`` was logged at 1/processes of
``loss`` (3.943 beside 7.886 on 2 processes)."""

from __future__ import annotations

import json

import pytest
from script_helpers import write_tiny_parallel
from test_multiprocess import launch_two_processes

TERMS = ("cross_entropy", "projection_penalty", "weight_norm_penalty")


def test_logged_loss_terms_add_up_to_the_loss_on_two_processes(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data, n_train=96, n_eval=4)
    output_dir = tmp_path / "clm"
    launch_two_processes("run_clm", [
        "--train_file", data / "train.en", "--validation_file", "", "--test_file", "", "--output_dir", output_dir,
        "--vocab_size", "120", "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
        "--num_attention_heads", "2", "--block_size", "16", "--do_train", "--max_steps", "3",
        "--per_device_train_batch_size", "4", "--save_strategy", "no", "--report_to", "none", "--num_threads", "1",
        "--dataloader_pin_memory", "false", "--bf16", "false", "--logging_steps", "1",
        "--projection_regularization", "0.15", "--weight_norm_regularization", "1e-3",
    ])
    logged = [entry for entry in json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
              if "loss" in entry]
    assert len(logged) == 3
    for entry in logged:
        # Before: the sum was half the loss (every term a 1/processes share of its value).
        assert sum(entry[name] for name in TERMS) == pytest.approx(entry["loss"], rel=1e-5), entry
