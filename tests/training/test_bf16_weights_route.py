"""Issue 51, item 2: the training scripts take ``--dtype`` (transformers 5's name; ``--torch_dtype`` its alias, as in
HF's own run_clm.py), so the bf16-weights route of docs/training.md needs no hand-written Trainer script. bf16 weights
keep the head's learned logit scale in fp32; the run's model is saved in bf16 and its card names the dtype."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors import safe_open
from script_helpers import run_script, write_tiny_parallel
from testing_utils import tiny_model, tiny_tokenizer
from tiny_architectures import source_model

from hf_tiednorm.convert import convert_checkpoint

COMMON = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--do_train",
          "--do_eval", "--report_to", "none", "--num_threads", "1", "--dataloader_pin_memory", "false",
          "--bf16", "false", "--save_strategy", "no"]  # fmt: skip


def _saved_dtypes(folder) -> dict[str, torch.dtype]:
    with safe_open(folder / "model.safetensors", framework="pt") as weights:
        return {name: weights.get_slice(name).get_dtype() for name in weights.keys()}  # noqa: SIM118


def _trained_in(folder, expected: str) -> None:
    dtypes = _saved_dtypes(folder / "out")
    scale = next(name for name in dtypes if name.endswith("logit_scale"))
    assert dtypes[scale] == "F32"  # the head's learned terms stay fp32 under bf16 weights
    assert {dtype for name, dtype in dtypes.items() if name != scale} == {expected}
    card = ModelCard.load(folder / "out" / "README.md")
    assert "| dtype | bfloat16 |" in card.text


def test_run_clm_trains_bf16_weights_with_dtype(tmp_path, monkeypatch):
    source_model("qwen3").save_pretrained(tmp_path / "source")
    tiny_tokenizer().save_pretrained(tmp_path / "source")
    convert_checkpoint(tmp_path / "source", tmp_path / "converted", head_mode="cosine", lossless_start=True)
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data)
    run_script("run_clm", [  # 7bdafef: "error: unrecognized arguments: --dtype bfloat16"
        "--model_name_or_path", tmp_path / "converted", "--output_dir", tmp_path / "out", "--dtype", "bfloat16",
        "--train_file", data / "train.en", "--validation_file", data / "val.en", "--block_size", "16", *COMMON,
    ], monkeypatch)  # fmt: skip
    _trained_in(tmp_path, "BF16")


def test_run_translation_trains_bf16_weights_with_the_alias_torch_dtype(tmp_path, monkeypatch):
    model = tiny_model("seq2seq", logit_scale_kind="scalar")
    model.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    data = tmp_path / "data"
    data.mkdir()
    run_script("run_translation", [
        "--model_name_or_path", tmp_path / "model", "--output_dir", tmp_path / "out", "--torch_dtype", "bfloat16",
        *write_tiny_parallel(data), "--max_source_length", "32", "--max_target_length", "32", "--max_eval_samples",
        "3", *COMMON,
    ], monkeypatch)  # fmt: skip
    _trained_in(tmp_path, "BF16")
    # The scored subset is saved with the split's metrics, for every later card
    # (tests/publishing/test_card_keeps_the_run.py).
    saved = json.loads((tmp_path / "out" / "eval_results.json").read_text())
    assert (saved["eval_rows_scored"], saved["eval_rows_in_split"]) == (3, 6)


def test_dtype_for_a_new_model_is_refused_by_name(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data)
    with pytest.raises(ValueError, match="--dtype bfloat16 loads a saved model"):
        run_script("run_clm", ["--output_dir", tmp_path / "out", "--dtype", "bfloat16", "--train_file",
                               data / "train.en", *COMMON], monkeypatch)  # fmt: skip
    assert not (tmp_path / "out").exists()
