"""--overwrite_output_dir deletes a previous run's outputs and nothing else (issue 34 §0, §5): never a folder holding
a live run's lock beneath it, never the config file the run was started from, never files no run of ours wrote."""

from __future__ import annotations

import fcntl
import os

import pytest
import yaml
from script_helpers import run_script, tiny_translation_flags
from testing_utils import bind_mounted, tiny_causal_config, tiny_seq2seq_config, tiny_tokenizer

from hf_tiednorm.training.run_directory import lock_path
from hf_tiednorm.training.run_outputs import check_inputs_kept, is_run_output


def test_overwrite_of_a_parent_folder_spares_a_live_run_beneath(data_flags, tmp_path, monkeypatch):
    """`--output_dir runs/nest --overwrite_output_dir` while a run trained in runs/nest/inner deleted its checkpoints,
    token counts and lock file."""
    nest = tmp_path / "nest"
    inner = nest / "inner"
    (inner / "checkpoint-1").mkdir(parents=True)
    (inner / "token_counts.pt").write_bytes(b"counts")
    (nest / "config.json").write_text("{}")  # a previous run's output in the parent
    lock = lock_path(inner)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the inner run, alive
    try:
        with pytest.raises(RuntimeError, match=r"another run is training beneath it \(live lock .*\.inner\.lock"):
            run_script("run_translation", tiny_translation_flags(
                data_flags, nest, "--overwrite_output_dir", "--do_train", "--max_steps", "1", "--save_strategy", "no",
            ), monkeypatch)
    finally:
        os.close(fd)
    assert (inner / "checkpoint-1").is_dir() and (inner / "token_counts.pt").is_file() and lock.is_file()
    assert (nest / "config.json").is_file()  # refused before anything was deleted


def test_overwrite_keeps_the_config_file_and_files_no_run_wrote(data_flags, tmp_path, monkeypatch):
    """`run_translation.py run.yaml --output_dir . --overwrite_output_dir` deleted run.yaml and every unrelated file;
    now only the previous run's outputs go (a folder no run of ours wrote stays too)."""
    folder = tmp_path / "here"
    folder.mkdir()
    flags = tiny_translation_flags(data_flags, ".", "--do_train", "--max_steps", "1", "--save_strategy", "no")
    monkeypatch.chdir(folder)
    run_script("run_translation", flags, monkeypatch)  # the previous run
    assert (folder / "config.json").is_file()
    config = {"max_steps": 1, "save_strategy": "no"}
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "my_data").mkdir()
    (folder / "my_data" / "extra.de").write_text("ein hund\n")
    (folder / "checkpoint-9").mkdir()  # a previous run's checkpoint: goes
    run_script("run_translation", ["run.yaml", *flags[:-4], "--overwrite_output_dir"], monkeypatch)
    assert (folder / "run.yaml").read_text() == yaml.safe_dump(config)
    assert (folder / "notes.txt").read_text() == "my notes\n"
    assert (folder / "my_data" / "extra.de").is_file()
    assert not (folder / "checkpoint-9").exists()
    assert (folder / "model.safetensors").is_file()


# --- issue 40 S1: no input of a run is deleted, however its path is spelled ---------------------------------------

def model_folder(folder):
    """A saved-model folder (a tiny config, weights and tokenizer files; the refusal comes before anything loads
    them)."""
    folder.mkdir(parents=True, exist_ok=True)
    tiny_seq2seq_config().save_pretrained(folder)
    for name in ("model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_text(name)
    return folder


def deleted_entries(output_dir):
    return [path for path in output_dir.resolve().iterdir() if is_run_output(path)]


@pytest.mark.parametrize("spelling", ["model", "model/", "./model", "../cwd/../cwd/model", "link", "link/",
                                      "model/config.json"])
def test_an_input_in_the_output_dir_is_refused_however_spelled(tmp_path, monkeypatch, spelling):
    """`--model_name_or_path X --output_dir X --overwrite_output_dir` deleted X's model before loading it; the check
    protected only inputs *beneath* a deleted entry, so the output folder being the model folder passed."""
    cwd = tmp_path / "cwd"
    model = model_folder(cwd / "model")
    (cwd / "link").symlink_to(model)
    monkeypatch.chdir(cwd)
    for output_dir in (model, cwd / "link"):  # --output_dir spelled either way too
        with pytest.raises(ValueError, match=rf"would delete .*model/.*, which --model_name_or_path {spelling} reads: "
                                             "nothing has been deleted"):
            check_inputs_kept(deleted_entries(output_dir), {"--model_name_or_path": spelling})


def test_an_input_beneath_or_through_a_deleted_entry_is_refused(tmp_path, monkeypatch):
    """A checkpoint of the old run given as the model, a link entry of the output folder given as the tokenizer, and
    a model folder whose weights are links into the output folder."""
    out = model_folder(tmp_path / "out")
    (out / "checkpoint-3").mkdir()
    (out / "checkpoint-3" / "config.json").write_text("{}")
    elsewhere = model_folder(tmp_path / "elsewhere")
    (out / "checkpoint-4").symlink_to(elsewhere)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "model.safetensors").symlink_to(out / "model.safetensors")
    monkeypatch.chdir(tmp_path)
    deleted = deleted_entries(out)
    for flag, value in (("--model_name_or_path", "out/checkpoint-3"), ("--tokenizer_name", "out/checkpoint-4/"),
                        ("--model_name_or_path", str(linked)), ("--train_file", "out/test_predictions.txt"),
                        ("the config file", "out/config.json"), ("--resume_from_checkpoint", "out/checkpoint-3")):
        (out / "test_predictions.txt").write_text("x\n")
        with pytest.raises(ValueError, match=rf"which {flag} {value} reads"):
            check_inputs_kept([*deleted, out.resolve() / "test_predictions.txt"], {flag: value})


