"""Nothing silent (issue 24): inputs that would change the task without a word, or fail with a traceback that names
nothing, stop with the file, row, flag or tensor named. Tiny files and models made in each test."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from testing_utils import FAMILIES, TINY_VOCAB, tiny_model, tiny_tokenizer
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, pipeline

from hf_tiednorm.publishing import hub, model_card
from hf_tiednorm.publishing.model_card import write_model_card
from hf_tiednorm.training.data import load_monolingual, load_parallel


def write_pair(folder, source: str | bytes, target: str | bytes, name: str = "train", suffix: str = "") -> str:
    for lang, text in (("de", source), ("en", target)):
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        (folder / f"{name}.{lang}{suffix}").write_bytes(data)
    return str(folder / f"{name}.{{lang}}{suffix}")


# Data files -----------------------------------------------------------------------------------------------------------


def test_byte_order_mark_is_stripped_and_logged(tmp_path, caplog):
    """A BOM became part of sentence 1 (and a vocabulary token)."""
    pattern = write_pair(tmp_path, "\ufeffein hund\nzwei\n", "a dog\ntwo\n")
    with caplog.at_level(logging.WARNING, logger="hf_tiednorm.training.data"):
        pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert pairs["de"] == ["ein hund", "zwei"]
    assert "train.de starts with a UTF-8 byte-order mark: stripped" in caplog.text
    (tmp_path / "mono.txt").write_bytes("\ufeffline one\nline two\n".encode())
    assert load_monolingual({"train": str(tmp_path / "mono.txt")})["train"]["text"][0] == "line one"


def test_target_file_linked_to_the_source_file_is_refused(tmp_path):
    (tmp_path / "train.de").write_text("ein hund\nzwei\n")
    os.symlink(tmp_path / "train.de", tmp_path / "train.en")
    with pytest.raises(ValueError, match=r"source file .*train\.de and target file .*train\.en are the same file"):
        load_parallel({"train": str(tmp_path / "train.{lang}")}, "de", "en")


def test_target_file_with_the_source_lines_is_refused(tmp_path):
    pattern = write_pair(tmp_path, "ein hund\nzwei\n", "ein hund\nzwei\n")
    with pytest.raises(ValueError, match=r"train\.de and target file .*train\.en hold the same lines"):
        load_parallel({"train": pattern}, "de", "en")
    (tmp_path / "same.jsonl").write_text('{"de": "x", "en": "x"}\n{"de": "y", "en": "y"}\n')
    with pytest.raises(ValueError, match=r"same\.jsonl: the 'de' and 'en' columns hold the same text"):
        load_parallel({"train": str(tmp_path / "same.jsonl")}, "de", "en")


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncated", r"train\.de\.gz is truncated \(EOFError"),
        ("corrupt", r"train\.de\.gz is not a valid gzip file \(BadGzipFile: CRC check failed"),
        ("not_gzip", r"train\.de\.gz is not a valid gzip file \(BadGzipFile: Not a gzipped file"),
    ],
)
def test_damaged_gzip_file_is_named(tmp_path, damage, message):
    packed = gzip.compress("ein hund läuft im park .\n".encode() * 200)
    source = {
        "truncated": packed[: len(packed) // 2],
        "corrupt": packed[:-8] + b"\0\0\0\0" + packed[-4:],  # a wrong CRC32
        "not_gzip": b"ein hund\n",
    }[damage]
    pattern = write_pair(tmp_path, source, gzip.compress(b"a dog\n" * 200), suffix=".gz")
    with pytest.raises(ValueError, match=message):
        load_parallel({"train": pattern}, "de", "en")


@pytest.mark.parametrize(
    "row, what",
    [('{"en": "c"}', "missing or null"), ('{"de": null, "en": "c"}', "missing or null"),
     ('{"de": 5, "en": "c"}', "of type int")],
)
def test_bad_language_field_names_file_and_row(tmp_path, row, what):
    """A missing/null/non-string field passed as None/5 into tokenizer training (TypeError naming nothing)."""
    path = tmp_path / "train.jsonl"
    path.write_text('{"de": "a", "en": "b"}\n' + row + "\n")
    with pytest.raises(ValueError, match=rf"train\.jsonl, row 2: the 'de' field is {what}"):
        load_parallel({"train": str(path)}, "de", "en")
    mono = tmp_path / "mono.jsonl"
    mono.write_text('{"text": "a"}\n{"text": null}\n')
    with pytest.raises(ValueError, match=r"mono\.jsonl, row 2: the 'text' field is missing or null"):
        load_monolingual({"train": str(mono)})


def test_translation_column_without_a_language_names_file_and_row(tmp_path):
    path = tmp_path / "train.jsonl"
    rows = [{"translation": {"de": "a", "en": "b"}}, {"translation": {"de": "c"}}]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    with pytest.raises(ValueError, match=r"train\.jsonl, row 2: its 'translation' has no 'en' text \(\['de'\]\)"):
        load_parallel({"train": str(path)}, "de", "en")


def test_pattern_with_another_placeholder_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"pattern '.*\{split\}\.\{lang\}' holds the placeholder\(s\) \{split\}"):
        load_parallel({"train": str(tmp_path / "{split}.{lang}")}, "de", "en")


# Models ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_token_id_outside_the_vocabulary_is_named(family):
    """`IndexError: index out of range in self` named neither the id nor the vocabulary size."""
    model = tiny_model(family)
    ids = torch.tensor([[5, 6, TINY_VOCAB + 3]])
    message = rf"token id {TINY_VOCAB + 3} \(at position \(0, 2\).*outside the vocabulary of {TINY_VOCAB} tokens"
    with pytest.raises(IndexError, match=message):
        model(input_ids=ids, labels=torch.tensor([[4, 5]]) if family != "causal" else ids.clamp_max(5))
    with pytest.raises(IndexError, match=message):
        model.generate(input_ids=ids, max_new_tokens=2)


@pytest.mark.parametrize("chunked", [False, True])
def test_label_outside_the_vocabulary_is_named(chunked):
    """`IndexError: Target 99 is out of bounds.` named no vocabulary (the last label never reaches an embedding)."""
    model = tiny_model("seq2seq", loss_chunk_size=4 if chunked else None).train(chunked)
    with pytest.raises(IndexError, match=rf"label {TINY_VOCAB + 5} \(1 out of range in all\) is outside the "
                                         rf"vocabulary of {TINY_VOCAB} tokens"):
        model(input_ids=torch.tensor([[5, 6]]), labels=torch.tensor([[4, -100, TINY_VOCAB + 5]]))


def test_token_id_outside_an_adaptive_vocabulary_is_named():
    model = tiny_model("causal", adaptive_cutoffs=[20])
    with pytest.raises(IndexError, match=rf"token id -1 \(at position \(0, 1\).*of {TINY_VOCAB} tokens"):
        model(input_ids=torch.tensor([[5, -1]]))


@pytest.mark.parametrize("family", FAMILIES)
def test_nan_weights_are_named_on_load(family, tmp_path):
    """Corrupted tensor bytes loaded as NaN without a word, and training went on to a nan loss."""
    model = tiny_model(family)
    model.save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    name = next(key for key in weights if "embed" in key or "shared" in key)
    weights[name][3, 0] = float("nan")
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"of {tmp_path} are not finite: tensor '.*' .* holds 1 NaN/inf"):
        type(model).from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"are not finite"):
        AutoModelForCausalLM.from_pretrained(tmp_path) if family == "causal" else AutoModelForSeq2SeqLM.from_pretrained(
            tmp_path
        )


@pytest.mark.parametrize("family", FAMILIES)
def test_resize_below_a_special_token_is_refused(family):
    """resize_token_embeddings(2) with eos_token_id=2 was accepted and generation emitted only <s>."""
    model = tiny_model(family)
    with pytest.raises(ValueError, match=r"resize_token_embeddings\(2\) keeps token ids 0\.\.1 .*eos_token_id=2"):
        model.resize_token_embeddings(2)
    assert model.get_input_embeddings().num_embeddings == TINY_VOCAB
    model.resize_token_embeddings(TINY_VOCAB - 5)  # every special token kept: fine
    if family != "causal":
        decoder = tiny_model(family, tie_topology="decoder")
        with pytest.raises(ValueError, match=r"would drop the special token\(s\) .*eos_token_id=2"):
            decoder.resize_decoder_token_embeddings(2)


# The translation pipeline ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def translator():
    tokenizer = tiny_tokenizer()
    return pipeline("tiednorm-translation", model=tiny_model("seq2seq", vocab_size=len(tokenizer)), tokenizer=tokenizer)


@pytest.mark.parametrize("arguments", [{"num_beams": 0}, {"num_beams": -1}, {"generate_kwargs": {"num_beams": 0}},
                                       {"max_new_tokens": 0}])
def test_pipeline_refuses_non_positive_generation_arguments(translator, arguments):
    """num_beams=0 raised ZeroDivisionError inside beam search."""
    name = next(iter(arguments.get("generate_kwargs", arguments)))
    with pytest.raises(ValueError, match=rf"{name} must be a positive integer, got -?\d"):
        translator("a dog", **arguments)


def test_pipeline_translates_an_empty_list_to_an_empty_list(translator):
    """translator([]) raised IndexError: list index out of range."""
    assert translator([]) == []
    with pytest.raises(ValueError, match="num_beams must be a positive integer"):
        translator([], num_beams=0)


def test_pipeline_names_the_tokenizer_of_a_model_objects_folder(tmp_path):
    """A model object loaded from a folder holding a tokenizer was told that its folder had none."""
    tokenizer = tiny_tokenizer()
    tiny_model("seq2seq", vocab_size=len(tokenizer)).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path)
    with pytest.raises(ValueError, match=rf"passed as an object.*its folder {tmp_path} holds one; pass model="):
        pipeline("tiednorm-translation", model=model)
    remedy = pipeline("tiednorm-translation", model=str(tmp_path), trust_remote_code=True)
    assert remedy("a dog", max_new_tokens=2)


# Publishing: tiednorm-card and tiednorm-push --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    """A saved model with tokenizer and the card the training script writes (no repo id: it names the folder)."""
    folder = tmp_path_factory.mktemp("published") / "local-run"
    tokenizer = tiny_tokenizer()
    tiny_model("seq2seq", vocab_size=len(tokenizer)).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    write_model_card(folder, metrics={"test_bleu": 12.5}, dataset="bentrevett/multi30k", languages=["de", "en"])
    return folder


def test_card_metrics_with_a_byte_order_mark_are_read(run_folder, tmp_path):
    """A BOM in --metrics raised JSONDecodeError naming no file."""
    metrics = tmp_path / "metrics.json"
    metrics.write_bytes('\ufeff{"test_bleu": 31.5}'.encode())
    output = tmp_path / "card"
    shutil.copytree(run_folder, output)
    model_card.main([str(output), "--metrics", str(metrics), "--dataset", "bentrevett/multi30k"])
    assert "31.5" in (output / "README.md").read_text()


def test_card_metrics_that_are_not_json_are_named(run_folder, tmp_path):
    metrics = tmp_path / "metrics.json"
    metrics.write_text('{"test_bleu": 31.5,}')
    with pytest.raises(ValueError, match=rf"--metrics file {metrics} is not valid JSON: .* line 1 column 20"):
        model_card.main([str(run_folder), "--metrics", str(metrics), "--dataset", "bentrevett/multi30k"])


def test_push_dry_run_card_names_the_repo_not_the_local_folder(run_folder, tmp_path):
    """The staged card's loading snippet said from_pretrained("local-run"), which nobody else can load."""
    hub.main([str(run_folder), "me/tiednorm-demo", "--dry-run", str(tmp_path / "upload")])
    card = (tmp_path / "upload" / "README.md").read_text()
    assert 'from_pretrained("me/tiednorm-demo"' in card and 'model="me/tiednorm-demo"' in card
    assert "local-run" not in card
    assert "# tiednorm-demo" in card and "12.5" in card  # the title follows, the training script's metrics stay


@pytest.mark.parametrize("repo_id", ["me/my model", "a/b/c", "me/-bad"])
def test_push_refuses_an_invalid_repo_id_before_staging(run_folder, tmp_path, repo_id):
    with pytest.raises(ValueError, match=rf"invalid Hub repository id '{re.escape(repo_id)}'"):
        hub.main([str(run_folder), repo_id, "--dry-run", str(tmp_path / "upload")])
    assert not (tmp_path / "upload").exists()
    with pytest.raises(ValueError, match="invalid Hub repository id"):
        model_card.main([str(run_folder), "--repo-id", repo_id])
