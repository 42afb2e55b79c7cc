"""Nothing silent in a run folder (issue 24): one run at a time holds --output_dir, a resume restores everything or is
refused by name, scoring a finished run uses its trained weights and keeps its results, the card and plots never
describe other weights, train_loss says which steps it covers, flags used after training are checked before it, and a
full disk names the checkpoint being written. Tiny data made in code; a few seconds per script run."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
import transformers.modeling_utils
from safetensors.torch import load_file, save_file
from script_helpers import REPO_ROOT, load_script, run_script, tiny_translation_flags
from testing_utils import tiny_causal_config, tiny_tokenizer
from transformers import Trainer, TrainingArguments

import hf_tiednorm
from hf_tiednorm.training import steps
from hf_tiednorm.training.run_directory import (
    lock_output_dir,
    lock_path,
    release_output_dir_locks,
    save_final_model,
)


def copy_run(finished_run, tmp_path):
    output_dir = tmp_path / "run"
    shutil.copytree(finished_run, output_dir)
    return output_dir


def snapshot(folder, names) -> dict[str, bytes]:
    return {name: (folder / name).read_bytes() for name in names}


RUN_RESULTS = ("train_results.json", "all_results.json", "test_results.json", "README.md", "embedding_norms.png",
               "model.safetensors")


# One run per folder at a time -----------------------------------------------------------------------------------------


def hold_lock(output_dir, barrier, results) -> None:
    """In a forked process: wait for the other one, then try to take the run's lock at the same moment."""
    barrier.wait()
    try:
        lock_output_dir(output_dir, 0)
        results.put("held")
        barrier.wait()  # hold it until the other process has tried
    except RuntimeError as error:
        results.put(str(error))
        barrier.wait()


