"""A resume continues the run it resumes (issue 34 §0, §1): the checkpoint's token order, and the flags that define
the run, recorded in the run folder at start and compared on resume. Tiny data made in code."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import sys

import pytest
from script_helpers import load_script, run_script, tiny_translation_flags
from transformers import AutoTokenizer, TrainingArguments

from hf_tiednorm.training.arguments import parse_arguments
from hf_tiednorm.training.run_record import (
    TRAINING_FIELDS_NOT_RECORDED,
    check_resume_record,
    check_schedule_left,
    run_record,
    write_run_record,
)


@pytest.fixture(scope="module")
def adaptive_run(data_flags, tmp_path_factory):
    """An --adaptive_cutoffs run with checkpoints 1 and 2."""
    output_dir = tmp_path_factory.mktemp("adaptive")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_steps", "1",
            "--adaptive_cutoffs", "40", "100", "--max_train_samples", "40",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def test_resume_of_an_adaptive_run_keeps_the_checkpoint_token_order(adaptive_run, data_flags, tmp_path, monkeypatch):
    """Resuming with other counts (another --max_train_samples) re-sorted the checkpoint's tokenizer: a saved model
    whose token ids no longer matched its weights."""
    output_dir = tmp_path / "resumed"
    shutil.copytree(adaptive_run, output_dir)
    vocab = AutoTokenizer.from_pretrained(output_dir / "checkpoint-1").get_vocab()
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--max_steps", "2", "--save_strategy", "no",
        "--adaptive_cutoffs", "40", "100", "--max_train_samples", "8", "--allow_run_change", "max_train_samples",
        "--resume_from_checkpoint", output_dir / "checkpoint-1",
    ), monkeypatch)
    assert AutoTokenizer.from_pretrained(output_dir).get_vocab() == vocab


@pytest.fixture(scope="module")
def recorded_run(data_flags, tmp_path_factory):
    """A run with label smoothing and checkpoints 1-4, resumed by the tests below with other flags."""
    output_dir = tmp_path_factory.mktemp("recorded")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "4", "--save_steps", "1", "--label_smoothing", "0.1",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def resume_copy(run, tmp_path, step=2):
    output_dir = tmp_path / "resumed"
    shutil.copytree(run, output_dir)
    for folder in output_dir.glob("checkpoint-*"):
        if int(folder.name.split("-")[1]) > step:
            shutil.rmtree(folder)
    return output_dir


def test_the_run_folder_records_what_defines_the_run(recorded_run, data_flags):
    record = json.loads((recorded_run / "run_record.json").read_text())
    assert record["data"]["source_lang"] == "de" and record["data"]["target_lang"] == "en"
    train = data_flags[data_flags.index("--train_file") + 1]
    assert record["data"][f"train_file {train.format(lang='de')}"]["sha256"]
    assert record["model"]["label_smoothing"] == 0.1 and record["model"]["dropout"] == 0
    assert record["training"]["seed"] == 1 and record["training"]["max_steps"] == 4
    assert record["training"]["precision"] == "fp32"
    results = json.loads((recorded_run / "all_results.json").read_text())
    assert results["precision"] == "fp32"
    assert "| precision | fp32 |" in (recorded_run / "README.md").read_text()


@pytest.mark.parametrize(("flags", "named"), [
    (["--source_lang", "en", "--target_lang", "de"], r"source_lang: 'de' -> 'en'"),
    (["--label_smoothing", "0"], r"label_smoothing: 0\.1 -> 0\.0"),
    (["--label_smoothing", "0.1", "--dropout", "0.3"], r"dropout: 0\.0 -> 0\.3"),
    (["--label_smoothing", "0.1", "--bf16", "true"], r"precision: 'fp32' -> 'bf16'"),
    (["--label_smoothing", "0.1", "--seed", "7"], r"seed: 1 -> 7"),
    (["--label_smoothing", "0.1", "--max_train_samples", "8"], r"max_train_samples: None -> 8"),
])
def test_resume_refuses_another_run_by_name(recorded_run, data_flags, tmp_path, monkeypatch, flags, named):
    """Each of these resumed with rc 0: another direction, objective, regularizer, precision, shuffle or data."""
    output_dir = resume_copy(recorded_run, tmp_path)
    with pytest.raises(ValueError, match=rf"continues a run started with other settings .*{named}.*"
                                         r"--allow_run_change"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "4", "--save_strategy", "no",
            "--resume_from_checkpoint", "last", *flags,
        ), monkeypatch)


def test_resume_refuses_other_training_data(recorded_run, data_flags, tmp_path, monkeypatch):
    """Another --train_file (here the test set) continued silently."""
    output_dir = resume_copy(recorded_run, tmp_path)
    flags = list(data_flags)
    flags[flags.index("--train_file") + 1] = flags[flags.index("--test_file") + 1]
    with pytest.raises(ValueError, match=r"train_file: .*train\.\{lang\}' -> .*test\.\{lang\}'"):
        run_script("run_translation", tiny_translation_flags(
            flags, output_dir, "--do_train", "--max_steps", "4", "--label_smoothing", "0.1",
            "--resume_from_checkpoint", "last",
        ), monkeypatch)


def test_a_knowing_change_is_allowed_and_recorded(recorded_run, data_flags, tmp_path, monkeypatch):
    output_dir = resume_copy(recorded_run, tmp_path)
    run_script("run_translation", tiny_translation_flags(
        data_flags, output_dir, "--do_train", "--max_steps", "3", "--save_strategy", "no", "--label_smoothing", "0.1",
        "--dropout", "0.3", "--allow_run_change", "dropout", "--resume_from_checkpoint", "last",
    ), monkeypatch)
    record = json.loads((output_dir / "run_record.json").read_text())
    assert record["model"]["dropout"] == 0.3
    assert {"step": 2, "flag": "dropout", "old": 0, "new": 0.3} in record["changes"]


def test_max_steps_below_the_checkpoint_is_refused(recorded_run, data_flags, tmp_path, monkeypatch):
    """Resuming checkpoint-4 with --max_steps 2 trained to step 5; the card said "max_steps 2 / steps trained 5"."""
    output_dir = resume_copy(recorded_run, tmp_path, step=4)
    with pytest.raises(ValueError, match=r"--max_steps 2 is not beyond --resume_from_checkpoint .*at step 4"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--label_smoothing", "0.1",
            "--resume_from_checkpoint", output_dir / "checkpoint-4",
        ), monkeypatch)


def test_resume_without_the_runs_tokenizer_is_refused(adaptive_run, data_flags, tmp_path, monkeypatch):
    """With no tokenizer beside the checkpoint, a resume trained a new one (or took --tokenizer_name unsorted): ids
    that did not match the checkpoint's embedding rows."""
    output_dir = tmp_path / "resumed"
    shutil.copytree(adaptive_run, output_dir)
    for folder in (output_dir, output_dir / "checkpoint-1"):
        (folder / "tokenizer.json").unlink()
        (folder / "tokenizer_config.json").unlink()
    with pytest.raises(FileNotFoundError, match=r"checkpoint-1: neither it nor .* holds the run's tokenizer"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "2", "--adaptive_cutoffs", "40", "100",
            "--max_train_samples", "40", "--resume_from_checkpoint", output_dir / "checkpoint-1",
        ), monkeypatch)


