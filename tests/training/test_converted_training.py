"""Fine-tuning a converted checkpoint with the training scripts (--model_name_or_path), model card included.

A converted model (``tiednorm_wrapped``) keeps its architecture's config fields and module names: T5 has relative
positions (no ``max_position_embeddings``), GPT-2 calls its limit ``n_positions`` and its embedding ``wte``. Each run
trains, evaluates, saves the model and writes its card, so the tied normalized head must survive the whole script.
"""

from __future__ import annotations

import pytest
import torch
from huggingface_hub import ModelCard
from script_helpers import run_script, write_tiny_parallel
from testing_utils import tiny_tokenizer
from tiny_architectures import auto_class, source_model

from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.modeling.head.layer import TiedNormHead

COMMON = ["--max_steps", "2", "--per_device_train_batch_size", "4", "--learning_rate", "1e-2", "--do_train",
          "--do_eval", "--report_to", "none", "--num_threads", "1", "--dataloader_pin_memory", "false"]  # fmt: skip


def converted_checkpoint(name: str, folder) -> torch.Tensor:
    """Convert the tiny ``name`` source (with a tokenizer) in cosine mode into ``folder``; return its embedding."""
    source_model(name).save_pretrained(folder / "source")
    tiny_tokenizer().save_pretrained(folder / "source")
    model = convert_checkpoint(folder / "source", folder / "converted", head_mode="cosine", license="mit",
                               base_model="someone/tiny-base")
    return model.get_input_embeddings().weight.detach().clone()


def check_fine_tuned(output_dir, name: str, before: torch.Tensor) -> None:
    model = auto_class(source_model(name).config).from_pretrained(output_dir)
    head = model.get_output_embeddings()
    assert isinstance(head, TiedNormHead) and head.head_mode == "cosine"
    assert head.weight is model.get_input_embeddings().weight
    assert not torch.equal(head.weight, before)  # trained
    card = ModelCard.load(output_dir / "README.md")
    assert {"tiednorm", "cosine", name} <= set(card.data.tags)
    assert f"`{name}` model (transformers' own code)" in card.text
    # The conversion's recorded source reaches the fine-tune's card (issue 43): never a default license.
    assert (card.data.license, card.data.base_model) == ("mit", "someone/tiny-base")


def clm_args(folder, data, block_size: int = 16) -> list:
    return [
        "--model_name_or_path", folder / "converted", "--output_dir", folder / "out", "--train_file", data / "train.en",
        "--validation_file", data / "val.en", "--test_file", data / "test.en", "--block_size", str(block_size), *COMMON,
    ]  # fmt: skip


def translation_args(folder, data) -> list:
    return [
        "--model_name_or_path", folder / "converted", "--output_dir", folder / "out", *write_tiny_parallel(data),
        "--max_source_length", "32", "--max_target_length", "32", "--do_predict", "--predict_with_generate",
        "--generation_max_length", "8", *COMMON,
    ]  # fmt: skip


# qwen3: rotary positions; gpt2: learned positions (n_positions) and an embedding named wte.
@pytest.mark.parametrize("name", ["qwen3", "gpt2"])
def test_run_clm_fine_tunes_a_converted_checkpoint(name, tmp_path, monkeypatch):
    before = converted_checkpoint(name, tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data)
    run_script("run_clm", clm_args(tmp_path, data), monkeypatch)
    check_fine_tuned(tmp_path / "out", name, before)


def test_run_clm_fine_tunes_the_plain_baseline_beside_the_conversion(tmp_path, monkeypatch):
    """The plain baseline (``tiednorm-convert --plain``, a stock Llama) trains through the same script and saves;
    before, it could not be made, and a stock model's run failed at the end, writing hf_tiednorm's card."""
    from transformers import LlamaForCausalLM

    from hf_tiednorm.convert import main

    source_model("llama").save_pretrained(tmp_path / "source")
    tiny_tokenizer().save_pretrained(tmp_path / "source")
    main([str(tmp_path / "source"), str(tmp_path / "converted"), "--plain"])
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data)
    run_script("run_clm", clm_args(tmp_path, data), monkeypatch)
    trained = LlamaForCausalLM.from_pretrained(tmp_path / "out")
    before = LlamaForCausalLM.from_pretrained(tmp_path / "converted")
    assert not torch.equal(trained.get_input_embeddings().weight, before.get_input_embeddings().weight)
    assert (tmp_path / "out" / "all_results.json").is_file() and not (tmp_path / "out" / "README.md").exists()


# m2m_100: sinusoidal positions (max_position_embeddings); t5: relative positions, no such field.
@pytest.mark.parametrize("name", ["m2m_100", "t5"])
def test_run_translation_fine_tunes_a_converted_checkpoint(name, tmp_path, monkeypatch):
    before = converted_checkpoint(name, tmp_path)
    data = tmp_path / "data"
    data.mkdir()
    run_script("run_translation", translation_args(tmp_path, data), monkeypatch)
    check_fine_tuned(tmp_path / "out", name, before)


def test_position_limits_of_converted_checkpoints_are_their_architectures(tmp_path, monkeypatch):
    """GPT-2's n_positions=64 and M2M100's max_position_embeddings=64 bound the lengths, before any training."""
    converted_checkpoint("gpt2", tmp_path / "gpt2")
    data = tmp_path / "data"
    data.mkdir()
    write_tiny_parallel(data)
    with pytest.raises(ValueError, match="--block_size 65 exceeds the saved model's max_position_embeddings=64"):
        run_script("run_clm", clm_args(tmp_path / "gpt2", data, block_size=65), monkeypatch)
    converted_checkpoint("m2m_100", tmp_path / "m2m_100")
    args = translation_args(tmp_path / "m2m_100", data)
    args[args.index("--max_source_length") + 1] = "65"
    with pytest.raises(ValueError, match="--max_source_length 65 exceeds the model's max_position_embeddings=64"):
        run_script("run_translation", args, monkeypatch)
    assert not (tmp_path / "gpt2" / "out").exists() and not (tmp_path / "m2m_100" / "out" / "README.md").exists()