def test_two_processes_locking_one_output_dir_together(tmp_path):
    """The lock itself, fast: two processes started together at a barrier; exactly one holds the folder."""
    context = multiprocessing.get_context("fork")
    barrier, results = context.Barrier(2), context.Queue()
    processes = [context.Process(target=hold_lock, args=(tmp_path / "run", barrier, results)) for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = sorted(results.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(timeout=60)
    assert outcomes[1] == "held", outcomes
    assert outcomes[0].startswith(f"--output_dir {tmp_path / 'run'} is in use by another run (pid "), outcomes
    # The holder exited without atexit (a forked child): the kernel released its lock, the next run takes it.
    assert lock_output_dir(tmp_path / "run", 0) == lock_path(tmp_path / "run")
    release_output_dir_locks()


# Two script processes importing transformers on shared cores: 27 s on the 2-core machine busy with other jobs.
@pytest.mark.slow
def test_two_runs_started_together_on_one_output_dir(data_flags, tmp_path):
    """Both exited 0 and the folder ended with the last writer's weights; now one holds the folder, the other stops
    naming it. Two processes wait at a barrier (files) and start main() together."""
    output_dir, barrier = tmp_path / "shared_run", tmp_path / "barrier"
    barrier.mkdir()
    runner = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {str(REPO_ROOT / 'tests')!r})
        from script_helpers import load_script
        module = load_script("run_translation")
        open(os.path.join({str(barrier)!r}, sys.argv[1]), "w").close()
        while len(os.listdir({str(barrier)!r})) < 2:
            time.sleep(0.01)
        sys.argv = ["run_translation.py", *sys.argv[2:]]
        module.main()
    """)
    flags = tiny_translation_flags(data_flags, output_dir, "--do_train", "--max_steps", "1", "--save_strategy", "no")
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    processes = [
        subprocess.Popen([sys.executable, "-c", runner, name, *map(str, flags)], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for name in ("a", "b")
    ]
    outputs = [process.communicate(timeout=300)[0] for process in processes]
    codes = sorted(process.returncode for process in processes)
    assert codes[0] == 0 and codes[1] != 0, outputs
    refused = outputs[[process.returncode for process in processes].index(codes[1])]
    assert f"--output_dir {output_dir} is in use by another run (pid " in refused
    assert not lock_path(output_dir).exists()  # released when the run ended


def test_lock_of_a_dead_run_is_named_and_taken_over(tmp_path, caplog):
    """A run killed with SIGKILL keeps no lock (the kernel drops it); its lock file is named and taken over."""
    output_dir = tmp_path / "run"
    code = (f"import os, sys; sys.path.insert(0, {str(REPO_ROOT)!r}); "
            "from hf_tiednorm.training.run_directory import lock_output_dir; "
            f"lock_output_dir({str(output_dir)!r}, 0); os.kill(os.getpid(), 9)")
    killed = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    assert killed.wait(timeout=120) == -9 and lock_path(output_dir).is_file()
    with caplog.at_level("WARNING"):
        assert lock_output_dir(output_dir, 0) == lock_path(output_dir)
    assert f"taking over the stale lock of a dead run (pid {killed.pid}," in caplog.text
    release_output_dir_locks()
    assert not lock_path(output_dir).exists()


# Resume: everything or a refusal by name ------------------------------------------------------------------------------


@pytest.mark.parametrize("missing", ["optimizer.pt", "scheduler.pt"])
def test_resume_without_optimizer_or_scheduler_is_refused_by_name(finished_run, data_flags, tmp_path, monkeypatch,
                                                                  missing):
    """--save_only_model (or a deleted optimizer.pt) resumed silently: the schedule restarted, the weights drifted."""
    output_dir = copy_run(finished_run, tmp_path)
    (output_dir / "checkpoint-2" / missing).unlink()
    before = snapshot(output_dir, RUN_RESULTS)
    with pytest.raises(ValueError, match=rf"checkpoint-2 is incomplete \(no {missing}\).*--model_name_or_path"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "3", "--resume_from_checkpoint",
            output_dir / "checkpoint-2",
        ), monkeypatch)
    assert snapshot(output_dir, RUN_RESULTS) == before


def test_truncated_weights_of_the_newest_checkpoint_are_found_before_any_data_work(finished_run, data_flags,
                                                                                    tmp_path, monkeypatch, caplog):
    """A truncated model.safetensors in the newest "complete" checkpoint failed after tokenization, unnamed."""
    output_dir = copy_run(finished_run, tmp_path)
    weights = output_dir / "checkpoint-2" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    module = load_script("run_translation")
    monkeypatch.setattr(module, "load_parallel", lambda *a, **k: pytest.fail("data loaded before the check"))
    with pytest.raises(ValueError, match=r"checkpoint-2 is incomplete \(model\.safetensors is truncated \(\d+ of"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "3", "--resume_from_checkpoint",
            output_dir / "checkpoint-2",
        ), monkeypatch)
    monkeypatch.undo()
    with caplog.at_level("WARNING"):  # "last" skips it, naming why, and resumes checkpoint-1
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_strategy", "no",
            "--resume_from_checkpoint", "last",
        ), monkeypatch)
    assert "skipping" in caplog.text and "model.safetensors is truncated" in caplog.text
    results = json.loads((output_dir / "all_results.json").read_text())
    # train_loss is the Trainer's mean over this process's steps: step 2 only, and all_results.json says so.
    assert (results["train_loss_first_step"], results["train_loss_last_step"]) == (2, 2)
    assert results["train_resumed_from_step"] == 1


def test_nan_weights_of_a_resumed_checkpoint_are_named(finished_run, data_flags, tmp_path, monkeypatch):
    """The Trainer loads a checkpoint's weights itself (not through from_pretrained): NaN trained on to a nan loss."""
    output_dir = copy_run(finished_run, tmp_path)
    path = output_dir / "checkpoint-2" / "model.safetensors"
    weights = load_file(path)
    name = next(key for key in weights if key.endswith("fc1.weight"))
    weights[name][0, 0] = float("inf")
    save_file(weights, path, metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"tensor '{name}' .* holds 1 NaN/inf value"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "3", "--resume_from_checkpoint", "last",
        ), monkeypatch)