# --- issue 40 S4, S5, U1: every setting that changes the result is recorded; a resume must have steps left ----------

def parsed_flags(monkeypatch, *flags):
    """run_translation.py's parsed dataclasses for ``flags`` (no run): model, data, run, output, training."""
    module = load_script("run_translation")
    monkeypatch.setattr(sys, "argv", ["run_translation.py", "--output_dir", "unused", "--report_to", "none", *flags])
    return parse_arguments((module.ModelArguments, module.DataArguments, module.RunArguments,
                            module.OutputDirArguments, module.TiedNormSeq2SeqTrainingArguments))


def record_of(monkeypatch, *flags):
    model_args, data_args, run_args, _, training_args = parsed_flags(monkeypatch, *flags)
    return run_record(model_args, data_args, training_args, run_args)


def saved_run(tmp_path, record, state=None):
    """A run folder holding ``record`` and a checkpoint-2 whose trainer_state.json is ``state``."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps(state or {"global_step": 2, "epoch": 0.4}))
    write_run_record(tmp_path / "run", json.loads(json.dumps(record)))
    return checkpoint


@pytest.mark.parametrize(("flags", "named"), [
    (["--train_sampling_strategy", "sequential"], r"train_sampling_strategy: 'random' -> 'sequential'"),
    (["--lr_scheduler_kwargs", '{"power": 2.0}'], r"lr_scheduler_kwargs: None -> \{'power': 2\.0\}"),
    (["--neftune_noise_alpha", "5"], r"neftune_noise_alpha: None -> 5\.0"),
    (["--dataloader_drop_last", "true"], r"dataloader_drop_last: False -> True"),
    (["--early_stopping_patience", "2", "--load_best_model_at_end", "true", "--eval_strategy", "steps",
      "--save_strategy", "steps"], r"early_stopping_patience: None -> 2"),
])
def test_a_resume_changing_any_result_setting_is_refused(monkeypatch, tmp_path, flags, named):
    """S4: each was accepted with an empty `changes` while losses or the learning rate differed (LR at step 4 with
    --lr_scheduler_kwargs: 8.8e-7 vs 1.26e-5): the record held an allow-list of TrainingArguments."""
    checkpoint = saved_run(tmp_path, record_of(monkeypatch))
    with pytest.raises(ValueError, match=rf"continues a run started with other settings .*{named}"):
        check_resume_record(str(checkpoint), tmp_path / "run", record_of(monkeypatch, *flags), [])


def test_settings_that_cannot_change_the_result_may_change(monkeypatch, tmp_path):
    checkpoint = saved_run(tmp_path, record_of(monkeypatch))
    quiet = record_of(monkeypatch, "--logging_steps", "3", "--save_steps", "7", "--dataloader_num_workers", "0",
                      "--per_device_eval_batch_size", "2", "--num_threads", "1", "--max_train_minutes", "5")
    assert check_resume_record(str(checkpoint), tmp_path / "run", quiet, []) == []


def test_every_training_argument_is_recorded_unless_listed(monkeypatch):
    """A TrainingArguments field is recorded unless TRAINING_FIELDS_NOT_RECORDED names it (with the reason in its
    comment): a field a newer transformers adds is recorded without an edit, and the list names real fields only."""
    module = load_script("run_translation")
    fields = {field.name for cls in (module.TiedNormSeq2SeqTrainingArguments, TrainingArguments,
                                     load_script("run_clm").TiedNormTrainingArguments)
              for field in dataclasses.fields(cls)}
    assert set(TRAINING_FIELDS_NOT_RECORDED) <= fields
    recorded = record_of(monkeypatch)["training"]
    assert set(recorded) == {
        field.name for field in dataclasses.fields(module.TiedNormSeq2SeqTrainingArguments)
    } - set(TRAINING_FIELDS_NOT_RECORDED) | {"precision"}

    @dataclasses.dataclass
    class NewerTrainingArguments(module.TiedNormSeq2SeqTrainingArguments):
        a_new_knob: float = 0.5  # a field a newer transformers might add

    model_args, data_args, _, _, _ = parsed_flags(monkeypatch)
    newer = NewerTrainingArguments(output_dir="unused", report_to="none")
    assert run_record(model_args, data_args, newer)["training"]["a_new_knob"] == 0.5


def test_a_record_written_before_a_setting_was_recorded_still_resumes(monkeypatch, tmp_path, caplog):
    """A record of the old allow-list (no neftune_noise_alpha, no run section) is compared on what it holds; the
    settings it lacks are named in a warning."""
    record = record_of(monkeypatch)
    old = {"data": record["data"], "model": record["model"],
           "training": {name: record["training"][name] for name in ("seed", "max_steps", "learning_rate")}}
    checkpoint = saved_run(tmp_path, old)
    with caplog.at_level("WARNING"):
        assert check_resume_record(str(checkpoint), tmp_path / "run", record, []) == []
    assert "predates these settings" in caplog.text and "neftune_noise_alpha" in caplog.text
    with pytest.raises(ValueError, match=r"seed: 42 -> 7"):
        check_resume_record(str(checkpoint), tmp_path / "run", record_of(monkeypatch, "--seed", "7"), [])


@pytest.mark.parametrize("text", ['{"data": {"source_lang": "de"', "", "[]", "null", '{"data": []}'])
def test_an_unreadable_run_record_is_named(monkeypatch, tmp_path, text):
    """U1: a truncated, empty or list-valued run_record.json gave a bare JSONDecodeError / AttributeError."""
    record = record_of(monkeypatch)
    checkpoint = saved_run(tmp_path, record)
    (tmp_path / "run" / "run_record.json").write_text(text)
    with pytest.raises(ValueError, match=r"run/run_record\.json (cannot be read|holds \w+, not a run record).*"
                                         r"restore it, or delete it"):
        check_resume_record(str(checkpoint), tmp_path / "run", record, [])


@pytest.mark.parametrize(("training", "state", "refused"), [
    ({"max_steps": -1, "num_train_epochs": 1.0}, {"global_step": 8, "epoch": 8 / 6}, r"--num_train_epochs 1 is not"),
    ({"max_steps": -1, "num_train_epochs": 4 / 3}, {"global_step": 8, "epoch": 8 / 6}, r"--num_train_epochs 1\.3"),
    ({"max_steps": -1, "num_train_epochs": 1.34}, {"global_step": 8, "epoch": 8 / 6}, None),  # step 9 is left
    ({"max_steps": -1, "num_train_epochs": 2.0}, {"global_step": 8, "epoch": 8 / 6}, None),
    ({"max_steps": 8, "num_train_epochs": 1.0}, {"global_step": 8, "epoch": 8 / 6}, r"--max_steps 8 is not beyond"),
    ({"max_steps": 9, "num_train_epochs": 1.0}, {"global_step": 8, "epoch": 8 / 6}, None),
])
def test_a_schedule_with_nothing_left_is_refused(training, state, refused):
    """S5: resumed from checkpoint-8 (6 steps an epoch) with --num_train_epochs 1, the run exited 0 with train_loss
    0.0 and "steps 9-8", and saved checkpoint-8's weights over the 12-step model."""
    if refused is None:
        check_schedule_left("run/checkpoint-8", training, state)
    else:
        with pytest.raises(ValueError, match=refused + r".*checkpoint-8"):
            check_schedule_left("run/checkpoint-8", training, state)