def test_inputs_that_no_deletion_touches_pass(tmp_path, monkeypatch):
    """What the check must not refuse: a link's target (removing the link keeps it), a model folder holding the
    output folder (a nested fine-tune: runs/base/finetuned), data that no run of ours writes, and no input."""
    out = model_folder(tmp_path / "base" / "finetuned")
    elsewhere = model_folder(tmp_path / "elsewhere")
    (out / "checkpoint-4").symlink_to(elsewhere)
    (out / "train.de").write_text("ein hund\n")
    monkeypatch.chdir(tmp_path)
    check_inputs_kept(deleted_entries(out), {
        "--model_name_or_path": "base", "--tokenizer_name": str(elsewhere), "--train_file": "base/finetuned/train.de",
        "--validation_file": None,
    })


@pytest.mark.parametrize("flag", ["--model_name_or_path", "--tokenizer_name"])
def test_overwrite_in_place_keeps_the_model(tmp_path, monkeypatch, data_flags, flag):
    """The issue's reproduction: the script deleted X's model ("deleting the previous run's outputs"), then failed
    with "cannot load the tokenizer"."""
    model = tmp_path / "X"
    tiny_seq2seq_config().save_pretrained(model)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(model)
    (model / "model.safetensors").write_bytes(b"weights")
    before = {path.name: path.read_bytes() for path in model.iterdir()}
    monkeypatch.chdir(tmp_path)
    flags = tiny_translation_flags(data_flags, "X/", "--overwrite_output_dir", "--do_train", "--max_steps", "1")
    if flag == "--model_name_or_path":  # a saved model fixes its architecture flags
        flags = [*flags[:flags.index("--d_model")], *flags[flags.index("--dropout"):]]
    with pytest.raises(ValueError, match=rf"--overwrite_output_dir would delete .*X/.*, which {flag} X reads"):
        run_script("run_translation", [*flags, flag, "X"], monkeypatch)
    assert {path.name: path.read_bytes() for path in model.iterdir()} == before


def test_overwrite_in_place_keeps_the_causal_model(tmp_path, monkeypatch):
    """The same through run_clm.py (the check is the scripts' shared step)."""
    model = tmp_path / "X"
    tiny_causal_config().save_pretrained(model)
    (model / "model.safetensors").write_bytes(b"weights")
    before = {path.name: path.read_bytes() for path in model.iterdir()}
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"--overwrite_output_dir would delete .*X/.*, which --model_name_or_path "
                                         r"\./X reads"):
        run_script("run_clm", ["--output_dir", "X", "--overwrite_output_dir", "--do_train", "--max_steps", "1",
                               "--report_to", "none", "--block_size", "32", "--model_name_or_path", "./X"],
                   monkeypatch)
    assert {path.name: path.read_bytes() for path in model.iterdir()} == before


@pytest.mark.parametrize("simulate", [False, True], ids=["mount", "simulated"])
def test_an_output_dir_bind_mounted_on_the_model_folder_is_refused(tmp_path, monkeypatch, simulate):
    """Issue 48 (8): `--output_dir` a bind mount of the model folder with --overwrite_output_dir deleted the model:
    the check compared paths, and no spelling of the mount point names the model folder; device and inode do."""
    model = model_folder(tmp_path / "model")
    before = {path.name: path.read_bytes() for path in model.iterdir()}
    with bind_mounted(model, tmp_path / "mnt", monkeypatch, simulate=simulate):
        for flag, value in (("--model_name_or_path", str(model)), ("--tokenizer_name", str(model / "tokenizer.json")),
                            ("--resume_from_checkpoint", str(model))):
            with pytest.raises(ValueError, match=rf"would delete .*mnt/.*, which {flag} {value} reads: nothing"):
                check_inputs_kept(deleted_entries(tmp_path / "mnt"), {flag: value})
        other = model_folder(tmp_path / "other")  # another model folder passes
        check_inputs_kept(deleted_entries(tmp_path / "mnt"), {"--model_name_or_path": str(other)})
    assert {path.name: path.read_bytes() for path in model.iterdir()} == before


def test_overwrite_through_a_bind_mount_keeps_the_model(tmp_path, monkeypatch):
    """Issue 48 (8) end to end: run_clm.py with --output_dir a bind mount of its --model_name_or_path."""
    model = tmp_path / "X"
    tiny_causal_config().save_pretrained(model)
    (model / "model.safetensors").write_bytes(b"weights")
    before = {path.name: path.read_bytes() for path in model.iterdir()}
    monkeypatch.chdir(tmp_path)
    with bind_mounted(model, tmp_path / "mnt", monkeypatch) as how:
        with pytest.raises(ValueError, match=r"--overwrite_output_dir would delete .*mnt/.*, which "
                                             r"--model_name_or_path X reads"):
            run_script("run_clm", ["--output_dir", "mnt", "--overwrite_output_dir", "--do_train", "--max_steps", "1",
                                   "--report_to", "none", "--block_size", "32", "--model_name_or_path", "X"],
                       monkeypatch)
    assert {path.name: path.read_bytes() for path in model.iterdir()} == before, how
