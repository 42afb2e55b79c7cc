"""Issue 51, items 3, 4 and 6, and issue 48, cases 6 and 7: every card write keeps what the run knows — the scored
subset and its split name, the source and the GGUF quantization its weights came from, an ``other`` license's name
and link —; runtimes and step numbers are never metrics; a local training path is no base model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from script_helpers import run_script, write_tiny_parallel
from testing_utils import tiny_tokenizer
from tiny_architectures import source_model
from transformers import AutoModelForCausalLM

from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.conversion.source_provenance import folder_provenance, gguf_provenance
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.convert import main as convert_main
from hf_tiednorm.publishing import hub, model_card

# What the converted source records, as a Q4_1 GGUF's conversion does (general.name, no Hub id, its file type).
GGUF_PROVENANCE = {"base_model": None, "license": "apache-2.0", "name": "Smollm2 135M", "quantization": "Q4_1"}
SOURCE = "Smollm2 135M (no Hub id recorded), its weights dequantized from a Q4_1 GGUF file"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A fine-tune of a converted source scored on the first 6 of 12 rows of its validation and test files."""
    root = tmp_path_factory.mktemp("run")
    source_model("qwen3").save_pretrained(root / "source")
    tiny_tokenizer().save_pretrained(root / "source")
    convert_checkpoint(root / "source", root / "converted", head_mode="cosine", lossless_start=True)
    config = json.loads((root / "converted" / "config.json").read_text())
    (root / "converted" / "config.json").write_text(json.dumps({**config, "provenance": GGUF_PROVENANCE}))
    (root / "data").mkdir()
    write_tiny_parallel(root / "data", n_eval=12)
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_clm", [
            "--model_name_or_path", root / "converted", "--output_dir", root / "out", "--train_file",
            root / "data/train.en", "--validation_file", root / "data/val.en", "--test_file", root / "data/test.en",
            "--block_size", "8", "--max_eval_samples", "6", "--max_steps", "2", "--per_device_train_batch_size", "4",
            "--do_train", "--do_eval", "--report_to", "none", "--num_threads", "1", "--bf16", "false",
            "--save_strategy", "no",
        ], monkeypatch)  # fmt: skip
    finally:
        monkeypatch.undo()
    return root


def _evaluation(card: ModelCard) -> str:
    return card.text.split("## Evaluation")[1].split("##")[0]


def test_every_card_write_keeps_the_subset_the_split_and_the_source(run, tmp_path):
    out = run / "out"
    cards = {"run": ModelCard.load(out / "README.md")}
    # docs/publishing.md's re-render, then tiednorm-push --metrics, then the plain export
    model_card.main([str(out), "--dataset", "d/x", "--metrics", str(out / "test_results.json"),
                     "--training", str(out / "train_results.json")])  # fmt: skip
    cards["tiednorm-card --metrics"] = ModelCard.load(out / "README.md")
    hub.main([str(out), "u/x", "--dry-run", str(tmp_path / "pushed"), "--dataset", "d/x", "--metrics",
              str(out / "all_results.json")])  # fmt: skip
    cards["tiednorm-push --metrics"] = ModelCard.load(tmp_path / "pushed" / "README.md")
    export_plain(out, tmp_path / "plain")
    cards["export"] = ModelCard.load(tmp_path / "plain" / "README.md")
    for what, card in cards.items():
        splits = {result.dataset_split for result in card.data.eval_results}
        assert "test[:6]" in splits and "test" not in splits, what  # 7bdafef: split: test after a re-render
        assert SOURCE in card.text, what  # 7bdafef: "a local model", "Based on Smollm2 ...", nothing (export)
        assert f"Fine-tuned from {SOURCE}" in card.text, what
        if what != "export":
            assert "Scored on a subset only: the first 6 of 12 rows of the test split" in card.text, what
            evaluation = _evaluation(card)
            assert "minutes" not in evaluation and "runtime" not in evaluation, what  # 7bdafef: train_minutes
            assert "_first_step" not in card.text and "_rows_" not in card.text, what  # 7bdafef: | ..._first_step | 1
        assert all(r.metric_type in ("perplexity", "sacrebleu") for r in card.data.eval_results), what
    saved = json.loads((out / "test_results.json").read_text())
    assert (saved["test_rows_scored"], saved["test_rows_in_split"]) == (6, 12)


def _folder_with_card(folder: Path, front_matter: str, name_or_path: str | None = None) -> Path:
    source_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    (folder / "README.md").write_text(f"---\n{front_matter}---\n# a model\n")
    if name_or_path is not None:
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "_name_or_path": name_or_path}))
    return folder