def test_an_epoch_count_already_reached_is_refused_before_any_work(recorded_run, data_flags, tmp_path, monkeypatch):
    """S5 through the script: checkpoint-4 of 6 steps an epoch is at epoch 0.67; --num_train_epochs 0.5 ends at step
    3. Refused before the previous results are removed or the record is changed."""
    output_dir = resume_copy(recorded_run, tmp_path, step=4)
    before = {name: (output_dir / name).read_bytes() for name in ("run_record.json", "all_results.json")}
    with pytest.raises(ValueError, match=r"--num_train_epochs 0\.5 is not beyond .*checkpoint-4, which has trained "
                                         r"0\.6667 epochs \(step 4\): nothing would be trained"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "-1", "--num_train_epochs", "0.5",
            "--label_smoothing", "0.1", "--resume_from_checkpoint", output_dir / "checkpoint-4",
        ), monkeypatch)
    assert {name: (output_dir / name).read_bytes() for name in before} == before


def test_with_load_best_model_at_end_the_evaluations_that_choose_it_are_recorded(monkeypatch, tmp_path, data_flags):
    """The evaluations pick the final model among the checkpoints: another --eval_steps, validation file or beam
    size would pick another. Without --load_best_model_at_end they may change."""
    best = ["--load_best_model_at_end", "true", "--eval_strategy", "steps", "--save_strategy", "steps",
            "--eval_steps", "2", "--save_steps", "2", *data_flags]
    checkpoint = saved_run(tmp_path, record_of(monkeypatch, *best))
    validation = data_flags[data_flags.index("--validation_file") + 1]
    changed = [*best, "--validation_file", data_flags[data_flags.index("--test_file") + 1]]
    for flags, named in (([*best, "--eval_steps", "4", "--save_steps", "4"], r"eval_steps: 2 -> 4"),
                         ([*best, "--generation_num_beams", "3"], r"generation_num_beams: None -> 3"),
                         ([*best, "--length_penalty", "0.6"], r"length_penalty: 1\.0 -> 0\.6"),
                         (changed, rf"validation_file: '{re.escape(validation)}' -> ")):
        with pytest.raises(ValueError, match=rf"continues a run started with other settings .*{named}"):
            check_resume_record(str(checkpoint), tmp_path / "run", record_of(monkeypatch, *flags), [])
    plain = saved_run(tmp_path / "plain", record_of(monkeypatch, *data_flags))
    scored_otherwise = record_of(monkeypatch, *data_flags, "--eval_steps", "4", "--generation_num_beams", "3",
                                 "--validation_file", data_flags[data_flags.index("--test_file") + 1])
    assert check_resume_record(str(plain), tmp_path / "plain" / "run", scored_otherwise, []) == []
