"""What a trained model carries and what tiednorm-push stages (issue 34 §0, §5; issue 35 item 4): only our remote
code in auto_map, no local path of the machine, no token. Tiny data made in code."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from script_helpers import load_script, run_script, tiny_translation_flags

from hf_tiednorm.conversion.saved_code import foreign_auto_map
from hf_tiednorm.conversion.staging_checks import training_args_token
from hf_tiednorm.publishing import hub
from hf_tiednorm.publishing.model_card import render_model_card
from hf_tiednorm.publishing.provenance import base_model_provenance

EVIL = {"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"}


def with_foreign_auto_map(folder, tmp_path):
    copy = tmp_path / "evil_base"
    shutil.copytree(folder, copy)
    config = json.loads((copy / "config.json").read_text())
    config["auto_map"] = {**config["auto_map"], **EVIL}
    (copy / "config.json").write_text(json.dumps(config))
    return copy


def test_fine_tuning_drops_a_base_models_foreign_auto_map(finished_run, data_flags, tmp_path, monkeypatch):
    """A foreign auto_map entry of the base model survived fine-tuning into the final model and every checkpoint."""
    base = with_foreign_auto_map(finished_run, tmp_path)
    output_dir = tmp_path / "tuned"
    run_script("run_translation", [
        *data_flags, "--output_dir", output_dir, "--model_name_or_path", base, "--do_train", "--max_steps", "1",
        "--save_steps", "1", "--report_to", "none", "--num_threads", "1", "--bf16", "false",
        "--max_source_length", "32", "--max_target_length", "32",
    ], monkeypatch)
    for folder in (output_dir, output_dir / "checkpoint-1"):
        auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
        assert "AutoModelForCausalLM" not in auto_map and foreign_auto_map(auto_map) == {}
        assert auto_map["AutoModelForSeq2SeqLM"].startswith("modeling_tiednorm.")


def test_push_refuses_to_stage_a_foreign_auto_map(finished_run, tmp_path):
    base = with_foreign_auto_map(finished_run, tmp_path)
    with pytest.raises(ValueError, match=r"config\.json maps Auto classes to remote code .*attacker/repo--evil"):
        hub.push_to_hub(base, "me/model", dry_run_dir=tmp_path / "staged")
    assert not (tmp_path / "staged").exists()


def fine_tune(base, data_flags, output_dir, monkeypatch, *extra) -> dict:
    return run_script("run_translation", [
        *data_flags, "--output_dir", output_dir, "--model_name_or_path", base, "--do_train", "--max_steps", "1",
        "--report_to", "none", "--num_threads", "1", "--bf16", "false", "--max_source_length", "32",
        "--max_target_length", "32", *extra,
    ], monkeypatch)


def machine_paths(folder):
    """Absolute paths of this machine in any staged file (binary ones included, as bytes)."""
    roots = {str(folder.resolve().parents[len(folder.resolve().parents) - 2]), str(Path.home())}
    hits = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            hits += [f"{path.name}: {root}" for root in roots if f"{root}/".encode() in data]
    return hits


def test_fine_tuned_card_and_staged_files_name_no_local_path(finished_run, data_flags, tmp_path, monkeypatch):
    """Fine-tuning from an absolute --model_name_or_path wrote `base_model: /abs/path` and "Fine-tuned from `/abs/…`"
    into the card, and tiednorm-push --dry-run staged it."""
    output_dir = tmp_path / "tuned"
    fine_tune(finished_run, data_flags, output_dir, monkeypatch, "--save_strategy", "no")
    card = ModelCard.load(output_dir / "README.md")
    assert card.data.base_model is None and "Fine-tuned from a local model" in card.text
    assert str(finished_run) not in card.text
    assert card.data.license == "unknown"  # the base model's card states none: never a default (issue 43)
    staged = hub.push_to_hub(output_dir, "me/tuned", dry_run_dir=tmp_path / "staged")
    assert machine_paths(staged) == []


def test_a_base_models_hub_id_and_license_are_published(finished_run, tmp_path):
    """A local snapshot of a Hub model (the cache layout) is published by its id, with its card's license."""
    snapshot = tmp_path / "hub" / "models--someone--tiny-base" / "snapshots" / "abc123"
    shutil.copytree(finished_run, snapshot)
    (snapshot / "README.md").write_text("---\nlicense: mit\n---\n# tiny-base\n")
    assert base_model_provenance(snapshot) == ("someone/tiny-base", "mit")
    card = render_model_card(finished_run, base_model=str(snapshot))
    assert (card.data.base_model, card.data.license) == ("someone/tiny-base", "mit")
    assert "Fine-tuned from `someone/tiny-base`" in card.text and str(tmp_path) not in card.text
    assert render_model_card(finished_run).data.license == "unknown"  # nobody stated one: never a default (issue 43)
    (snapshot / "README.md").unlink()
    assert render_model_card(finished_run, base_model=str(snapshot)).data.license == "unknown"  # not claimed


