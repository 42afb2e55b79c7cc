"""Runs never mix (issue 14): one run per --output_dir unless --overwrite_output_dir (which starts clean), resuming
only the last complete checkpoint of the same architecture, a final save that a kill cannot turn into a new config
over old weights, sequence lengths checked against the positions at start-up, and `tiednorm-push` checking the path
first. Tiny data made in code; a few seconds per script run."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest
import torch
import transformers.modeling_utils
from safetensors.torch import save_file
from script_helpers import run_script, tiny_translation_flags, write_tiny_parallel
from testing_utils import tiny_causal_config
from transformers import AutoTokenizer, Trainer, TrainingArguments

import hf_tiednorm
from hf_tiednorm.publishing import hub
from hf_tiednorm.training.run_directory import resolve_resume_checkpoint, save_final_model


def test_reused_output_dir_is_refused(finished_run, data_flags, monkeypatch):
    before = (finished_run / "config.json").read_text()
    with pytest.raises(FileExistsError, match=r"already holds another run's outputs .*--overwrite_output_dir"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, finished_run, "--do_train", "--max_steps", "1", "--head_mode", "l2",
        ), monkeypatch)
    assert (finished_run / "config.json").read_text() == before
    assert (finished_run / "run.log").read_text() == "launcher log\n"


def test_overwrite_output_dir_starts_clean(finished_run, data_flags, tmp_path, monkeypatch):
    """Nothing of the old run survives: checkpoints, predictions, BLEU in all_results.json, its tokenizer."""
    output_dir = tmp_path / "reused"
    shutil.copytree(finished_run, output_dir)
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--overwrite_output_dir", "--do_train", "--max_steps", "1", "--save_strategy", "no",
        "--head_mode", "l2", "--vocab_size", "60",
    ), monkeypatch)
    assert not list(output_dir.glob("checkpoint-*"))
    assert not (output_dir / "test_predictions.txt").exists()
    results = json.loads((output_dir / "all_results.json").read_text())
    assert "test_bleu" not in results and "train_loss" in results
    assert hf_tiednorm.TiedNormSeq2SeqConfig.from_pretrained(output_dir).head_mode == "l2"
    assert len(AutoTokenizer.from_pretrained(output_dir)) <= 60  # a new tokenizer, not the old run's
    assert (output_dir / "run.log").is_file()  # the launcher may still be writing it


def test_overwrite_output_dir_never_deletes_the_inputs(finished_run, data_flags, monkeypatch):
    with pytest.raises(ValueError, match=r"delete .*checkpoint-2, which --model_name_or_path .*checkpoint-2 reads"):
        run_script("run_translation", [
            *data_flags, "--output_dir", finished_run, "--overwrite_output_dir", "--model_name_or_path",
            finished_run / "checkpoint-2", "--report_to", "none", "--do_train", "--max_steps", "1",
        ], monkeypatch)
    assert (finished_run / "checkpoint-2" / "config.json").is_file()


def test_resume_refuses_a_checkpoint_of_another_architecture(finished_run, data_flags, monkeypatch):
    with pytest.raises(ValueError, match=r"head_mode='baseline', but this run builds head_mode='l2'"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, finished_run, "--do_train", "--max_steps", "3", "--head_mode", "l2",
            "--resume_from_checkpoint", "last",
        ), monkeypatch)


def test_resume_last_skips_a_half_written_checkpoint(finished_run, data_flags, tmp_path, monkeypatch):
    """A kill while saving checkpoint-3 left it without trainer_state.json: `last` resumes checkpoint-2."""
    output_dir = tmp_path / "killed"
    shutil.copytree(finished_run, output_dir)
    shutil.copytree(output_dir / "checkpoint-2", output_dir / "checkpoint-3")
    (output_dir / "checkpoint-3" / "trainer_state.json").unlink()
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--max_steps", "3", "--save_strategy", "no",
        "--resume_from_checkpoint", "last",
    ), monkeypatch)
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 3
    # The finished run's results describe the weights this run replaced: gone, not merged.
    assert "test_bleu" not in json.loads((output_dir / "all_results.json").read_text())


def test_resolve_resume_checkpoint_means_last_complete(tmp_path):
    for step, complete in ((1, True), (2, True), (3, False), (10, False)):
        folder = tmp_path / f"checkpoint-{step}"
        write_checkpoint_files(folder)  # weights, optimizer, scheduler, RNG state (issue 24: all that a resume needs)
        if complete:
            (folder / "trainer_state.json").write_text(f'{{"global_step": {step}}}')
    (tmp_path / "checkpoint-10" / "trainer_state.json").write_text('{"global_st')  # killed mid-write
    args = SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint="last")
    assert resolve_resume_checkpoint(args) == str(tmp_path / "checkpoint-2")
    args.resume_from_checkpoint = str(tmp_path / "checkpoint-3")
    with pytest.raises(ValueError, match=r"checkpoint-3 is incomplete"):
        resolve_resume_checkpoint(args)


def write_checkpoint_files(folder) -> None:
    """Every file of a checkpoint but trainer_state.json, tiny: valid safetensors weights, config and small state
    files."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    save_file({"weight": torch.zeros(2, 2)}, folder / "model.safetensors")
    for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
        torch.save({}, folder / name)