# Scoring a finished run -----------------------------------------------------------------------------------------------


def test_predict_only_scores_the_trained_weights_and_keeps_the_runs_results(finished_run, data_flags, tmp_path,
                                                                          monkeypatch):
    """--do_predict without --do_train scored a fresh model and replaced the run's results; now it scores the trained
    weights (the same BLEU as the run's own prediction) into a new sub-folder."""
    output_dir = copy_run(finished_run, tmp_path)
    before = snapshot(output_dir, RUN_RESULTS)
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_predict", "--predict_with_generate",
    ), monkeypatch)
    assert snapshot(output_dir, RUN_RESULTS) == before
    (scored,) = output_dir.glob("scored-*")
    rescored = json.loads((scored / "test_results.json").read_text())
    original = json.loads((output_dir / "test_results.json").read_text())
    assert rescored["test_bleu"] == original["test_bleu"] and rescored["test_gen_len"] == original["test_gen_len"]
    assert not (scored / "README.md").exists()  # no card without weights beside it


def test_predict_only_with_resume_is_refused_and_keeps_the_runs_results(finished_run, data_flags, tmp_path,
                                                                       monkeypatch):
    output_dir = copy_run(finished_run, tmp_path)
    before = snapshot(output_dir, RUN_RESULTS)
    with pytest.raises(ValueError, match=r"--resume_from_checkpoint continues training.*--model_name_or_path"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_predict", "--predict_with_generate", "--resume_from_checkpoint", "last",
        ), monkeypatch)
    assert snapshot(output_dir, RUN_RESULTS) == before


def test_eval_only_in_an_empty_folder_is_refused(data_flags, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match=r"holds none \(no config\.json and weights\)"):
        run_script("run_translation", tiny_translation_flags(data_flags, tmp_path / "new", "--do_eval"), monkeypatch)


# The card and plots go with the weights they describe -----------------------------------------------------------------


def test_kill_after_the_final_save_leaves_no_card_of_other_weights(finished_run, data_flags, tmp_path, monkeypatch):
    """A kill right after the final save of a resumed run left the new weights beside the previous card and plot."""
    output_dir = copy_run(finished_run, tmp_path)
    old_weights = (output_dir / "model.safetensors").read_bytes()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed after the final save")

    monkeypatch.setattr(steps, "write_plots_and_card", killed)
    with pytest.raises(KeyboardInterrupt):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "3", "--save_strategy", "no",
            # checkpoint-1: a resumed step with a non-zero learning rate (the optimizer keeps the old schedule's)
            "--resume_from_checkpoint", output_dir / "checkpoint-1",
        ), monkeypatch)
    assert (output_dir / "model.safetensors").read_bytes() != old_weights  # the new model is in place
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 3
    assert not (output_dir / "README.md").exists() and not list(output_dir.glob("*.png"))


# Flags used after training, checked before it -------------------------------------------------------------------------


@pytest.mark.parametrize("flag", ["--max_train_samples", "--max_eval_samples", "--max_predict_samples",
                                  "--generation_num_beams", "--generation_num_beams_during_training"])
def test_flags_used_after_training_are_checked_before_it(flag, data_flags, tmp_path, monkeypatch):
    """--max_eval_samples 0 / --generation_num_beams 0 failed only after training and saving."""
    output_dir = tmp_path / "out"
    with pytest.raises(ValueError, match=rf"^{flag} 0 "):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
            "--max_steps", "1", flag, "0",
        ), monkeypatch)
    assert not output_dir.exists() or not any(output_dir.iterdir())


