"""End-to-end runs of scripts/run_translation.py and scripts/run_clm.py on a few hundred Multi30k sentences, the
resume test, the plot script, and the errors bad arguments give."""

from __future__ import annotations

import json
import logging
import math

import pytest
import sacrebleu
import torch
import yaml
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import load_file
from script_helpers import (
    TINY_TRANSLATION_FLAGS,
    load_script,
    read_lines,
    run_script,
)
from testing_utils import interrupted_run
from transformers import AutoTokenizer

import hf_tiednorm

N_TEST = 12


def translation_flags(multi30k, output_dir, *extra) -> list[str]:
    return [
        "--train_file", multi30k / "train.{lang}.gz", "--validation_file", multi30k / "val.{lang}.gz",
        "--test_file", multi30k / "test_2016_flickr.{lang}.gz", "--output_dir", output_dir,
        "--max_train_samples", "300", "--max_eval_samples", "10", "--max_predict_samples", str(N_TEST),
        *TINY_TRANSLATION_FLAGS, *extra,
    ]


@pytest.fixture(scope="module")
def trained_de_en(multi30k_dir, tmp_path_factory):
    """A from-scratch de→en run: 8 steps, beam 2, distance head, BLEU on validation and test."""
    output_dir = tmp_path_factory.mktemp("de_en")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", translation_flags(
            multi30k_dir, output_dir, "--head_mode", "distance", "--label_smoothing", "0.1",
            "--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--generation_num_beams", "2",
            "--length_penalty", "0.8", "--max_steps", "8", "--per_device_train_batch_size", "16",
            "--learning_rate", "3e-3", "--logging_steps", "1", "--save_steps", "4", "--seed", "3",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def test_translation_outputs_and_real_sacrebleu(trained_de_en, multi30k_dir):
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "all_results.json",
                 "test_predictions.txt", "token_counts.pt", "checkpoint-4", "checkpoint-8", "embedding_norms.png"):
        assert (trained_de_en / name).exists(), name
    assert "(embedding_norms.png)" in (trained_de_en / "README.md").read_text()  # the card shows the histogram
    results = json.loads((trained_de_en / "all_results.json").read_text())
    predictions = (trained_de_en / "test_predictions.txt").read_text().splitlines()
    references = read_lines(multi30k_dir / "test_2016_flickr.en.gz", N_TEST)
    assert len(predictions) == N_TEST and any(predictions)
    # The reported score is sacreBLEU of the written (detokenized) predictions against the raw references.
    expected = sacrebleu.corpus_bleu(predictions, [references])
    assert results["test_bleu"] == pytest.approx(expected.score, abs=1e-9)
    assert results["test_bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    # gen_len: the mean number of generated tokens, specials excluded (the written predictions, re-tokenized).
    tokenizer = AutoTokenizer.from_pretrained(trained_de_en)
    lengths = [len(tokenizer(text, add_special_tokens=False).input_ids) for text in predictions]
    assert results["test_gen_len"] == pytest.approx(sum(lengths) / len(lengths), abs=0.5)
    assert "eval_bleu" in results and math.isfinite(results["eval_loss"])
    config = hf_tiednorm.TiedNormSeq2SeqConfig.from_pretrained(trained_de_en)
    assert (config.head_mode, config.label_smoothing, config.vocab_size) == ("distance", 0.1, 300)
    state = json.loads((trained_de_en / "trainer_state.json").read_text())
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, 9))
    assert json.loads((trained_de_en / "generation_config.json").read_text())["length_penalty"] == 0.8


def test_tokenizer_saved_with_model(trained_de_en):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(trained_de_en)
    specials = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert specials == [0, 1, 2, 3]
    assert tokenizer("Ein Hund .")["input_ids"][-1] == 2
    counts = torch.load(trained_de_en / "token_counts.pt")
    assert counts.shape == (300,) and counts[2] == 2 * 300  # one </s> per source and per target sentence