def test_final_save_killed_midway_keeps_the_previous_model(tmp_path, monkeypatch):
    """Before: a kill after config.json was written left an l2 config.json over the old cosine weights."""
    output_dir = tmp_path / "run"
    torch.manual_seed(0)
    old = hf_tiednorm.TiedNormForCausalLM(tiny_causal_config(head_mode="cosine"))
    old.save_pretrained(output_dir)
    new = hf_tiednorm.TiedNormForCausalLM(tiny_causal_config(head_mode="l2"))
    trainer = Trainer(model=new, args=TrainingArguments(output_dir, report_to="none", use_cpu=True))

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed while writing the weights")

    with monkeypatch.context() as patch:
        patch.setattr(transformers.modeling_utils, "safe_save_file", killed)
        with pytest.raises(KeyboardInterrupt):
            save_final_model(trainer)
    loaded = hf_tiednorm.TiedNormForCausalLM.from_pretrained(output_dir)
    assert loaded.config.head_mode == "cosine"
    torch.testing.assert_close(loaded.lm_head.weight, old.lm_head.weight)

    save_final_model(trainer)  # the next save completes and replaces the old model
    loaded = hf_tiednorm.TiedNormForCausalLM.from_pretrained(output_dir)
    assert loaded.config.head_mode == "l2"
    torch.testing.assert_close(loaded.lm_head.weight, new.lm_head.weight)
    assert not (tmp_path / ".run.saving").exists()


@pytest.mark.parametrize("flag", ["--max_source_length", "--max_target_length", "--generation_max_length"])
def test_lengths_beyond_the_positions_are_refused_at_start_up(flag, data_flags, tmp_path, monkeypatch):
    output_dir = tmp_path / "out"
    with pytest.raises(ValueError, match=rf"^{flag} 6000 exceeds the model's max_position_embeddings=256"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "1", flag, "6000",
        ), monkeypatch)
    assert not output_dir.exists()  # before any work


def test_clm_refuses_a_used_output_dir(tmp_path, monkeypatch):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "train.txt").write_text("a dog runs .\n")
    with pytest.raises(FileExistsError, match="--overwrite_output_dir"):
        run_script("run_clm", ["--output_dir", tmp_path, "--train_file", tmp_path / "train.txt", "--validation_file",
                               "", "--test_file", "", "--report_to", "none", "--do_train"], monkeypatch)


def test_push_checks_the_path_before_the_token(tmp_path, monkeypatch):
    """Before: a missing checkpoint folder was reported as a missing Hugging Face token."""
    monkeypatch.setattr(hub, "get_token", lambda: None)
    with pytest.raises(FileNotFoundError, match="checkpoint folder not found: .*no_such_run"):
        hub.main([str(tmp_path / "no_such_run"), "user/repo"])


def test_test_predictions_answer_every_test_line_in_order(tmp_path, monkeypatch):
    """Issue 48 (9) end to end: a test file with a copied pair (line 2) and an empty one (line 3) gets a prediction
    for each of its lines, so line i of test_predictions.txt answers source line i."""
    data = tmp_path / "data"
    data.mkdir()
    flags = write_tiny_parallel(data)
    source = (data / "test.de").read_text().splitlines()
    target = (data / "test.en").read_text().splitlines()
    source[1], target[1] = "berlin", "Berlin "  # a copy up to whitespace
    source[2] = ""
    (data / "test.de").write_text("\n".join(source) + "\n")
    (data / "test.en").write_text("\n".join(target) + "\n")
    out = tmp_path / "out"
    run_script("run_translation", tiny_translation_flags(
        flags, out, "--do_train", "--max_steps", "1", "--save_strategy", "no", "--do_predict",
        "--predict_with_generate", "--max_predict_samples", str(len(source)),
    ), monkeypatch)
    assert len((out / "test_predictions.txt").read_text().splitlines()) == len(source)
