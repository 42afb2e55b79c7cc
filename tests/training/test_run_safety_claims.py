"""Every guarantee of docs/run_safety.md names the tests that check it (issue 40), and those tests exist; the
guarantees that had none get theirs here. No training run: the checks are called directly."""

from __future__ import annotations

import ast
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from safetensors.torch import save_file
from script_helpers import load_script
from testing_utils import tiny_seq2seq_config

from hf_tiednorm.training import steps
from hf_tiednorm.training.arguments import parse_arguments
from hf_tiednorm.training.run_record import check_resume_record

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "run_safety.md"


def doc_rows() -> list[tuple[str, list[str]]]:
    """(the guarantee's first words, the tests it names) for every table row of docs/run_safety.md."""
    rows = []
    for line in DOC.read_text().splitlines():
        if not line.startswith("| ") or line.startswith("| Guarantee"):
            continue
        cells = [cell.strip() for cell in line.strip("|").split(" | ")]
        rows.append((cells[0][:60], re.findall(r"`(test_\w+\.py)::(test_\w+)`", cells[-1]) if len(cells) == 3 else []))
    return rows


def test_every_guarantee_names_tests_that_exist():
    rows = doc_rows()
    assert len(rows) > 60
    unbacked = [guarantee for guarantee, tests in rows if not tests]
    assert not unbacked, f"guarantees of {DOC.name} that name no test: {unbacked}"
    defined: dict[str, set[str]] = {}
    missing = []
    for guarantee, tests in rows:
        for file, name in tests:
            if file not in defined:
                paths = list((REPO / "tests").rglob(file))  # tests/ mirrors the package: the file is in a sub-folder
                tree = ast.parse(paths[0].read_text()) if len(paths) == 1 else ast.Module(body=[], type_ignores=[])
                defined[file] = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
            if name not in defined[file]:
                missing.append(f"{file}::{name} ({guarantee})")
    assert not missing, f"{DOC.name} names tests that do not exist: {missing}"


def test_a_config_file_with_a_byte_order_mark_is_read(tmp_path, monkeypatch):
    """A YAML/JSON config saved by an editor that writes a UTF-8 byte-order mark."""
    module = load_script("run_clm")
    classes = (module.ModelArguments, module.DataArguments, module.RunArguments, module.OutputDirArguments,
               module.TiedNormTrainingArguments)
    for name, text in (("run.yaml", yaml.safe_dump({"output_dir": "out", "seed": 7})),
                       ("run.json", json.dumps({"output_dir": "out", "seed": 7}))):
        (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text.encode())
        monkeypatch.setattr(sys, "argv", ["run_clm.py", str(tmp_path / name), "--report_to", "none"])
        assert parse_arguments(classes)[-1].seed == 7


def late_flags(**training):
    args = {"do_eval": False, "do_predict": False, "eval_strategy": "no", "generation_num_beams": None,
            "generation_max_length": None, **training}
    return SimpleNamespace(**args)


def test_generation_max_length_below_one_is_refused_at_start():
    data = SimpleNamespace(validation_file="v", test_file="t")
    with pytest.raises(ValueError, match=r"--generation_max_length 0 must be at least 1 \(checked before training"):
        steps.check_late_flags(late_flags(generation_max_length=0), data)


@pytest.mark.parametrize(("training", "files", "message"), [
    ({"do_eval": True}, {"validation_file": None, "test_file": "t"},
     r"--do_eval scores the validation split, but no such file is given \(--validation_file\)"),
    ({"eval_strategy": "steps"}, {"validation_file": None, "test_file": "t"},
     r"--eval_strategy steps evaluates during training on the validation split, but --validation_file is none"),
    ({"do_predict": True}, {"validation_file": "v", "test_file": None},
     r"--do_predict scores the test split, but --test_file is none"),
])
def test_scoring_without_the_file_it_reads_is_refused(training, files, message):
    with pytest.raises(ValueError, match=message):
        steps.check_late_flags(late_flags(**training), SimpleNamespace(**files))


def test_scoring_a_finished_run_refuses_another_architecture(tmp_path, monkeypatch):
    """--do_predict in a finished run folder scores its model; an architecture flag may be repeated, not changed."""
    folder = tmp_path / "run"
    tiny_seq2seq_config().save_pretrained(folder)  # head_mode cosine
    save_file({}, folder / "model.safetensors")
    module = load_script("run_translation")
    classes = (module.ModelArguments, module.DataArguments, module.RunArguments, module.OutputDirArguments,
               module.TiedNormSeq2SeqTrainingArguments)
    for head_mode, refused in (("l2", True), ("cosine", False)):
        monkeypatch.setattr(sys, "argv", ["run_translation.py", "--output_dir", str(folder), "--do_predict",
                                          "--report_to", "none", "--head_mode", head_mode])
        model_args, _, _, _, training_args = parse_arguments(classes)
        if refused:
            with pytest.raises(ValueError, match=rf"--head_mode l2 differs from the trained model in {folder} "
                                                 r"\(head_mode='cosine'\)"):
                steps.score_finished_run(model_args, training_args)
        else:
            steps.score_finished_run(model_args, training_args)
            assert model_args.model_name_or_path == str(folder) and "scored-" in training_args.output_dir


def test_a_run_folder_without_a_record_resumes_with_a_warning(tmp_path, caplog):
    """A run started before records existed: nothing to compare, said so."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text('{"global_step": 2, "epoch": 0.5}')
    record = {"data": {}, "model": {}, "training": {"max_steps": 4}}
    with caplog.at_level("WARNING"):
        assert check_resume_record(str(checkpoint), tmp_path / "run", record, []) == []
    assert "its run folder has no run_record.json, so this resume cannot be checked" in caplog.text