def test_evaluations_during_training_decode_with_their_own_beam_size(data_flags, tmp_path, monkeypatch):
    """--generation_num_beams_during_training 1: each epoch's validation BLEU is greedy (a cheap learning curve, issue
    25), the evaluation and the prediction after training keep --generation_num_beams."""
    beams = []
    generate = hf_tiednorm.TiedNormForConditionalGeneration.generate

    def spy(self, *args, **kwargs):
        beams.append(kwargs.get("num_beams", self.generation_config.num_beams))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(hf_tiednorm.TiedNormForConditionalGeneration, "generate", spy)
    output_dir = tmp_path / "out"
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--do_eval", "--do_predict", "--predict_with_generate",
        "--max_train_samples", "16", "--num_train_epochs", "2", "--eval_strategy", "epoch",
        "--per_device_eval_batch_size", "8", "--max_eval_samples", "4",
        "--generation_num_beams", "3", "--generation_num_beams_during_training", "1",
    ), monkeypatch)
    assert beams == [1, 1, 3, 3]  # two epoch-end evaluations, then the final evaluation and the prediction
    history = json.loads((output_dir / "trainer_state.json").read_text())["log_history"]
    assert len([entry for entry in history if "eval_bleu" in entry]) >= 2


def test_broken_yaml_config_names_the_file(tmp_path, monkeypatch):
    config = tmp_path / "run.yaml"
    config.write_text("output_dir: out\nhead_mode: [cosine\n")
    with pytest.raises(ValueError, match=rf"config file {config} cannot be read: while parsing"):
        run_script("run_translation", [config], monkeypatch)


def test_broken_tokenizer_folder_is_named(data_flags, tmp_path, monkeypatch):
    """A damaged tokenizer.json raised `Exception: expected value at line 1 column 1` naming no file."""
    folder = tmp_path / "tokenizer"
    tiny_tokenizer().save_pretrained(folder)
    (folder / "tokenizer.json").write_text('{"version": ')
    with pytest.raises(ValueError, match=rf"--tokenizer_name {folder}: cannot load the tokenizer: "):
        run_script("run_translation", tiny_translation_flags(
            data_flags, tmp_path / "out", "--do_train", "--max_steps", "1", "--tokenizer_name", folder,
        ), monkeypatch)


# A full disk names what it was writing --------------------------------------------------------------------------------


def test_disk_full_during_a_checkpoint_save_names_the_checkpoint(data_flags, tmp_path, monkeypatch):
    """torch.save on a full disk raises `RuntimeError: basic_ios::clear: iostream error`, naming nothing."""
    output_dir = tmp_path / "out"
    save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if "checkpoint-" in str(path):
            raise RuntimeError("basic_ios::clear: iostream error")
        return save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9, 0))
    with pytest.raises(OSError, match=rf"no space left on device while writing {output_dir}/checkpoint-1 "):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "1", "--save_steps", "1",
        ), monkeypatch)


def test_late_flag_check_reads_the_data_arguments():
    """The check itself, without a script: a zero in any sample limit."""
    args = type("Args", (), {"do_eval": False, "do_predict": False, "eval_strategy": "no",
                             "generation_num_beams": None, "generation_max_length": None})()
    data = type("Data", (), {"max_train_samples": None, "max_eval_samples": 0, "validation_file": "v"})()
    with pytest.raises(ValueError, match="--max_eval_samples 0 selects no rows"):
        steps.check_late_flags(args, data)


def test_disk_full_during_the_final_save_names_the_staging_folder(tmp_path, monkeypatch):
    """safetensors on a full disk: `No space left on device (os error 28)`; the old model stays (issue 14)."""
    model = hf_tiednorm.TiedNormForCausalLM(tiny_causal_config())
    trainer = Trainer(model=model, args=TrainingArguments(tmp_path / "run", report_to="none", use_cpu=True))

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full_disk)
    with pytest.raises(OSError, match=rf"no space left on device while writing {tmp_path}/\.run\.saving"):
        save_final_model(trainer)