def test_a_local_training_path_is_no_base_model(tmp_path, monkeypatch):
    # issue 48 case 6, 7bdafef: base_model: outputs/checkpoint-500 (a Hub id's form, a training folder's meaning)
    source = _folder_with_card(tmp_path / "src", "license: mit\n", name_or_path="outputs/checkpoint-500")
    assert folder_provenance(source)["base_model"] is None
    model = AutoModelForCausalLM.from_pretrained(source)
    model.name_or_path = "outputs/checkpoint-500"
    assert normalize_tied_head(model, "cosine").config.provenance["base_model"] is None
    convert_main([str(source), str(tmp_path / "c"), "--head-mode", "cosine"])
    card = ModelCard.load(hub.push_to_hub(tmp_path / "c", "u/c", dry_run_dir=tmp_path / "s") / "README.md")
    assert card.data.base_model is None and "checkpoint-500" not in card.text
    # a name this machine downloaded from the Hub (its cache holds it) is a base model
    cache = tmp_path / "hub"
    snapshot = cache / "models--owner--tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (cache / "models--owner--tiny" / "refs").mkdir()
    (cache / "models--owner--tiny" / "refs" / "main").write_text("abc")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(cache))
    downloaded = _folder_with_card(tmp_path / "copy", "license: mit\n", name_or_path="owner/tiny")
    assert folder_provenance(downloaded)["base_model"] == "owner/tiny"


def test_an_other_license_keeps_its_name_and_link_on_every_card(tmp_path):
    # issue 48 case 7, 7bdafef: "license: other" and nothing else on every card
    front = "license: other\nlicense_name: tiny-license\nlicense_link: https://example.com/LICENSE\n"
    source = _folder_with_card(tmp_path / "src", front)
    convert_main([str(source), str(tmp_path / "c"), "--head-mode", "cosine", "--lossless-start"])
    recorded = AutoModelForCausalLM.from_pretrained(tmp_path / "c").config.provenance
    assert (recorded["license_name"], recorded["license_link"]) == ("tiny-license", "https://example.com/LICENSE")
    model_card.main([str(tmp_path / "c")])
    pushed = hub.push_to_hub(tmp_path / "c", "u/c", dry_run_dir=tmp_path / "s", plain=True)
    for card in (ModelCard.load(tmp_path / "c" / "README.md"), ModelCard.load(pushed / "README.md")):
        assert (card.data.license, card.data.license_name, card.data.license_link) == (
            "other", "tiny-license", "https://example.com/LICENSE")
    assert "License: `other` (tiny-license, https://example.com/LICENSE)." in (tmp_path / "c" / "README.md").read_text()


def _gguf(path: Path, **strings) -> Path:
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in strings.items():
        writer.add_string(key.replace("__", "."), value)
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_1))
    writer.add_tensor("t", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_a_gguf_records_its_quantization_and_an_other_licenses_name_and_link(tmp_path):
    found = gguf_provenance(_gguf(tmp_path / "m.gguf", general__name="Tiny", general__license="other",
                                  general__license__name="tiny-license",
                                  general__license__link="https://example.com/LICENSE"))  # fmt: skip
    assert found == {"base_model": None, "license": "other", "name": "Tiny", "license_name": "tiny-license",
                     "license_link": "https://example.com/LICENSE", "gguf_file": "m.gguf",
                     "quantization": "Q4_1"}  # fmt: skip
    # a license stated in words, not as an id: recorded as `other` named by those words
    worded = gguf_provenance(_gguf(tmp_path / "w.gguf", general__license="Apache License 2.0"))
    assert (worded["license"], worded["license_name"]) == ("other", "Apache License 2.0")


def test_a_license_flag_that_is_no_license_id_is_refused_by_name(tmp_path):
    # issue 48, "decide and document": 7bdafef stored --license "Apache License 2.0" as is (no Hub license id)
    source = _folder_with_card(tmp_path / "src", "license: mit\n")
    with pytest.raises(ValueError, match="--license 'Apache License 2.0' is not a license id: give the Hub's id"):
        convert_main([str(source), str(tmp_path / "c"), "--head-mode", "cosine", "--license", "Apache License 2.0"])
    convert_main([str(source), str(tmp_path / "c"), "--head-mode", "cosine"])
    with pytest.raises(ValueError, match="--license 'Apache License 2.0' is not a license id"):
        model_card.main([str(tmp_path / "c"), "--license", "Apache License 2.0"])
