"""Issue 58, cases 5 and 6: a card names what was converted, never its parent as the base; an ``other`` license's
name and link can be stated on the command line; a model nobody gave a license is ``unknown``, never a default.

Case 5: a GGUF file whose metadata names its model by ``general.name`` only and its parent by
``general.base_model.0.repo_url`` (SmolLM2-135M-Instruct's own file names ``HuggingFaceTB/SmolLM2-135M`` there) was
recorded as ``base_model: HuggingFaceTB/SmolLM2-135M`` on every card: the parent, not the model converted.
Case 6: ``tiednorm-card`` and ``tiednorm-push`` took no ``--license-name`` / ``--license-link``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from testing_utils import tiny_tokenizer
from tiny_architectures import source_model

from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.conversion.source_provenance import gguf_provenance, record_provenance
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.publishing import hub, model_card

PARENT = "HuggingFaceTB/SmolLM2-135M"
INSTRUCT = "HuggingFaceTB/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _gguf(path: Path, **strings: str) -> Path:
    """A GGUF file holding ``strings`` as metadata (``general__name`` is ``general.name``), a Q4_1 file type and one
    tensor: what ``gguf_provenance`` reads."""
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in strings.items():
        writer.add_string(key.replace("__", "."), value)
    if any(key.startswith("general__base_model__") for key in strings):
        writer.add_uint32("general.base_model.count", 1)
    writer.add_uint32("general.file_type", int(gguf.LlamaFileType.MOSTLY_Q4_1))
    writer.add_tensor("t", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


# SmolLM2-135M-Instruct's file: its own name, its parent's repository, no repository of its own.
INSTRUCT_METADATA = {"general__name": "SmolLM2 135M Instruct", "general__license": "apache-2.0",
                     "general__base_model__0__name": "SmolLM2 135M",
                     "general__base_model__0__repo_url": f"https://huggingface.co/{PARENT}"}  # fmt: skip


def test_a_gguf_of_a_fine_tune_records_the_model_converted_and_its_parent_apart(tmp_path):
    found = gguf_provenance(_gguf(tmp_path / GGUF_NAME, **INSTRUCT_METADATA))
    # bcb37a5: {"base_model": "HuggingFaceTB/SmolLM2-135M", ...}: the parent recorded as the model converted
    assert found["base_model"] is None
    assert (found["name"], found["gguf_file"], found["quantization"]) == ("SmolLM2 135M Instruct", GGUF_NAME, "Q4_1")
    assert found["parent_models"] == [PARENT]
    # a file that names its own repository too: that is the base model, the parent stays the parent
    own = gguf_provenance(_gguf(tmp_path / "own.gguf", **INSTRUCT_METADATA,
                                general__repo_url=f"https://huggingface.co/{INSTRUCT}"))  # fmt: skip
    assert (own["base_model"], own["parent_models"]) == (INSTRUCT, [PARENT])


@pytest.fixture
def converted_from_the_gguf(tmp_path) -> Path:
    """A conversion whose config records what ``tiednorm-convert`` records for the Instruct GGUF file."""
    model = normalize_tied_head(source_model("llama"), "cosine", lossless_start=True)
    record_provenance(model, gguf_provenance(_gguf(tmp_path / GGUF_NAME, **INSTRUCT_METADATA)))
    folder = tmp_path / "converted"
    model.save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def test_no_card_names_the_parent_as_the_base_model(converted_from_the_gguf, tmp_path):
    folder = converted_from_the_gguf
    model_card.main([str(folder)])
    cards = {"tiednorm-card": ModelCard.load(folder / "README.md")}
    cards["tiednorm-push"] = ModelCard.load(hub.push_to_hub(folder, "u/c", dry_run_dir=tmp_path / "s") / "README.md")
    export_plain(folder, tmp_path / "plain")
    cards["export"] = ModelCard.load(tmp_path / "plain" / "README.md")
    named = (f"SmolLM2 135M Instruct (no Hub id recorded), its weights dequantized from the Q4_1 GGUF file "
             f"`{GGUF_NAME}` (the quantization's rounding is in them); the source names `{PARENT}` as its parent model")
    for what, card in cards.items():
        assert card.data.base_model is None, what  # bcb37a5: base_model: HuggingFaceTB/SmolLM2-135M
        assert f"Based on {named}." in card.text, what
        assert card.data.license == "apache-2.0", what


# --- case 6: the license's name and link on the command line; no default license ---------------------------------


@pytest.fixture
def converted(tmp_path) -> Path:
    folder = tmp_path / "converted"
    normalize_tied_head(source_model("llama"), "cosine").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def test_card_and_push_state_an_other_licenses_name_and_link(converted, tmp_path):
    stated = ["--license", "other", "--license-name", "tiny-license", "--license-link", "LICENSE.md"]
    model_card.main([str(converted), *stated])  # bcb37a5: "unrecognized arguments: --license-name"
    rendered = ModelCard.load(converted / "README.md")
    hub.main([str(converted), "u/c", "--dry-run", str(tmp_path / "s"), *stated])
    hub.main([str(converted), "u/c", "--dry-run", str(tmp_path / "p"), "--plain", *stated])
    plain = ModelCard.load(tmp_path / "p" / "README.md")  # the export's card states the license in its front matter
    for card in (rendered, ModelCard.load(tmp_path / "s" / "README.md"), plain):
        assert (card.data.license, card.data.license_name, card.data.license_link) == (
            "other", "tiny-license", "LICENSE.md")
        assert card is plain or "License: `other` (tiny-license, LICENSE.md)." in card.text
    # the kept card (no card input given) with another license: the other license's name and link go with it
    (tmp_path / "kept").mkdir()
    for path in converted.iterdir():
        (tmp_path / "kept" / path.name).write_bytes(path.read_bytes())
    hub.main([str(tmp_path / "kept"), "u/c", "--dry-run", str(tmp_path / "m"), "--license", "mit"])
    kept = ModelCard.load(tmp_path / "m" / "README.md")
    assert (kept.data.license, kept.data.license_name, kept.data.license_link) == ("mit", None, None)
    assert "License: `mit`." in kept.text


@pytest.mark.parametrize("tool", ["tiednorm-card", "tiednorm-push"])
def test_a_license_name_beside_another_license_is_refused_by_flag(converted, tool, tmp_path):
    given = ["--license", "mit", "--license-name", "tiny-license"]
    with pytest.raises(ValueError, match=r"--license-name describe a license the Hub does not list \(license: other\), "
                                         r"but the card's license is 'mit': pass --license other"):
        if tool == "tiednorm-card":
            model_card.main([str(converted), *given])
        else:
            hub.main([str(converted), "u/c", "--dry-run", str(tmp_path / "s"), *given])
    assert not (tmp_path / "s").exists()


def test_a_model_trained_from_scratch_gets_no_license_claim(tmp_path):
    """docs/publishing.md states the rule (docs/run_safety.md said apache-2.0): a model nobody gave a license is
    ``unknown``, with the way to state one."""
    from testing_utils import tiny_model

    tiny_model("causal").save_pretrained(tmp_path)
    card = model_card.render_model_card(tmp_path)
    assert card.data.license == "unknown" and "apache" not in str(card).lower()
    assert "pass `--license` to tiednorm-convert, tiednorm-card or tiednorm-push" in card.text
