"""What fine-tuning a real converted model through scripts/run_clm.py showed (issue 27), each with a tiny stand-in:
lines ended by the tokenizer's EOS whatever the tokenizer adds, an evaluation-only run that exits cleanly, the card of
a fine-tuned converted model (data set, base model, the schedule that ran, no bookkeeping keys), a tokenizer snippet
that does not prompt, and a loud warning for emulated bf16."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import pytest
from datasets import Dataset
from huggingface_hub import ModelCard
from script_helpers import run_script, write_tiny_parallel
from testing_utils import tiny_tokenizer
from tiny_architectures import source_model

import hf_tiednorm.training.precision as precision
from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.training.data import group_texts

LINES = ["a dog runs on the grass .", "a woman reads a book .", "two men play music in the street ."]


def tokenizer_without_eos_post_processor():
    """tiny_tokenizer() as most modern tokenizers are (SmolLM2's, Llama's): it adds no EOS to a line."""
    tokenizer = tiny_tokenizer()
    backend = copy.deepcopy(tokenizer.backend_tokenizer)
    backend.post_processor = None
    tokenizer._tokenizer = backend
    assert tokenizer(LINES[0]).input_ids[-1] != tokenizer.eos_token_id
    return tokenizer


@pytest.mark.parametrize("adds_eos", [False, True])
def test_every_line_ends_with_eos_whatever_the_tokenizer_adds(adds_eos):
    tokenizer = tiny_tokenizer() if adds_eos else tokenizer_without_eos_post_processor()
    lengths = [len(tokenizer(line).input_ids) + (0 if adds_eos else 1) for line in LINES]
    blocks = group_texts(Dataset.from_dict({"text": LINES * 4}), tokenizer, block_size=sum(lengths))
    eos = tokenizer.eos_token_id
    for block in blocks["input_ids"]:  # one block = the three lines, each ended by one EOS, never two in a row
        ends = [i for i, token in enumerate(block) if token == eos]
        assert ends == [sum(lengths[: k + 1]) - 1 for k in range(3)], (block, ends)


def test_a_tokenizer_without_eos_is_refused():
    tokenizer = tokenizer_without_eos_post_processor()
    tokenizer.eos_token = None
    with pytest.raises(ValueError, match="no eos_token: lines would be concatenated"):
        group_texts(Dataset.from_dict({"text": LINES}), tokenizer, block_size=4)


@pytest.fixture
def converted_llama(tmp_path):
    """A tiny Llama converted to cosine, its config carrying a GGUF source's "_model_name_or_path"; Multi30k-named
    text files in a folder named multi30k (as a copy of the data set would be)."""
    source = source_model("llama")
    source.config._model_name_or_path = "Smollm2 135M 8k Lc100K Mix1 Ep2"  # what a GGUF file's general.name gives
    source.save_pretrained(tmp_path / "source")
    tiny_tokenizer().save_pretrained(tmp_path / "source")
    convert_checkpoint(tmp_path / "source", tmp_path / "converted", head_mode="cosine")
    data = tmp_path / "multi30k"
    data.mkdir()
    write_tiny_parallel(data)
    for name in ("val", "test"):
        (data / f"{name}.en").rename(data / ("val.en" if name == "val" else "test_2016_flickr.en"))
    return tmp_path / "converted", data


def clm_flags(model, data, output_dir) -> list:
    return [
        "--model_name_or_path", model, "--output_dir", output_dir, "--train_file", data / "train.en",
        "--validation_file", data / "val.en", "--test_file", data / "test_2016_flickr.en", "--block_size", "16",
        "--per_device_train_batch_size", "4", "--report_to", "none", "--num_threads", "1", "--bf16", "false",
        "--dataloader_pin_memory", "false",
    ]  # fmt: skip


def test_evaluation_only_exits_cleanly_with_its_metrics(converted_llama, tmp_path, monkeypatch):
    model, data = converted_llama
    run_script("run_clm", [*clm_flags(model, data, tmp_path / "eval"), "--do_eval"], monkeypatch)  # raised before
    assert json.loads((tmp_path / "eval" / "eval_results.json").read_text())["eval_perplexity"] > 1
    assert (tmp_path / "eval" / "test_results.json").is_file()
    assert not (tmp_path / "eval" / "README.md").exists()  # no model saved there, so no card


def test_the_card_of_a_fine_tuned_conversion(converted_llama, tmp_path, monkeypatch):
    model, data = converted_llama
    flags = [*clm_flags(model, data, tmp_path / "out"), "--do_train", "--do_eval", "--max_steps", "3",
             "--max_eval_samples", "5"]
    run_script("run_clm", flags, monkeypatch)
    card = ModelCard.load(tmp_path / "out" / "README.md")
    # Issue 43: a subset's score says so, only metrics are metrics, and no license is claimed.
    assert "Scored on a subset only: the first 5 of 6 rows of the test split; the first 5 of 6 rows of the " \
        "validation split" in card.text
    assert {result.dataset_split for result in card.data.eval_results} == {"validation[:5]", "test[:5]"}
    assert "runtime" not in card.text and "_first_step" not in card.text and "per_second" not in card.text
    assert "| train_loss (mean of steps 1–3) |" in card.text
    assert card.data.license == "unknown"
    assert card.data.datasets == ["bentrevett/multi30k"]  # not "train.en"
    assert card.data.base_model is None  # a local folder is no Hub id (issue 34 §5): never published as a path
    assert "Fine-tuned from a local model" in card.text and str(model) not in card.text
    assert "| max_steps | 3 |" in card.text and "| steps trained | 3 |" in card.text
    assert "num_train_epochs" not in card.text  # 3.0 epochs were never run: max_steps bounded the run
    assert "_model_name_or_path" not in card.text
    assert "_model_name_or_path" not in (model / "config.json").read_text()  # the conversion drops it too


def test_the_cards_tokenizer_line_does_not_prompt(converted_llama, tmp_path, monkeypatch):
    model, data = converted_llama
    run_script("run_clm", [*clm_flags(model, data, tmp_path / "out"), "--do_train", "--max_steps", "1"], monkeypatch)
    card = (tmp_path / "out" / "README.md").read_text()
    line = next(line for line in card.splitlines() if line.startswith("tokenizer = AutoTokenizer.from_pretrained("))
    folder = str(tmp_path / "out")
    code = f"from transformers import AutoTokenizer\n{line.replace('out', folder, 1)}\nprint(len(tokenizer))"
    result = subprocess.run(
        [sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Do you wish to run the custom code" not in result.stdout + result.stderr


def test_emulated_bf16_warns_how_much_slower(tmp_path, monkeypatch):
    monkeypatch.setattr(precision, "cpu_bf16_flag", lambda *args: None)  # a CPU without avx512_bf16 / amx_bf16
    monkeypatch.setattr(precision.torch.accelerator, "is_available", lambda: False)
    with pytest.warns(UserWarning, match=r"24x slower per step than fp32 \(120.6 vs 4.9 s"):
        args = precision.TiedNormTrainingArguments(output_dir=str(tmp_path), bf16=True)
    assert args.bf16 and "24x slower" in args.precision_note