def test_resume_reaches_same_final_loss(trained_de_en, multi30k_dir, tmp_path, monkeypatch):
    """Resume from the step-4 checkpoint of the 8-step run: same final loss and weights as uninterrupted."""
    resumed = interrupted_run(trained_de_en, "checkpoint-4", tmp_path / "resumed")
    run_script("run_translation", translation_flags(
        multi30k_dir, resumed, "--head_mode", "distance", "--label_smoothing", "0.1", "--do_train",
        "--max_steps", "8", "--per_device_train_batch_size", "16", "--learning_rate", "3e-3", "--logging_steps",
        "1", "--save_steps", "4", "--seed", "3", "--resume_from_checkpoint", "last",
    ), monkeypatch)
    history = [
        json.loads((folder / "trainer_state.json").read_text())["log_history"] for folder in (trained_de_en, resumed)
    ]
    losses = [{entry["step"]: entry["loss"] for entry in log if "loss" in entry} for log in history]
    assert sorted(losses[1]) == list(range(1, 9))  # steps 1-4 come from the checkpoint's state
    assert losses[1][8] == pytest.approx(losses[0][8], rel=1e-4)
    full, again = load_file(trained_de_en / "model.safetensors"), load_file(resumed / "model.safetensors")
    assert full.keys() == again.keys()
    for name in full:
        torch.testing.assert_close(again[name], full[name], rtol=1e-4, atol=1e-5, msg=name)


def test_finetune_en_de_from_yaml_config(trained_de_en, multi30k_dir, tmp_path, monkeypatch):
    """Fine-tune the saved de→en model in the other direction, arguments from a YAML file plus an override."""
    output_dir = tmp_path / "en_de"
    flags = translation_flags(multi30k_dir, output_dir, "--source_lang", "en", "--target_lang", "de")
    flags = [str(flag) for flag in flags]
    values = {}
    for index, item in enumerate(flags):  # flags → mapping, dropping the architecture flags of a new model
        if item.startswith("--") and item[2:] not in {"vocab_size", "d_model", "encoder_layers", "decoder_layers",
            "encoder_ffn_dim", "decoder_ffn_dim", "encoder_attention_heads", "decoder_attention_heads"}:
            values[item[2:]] = flags[index + 1]
    values.update(model_name_or_path=str(trained_de_en), do_train=True, do_predict=True, predict_with_generate=True,
                  max_steps=2, per_device_train_batch_size=8, save_strategy="no", label_smoothing=0.2)
    config_file = tmp_path / "en_de.yaml"
    config_file.write_text(yaml.safe_dump(values))
    run_script("run_translation", [config_file, "--max_predict_samples", "5"], monkeypatch)
    results = json.loads((output_dir / "all_results.json").read_text())
    assert len((output_dir / "test_predictions.txt").read_text().splitlines()) == 5
    assert "test_bleu" in results
    config = hf_tiednorm.TiedNormSeq2SeqConfig.from_pretrained(output_dir)
    assert (config.head_mode, config.label_smoothing) == ("distance", 0.2)


