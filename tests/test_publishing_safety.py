"""What a trained model carries and what tiednorm-push stages (issue 34 §0, §5; issue 35 item 4): only our remote
code in auto_map, no local path of the machine, no token. Tiny data made in code."""

from __future__ import annotations

import json
import shutil

import pytest
from script_helpers import run_script, tiny_translation_flags

from hf_tiednorm.publishing import hub
from hf_tiednorm.publishing.auto_map import foreign_auto_map

EVIL = {"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"}


@pytest.fixture(scope="module")
def base_run(data_flags, tmp_path_factory):
    """A finished tiny translation run (the base model of the fine-tuning tests)."""
    output_dir = tmp_path_factory.mktemp("base")
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "1", "--save_strategy", "no",
        ), monkeypatch)
    finally:
        monkeypatch.undo()
    return output_dir


def with_foreign_auto_map(folder, tmp_path):
    copy = tmp_path / "evil_base"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"] = {**config["auto_map"], **EVIL}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_fine_tuning_drops_a_base_models_foreign_auto_map(base_run, data_flags, tmp_path, monkeypatch):
    """A foreign auto_map entry of the base model survived fine-tuning into the final model and every checkpoint."""
    base = with_foreign_auto_map(base_run, tmp_path)
    output_dir = tmp_path / "tuned"
    run_script("run_translation", [
        *data_flags, "--output_dir", output_dir, "--model_name_or_path", base, "--do_train", "--max_steps", "1",
        "--save_steps", "1", "--report_to", "none", "--num_threads", "1", "--bf16", "false",
        "--max_source_length", "32", "--max_target_length", "32",
    ], monkeypatch)
    for folder in (output_dir, output_dir / "checkpoint-1"):
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert "AutoModelForCausalLM" not in auto_map and foreign_auto_map(auto_map) == {}
        assert auto_map["AutoModelForSeq2SeqLM"].startswith("modeling_tiednorm_seq2seq.")


def test_push_refuses_to_stage_a_foreign_auto_map(base_run, tmp_path):
    base = with_foreign_auto_map(base_run, tmp_path)
    with pytest.raises(ValueError, match=r"config\.json maps Auto classes to remote code .*attacker/repo--evil"):
        hub.push_to_hub(base, "me/model", dry_run_dir=tmp_path / "staged")
    assert not (tmp_path / "staged").exists()