def test_push_rewrites_an_old_cards_local_base_model(finished_run, tmp_path):
    folder = tmp_path / "old"
    shutil.copytree(finished_run, folder)
    card = ModelCard.load(folder / "README.md")
    card.data.base_model = str(tmp_path / "somewhere")
    card.text += f"\nFine-tuned from `{tmp_path / 'somewhere'}`.\n"
    card.save(folder / "README.md")
    staged = hub.push_to_hub(folder, "me/old", dry_run_dir=tmp_path / "staged")
    assert machine_paths(staged) == []
    assert "Fine-tuned from a local model" in (staged / "README.md").read_text()


def test_hub_token_is_never_saved_and_a_token_folder_is_not_staged(finished_run, data_flags, tmp_path, monkeypatch):
    """--hub_token was pickled in clear into training_args.bin of every checkpoint and the final folder."""
    monkeypatch.delenv("HF_TOKEN", raising=False)
    output_dir = tmp_path / "tuned"
    environ = fine_tune(finished_run, data_flags, output_dir, monkeypatch, "--save_steps", "1", "--hub_token",
                        "hf_SECRETTOKEN")
    assert environ["HF_TOKEN"] == "hf_SECRETTOKEN"  # where the Trainer's push finds it (undone after the run)
    for path in (output_dir / "training_args.bin", output_dir / "checkpoint-1" / "training_args.bin"):
        assert b"hf_SECRETTOKEN" not in path.read_bytes() and not training_args_token(path)
    args = torch.load(output_dir / "training_args.bin", weights_only=False)
    args.hub_token = "hf_SECRETTOKEN"  # a folder written before the fix
    torch.save(args, output_dir / "training_args.bin")
    assert training_args_token(output_dir / "training_args.bin")
    with pytest.raises(ValueError, match=r"training_args\.bin holds a Hub token"):
        hub.push_to_hub(output_dir, "me/tuned", dry_run_dir=tmp_path / "staged")
    assert not (tmp_path / "staged").exists()


def test_push_names_a_corrupt_tokenizer_and_leaves_no_half_staged_folder(finished_run, tmp_path):
    """A corrupt tokenizer.json: bare JSONDecodeError and a half-written staging folder ("not empty" on rerun)."""
    folder = tmp_path / "corrupt"
    shutil.copytree(finished_run, folder)
    (folder / "tokenizer.json").write_text('{"version": "1.0", "model": {')
    staged = tmp_path / "staged"
    with pytest.raises(ValueError, match=r"corrupt/tokenizer\.json is not valid JSON"):
        hub.push_to_hub(folder, "me/corrupt", dry_run_dir=staged)
    assert not staged.exists() and not list(tmp_path.glob(".staged*"))
    shutil.copy2(finished_run / "tokenizer.json", folder / "tokenizer.json")
    assert (hub.push_to_hub(folder, "me/corrupt", dry_run_dir=staged) / "config.json").is_file()


def test_corrupt_or_planted_token_counts_keep_the_model_and_card(data_flags, tmp_path, monkeypatch, caplog):
    """token_counts.pt was loaded without weights_only (a planted pickle ran code under
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1) and a corrupt one killed the run after training with a bare error."""
    marker = tmp_path / "pwned"

    class Planted:
        def __reduce__(self):
            return (Path.touch, (marker,))

    module = load_script("run_translation")
    save_counts = module.steps.save_token_counts_and_init

    def plant(model, dataset, columns, model_args, training_args):
        save_counts(model, dataset, columns, model_args, training_args)
        torch.save(Planted(), Path(training_args.output_dir) / "token_counts.pt")

    monkeypatch.setattr(module.steps, "save_token_counts_and_init", plant)
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    output_dir = tmp_path / "run"
    with caplog.at_level("WARNING"):
        run_script("run_translation", tiny_translation_flags(
            data_flags, output_dir, "--do_train", "--max_steps", "1", "--save_strategy", "no",
        ), monkeypatch)
    assert not marker.exists()
    assert "token_counts.pt" in caplog.text and "without token frequencies" in caplog.text
    assert (output_dir / "model.safetensors").is_file() and (output_dir / "README.md").is_file()