def test_clm_perplexity(multi30k_dir, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hf_tiednorm")  # the tie check and step count are INFO lines
    output_dir = tmp_path / "clm"
    run_script("run_clm", [
        "--train_file", multi30k_dir / "train.en.gz", "--validation_file", multi30k_dir / "val.en.gz",
        "--test_file", multi30k_dir / "test_2016_flickr.en.gz", "--output_dir", output_dir,
        "--max_train_samples", "300", "--max_eval_samples", "60", "--vocab_size", "300", "--hidden_size", "32",
        "--intermediate_size", "64", "--num_hidden_layers", "1", "--num_attention_heads", "2", "--head_mode",
        "cosine", "--block_size", "32", "--do_train", "--do_eval", "--max_steps", "4",
        "--per_device_train_batch_size", "8", "--save_steps", "2", "--report_to", "none", "--num_threads", "1",
        "--dataloader_pin_memory", "false",
    ], monkeypatch)
    results = json.loads((output_dir / "all_results.json").read_text())
    for prefix in ("eval", "test"):
        assert results[f"{prefix}_perplexity"] == pytest.approx(math.exp(results[f"{prefix}_loss"]))
        # A barely trained model: within a small factor of the vocabulary size (a diverged one is far above).
        assert 1 < results[f"{prefix}_perplexity"] < 10 * 300
    assert (output_dir / "checkpoint-2").is_dir() and (output_dir / "README.md").is_file()
    assert hf_tiednorm.TiedNormCausalConfig.from_pretrained(output_dir).head_mode == "cosine"
    # The shared TiedWeightsCheck callback (hf_tiednorm/training/callbacks.py) checks the causal LM's tie too.
    assert "rank 0: output layer tied to the decoder embedding after prepare: True" in caplog.text
    assert "rank 0: trained 4 steps" in caplog.text


def test_plot_embedding_norms(trained_de_en, tmp_path):
    run_script("plot_embedding_norms", ["--model_folder", trained_de_en, "--output_dir", tmp_path])  # in-process
    for name in ("embedding_norms.png", "embedding_norms_vs_frequency.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    ("flags", "error", "message"),
    [
        (["--train_file", "/nonexistent/train.{lang}.txt"], FileNotFoundError, "train file not found"),
        (["--head_mode", "bogus"], SystemExit, "2"),  # argparse: invalid choice, the registered modes listed
        (["--tie_topology", "four_way"], StrictDataclassError, "Field 'tie_topology' expected one of"),
        (["--source_lang", "en", "--target_lang", "en"], ValueError, "must differ"),
        (["--source_lang", "fr"], FileNotFoundError, "train.fr.gz"),
        (["--label_smoothing_factor", "0.1"], ValueError, "use --label_smoothing"),
        (["--label_smoothing", "1.5"], StrictDataclassError, r"'label_smoothing':\s+ValueError: Value must be"),
        (["--model_name_or_path", "/nonexistent/model"], FileNotFoundError, "holds no config.json"),
        (["--resume_from_checkpoint", "last"], FileNotFoundError, "no complete checkpoint in"),
        (["--tokenizer_model", "wordpiece"], ValueError, "--tokenizer_model must be one of"),
        (["--early_stopping_patience", "2"], ValueError, "needs --load_best_model_at_end"),
    ],
)
def test_translation_bad_arguments(flags, error, message, tmp_path, monkeypatch, multi30k_dir):
    with pytest.raises(error, match=message):
        run_script("run_translation", ["--output_dir", tmp_path / "out", "--report_to", "none", "--do_train", *flags],
                   monkeypatch)


def test_finetune_rejects_architecture_flags(trained_de_en, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--d_model cannot change a saved model"):
        run_script("run_translation", ["--output_dir", tmp_path, "--model_name_or_path", trained_de_en,
                                       "--d_model", "64"], monkeypatch)


def test_config_file_errors(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="config file not found"):
        run_script("run_translation", [tmp_path / "missing.yaml"], monkeypatch)
    listing = tmp_path / "list.yaml"
    listing.write_text("- output_dir\n")
    with pytest.raises(ValueError, match="must hold a mapping"):
        run_script("run_translation", [listing], monkeypatch)


@pytest.mark.parametrize("script", ["run_translation", "run_clm"])
def test_refuses_processes_outside_the_process_group(script, tmp_path, monkeypatch):
    """torchrun's WORLD_SIZE=2 without a process group (scripts/accelerate/ddp.yaml on CPUs without
    ACCELERATE_USE_CPU): the Trainer sees a world of 1, so each process would train alone as rank 0."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)  # with it, accelerate would wait for the other rank
    with pytest.raises(RuntimeError, match=r"\(WORLD_SIZE\) but the Trainer's process group has 1.*ACCELERATE_USE_CPU"):
        run_script(script, ["--output_dir", tmp_path, "--report_to", "none"], monkeypatch)
    assert not (tmp_path / "token_counts.pt").exists()  # stopped before any work


def test_clm_bad_arguments(tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="train file not found"):
        run_script("run_clm", ["--output_dir", tmp_path, "--do_train", "--train_file", tmp_path / "none.txt"],
                   monkeypatch)
    with pytest.raises(ValueError, match="block_size must be >= 2"):
        run_script("run_clm", ["--output_dir", tmp_path, "--do_train", "--block_size", "1"], monkeypatch)
    # The run flags shared with run_translation.py (hf_tiednorm.training.arguments.RunArguments, setup_run).
    with pytest.raises(ValueError, match="needs --load_best_model_at_end"):
        run_script("run_clm", ["--output_dir", tmp_path, "--do_train", "--early_stopping_patience", "2"], monkeypatch)
    with pytest.raises(ValueError, match="use --label_smoothing"):
        run_script("run_clm", ["--output_dir", tmp_path, "--do_train", "--label_smoothing_factor", "0.1"], monkeypatch)
    assert not (tmp_path / "token_counts.pt").exists()  # stopped before any work


def test_clm_max_train_minutes_stops_training(multi30k_dir, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="hf_tiednorm")  # the tie check and step count are INFO lines
    """--max_train_minutes (shared with run_translation.py): a spent budget stops training after the first step,
    saves that step's model, and the run still evaluates and reports its training minutes."""
    output_dir = tmp_path / "clm"
    run_script("run_clm", [
        "--train_file", multi30k_dir / "train.en.gz", "--validation_file", multi30k_dir / "val.en.gz",
        "--test_file", "", "--output_dir", output_dir, "--max_train_samples", "200", "--max_eval_samples", "20",
        "--vocab_size", "300", "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
        "--num_attention_heads", "2", "--block_size", "32", "--do_train", "--do_eval", "--max_steps", "6",
        "--per_device_train_batch_size", "8", "--save_strategy", "no", "--report_to", "none", "--num_threads", "1",
        "--dataloader_pin_memory", "false", "--max_train_minutes", "0",
    ], monkeypatch)
    assert "max_train_minutes reached at step 1: stopping training" in caplog.text
    assert "rank 0: trained 1 steps" in caplog.text
    results = json.loads((output_dir / "all_results.json").read_text())
    assert results["train_minutes"] >= 0 and "eval_perplexity" in results
    assert (output_dir / "model.safetensors").is_file()


def test_evaluation_keeps_dataset_order_under_group_by_length(tmp_path):
    """Generated predictions are scored against the references in dataset order: evaluation must not be
    length-grouped, although transformers 5 groups it too under train_sampling_strategy="group_by_length"."""
    from datasets import Dataset
    from transformers import Seq2SeqTrainingArguments

    from hf_tiednorm.training.trainers import TiedNormSeq2SeqTrainer

    lengths = [3, 9, 1, 7, 2, 8, 5, 4, 6, 10] * 4  # unsorted, so that any length grouping reorders
    dataset = Dataset.from_dict({"input_ids": [[5] * n for n in lengths]})
    args = Seq2SeqTrainingArguments(tmp_path, train_sampling_strategy="group_by_length", per_device_eval_batch_size=4,
                                    report_to="none", use_cpu=True)
    trainer = TiedNormSeq2SeqTrainer(model=hf_tiednorm.TiedNormForConditionalGeneration(
        hf_tiednorm.TiedNormSeq2SeqConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1,
                                          encoder_ffn_dim=8, decoder_ffn_dim=8, encoder_attention_heads=1,
                                          decoder_attention_heads=1)), args=args)
    assert list(trainer._get_eval_sampler(dataset)) == list(range(len(lengths)))


@pytest.mark.parametrize("script", ["run_translation", "run_clm"])
def test_dataset_name_defaults_from_the_training_file(script, tmp_path):
    """The model card's data set (hf_tiednorm.training.arguments.DataArgumentsBase, shared by both scripts): the Hub
    id for the default Multi30k files, else the training file's name; an explicit --dataset_name wins."""
    data_arguments = load_script(script).DataArguments
    assert data_arguments().dataset_name == "bentrevett/multi30k"
    assert data_arguments(train_file=str(tmp_path / "mine.txt")).dataset_name == "mine.txt"
    assert data_arguments(train_file=str(tmp_path / "mine.txt"), dataset_name="org/set").dataset_name == "org/set"
