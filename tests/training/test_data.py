"""Data files: pairs stay aligned whatever characters the sentences hold, and unreadable files fail naming the file
(issue 14). Tiny files written in each test."""

from __future__ import annotations

import gzip
import json
import logging

import pytest
from script_helpers import load_script
from testing_utils import tiny_tokenizer

from hf_tiednorm.training.data import group_texts, load_monolingual, load_parallel, tokenize_parallel
from hf_tiednorm.training.data import read_lines as read_text_lines


def write_pair(folder, source: str | bytes, target: str | bytes, name: str = "train") -> str:
    for lang, text in (("de", source), ("en", target)):
        data = text if isinstance(text, bytes) else text.encode("utf-8")
        (folder / f"{name}.{lang}").write_bytes(data)
    return str(folder / f"{name}.{{lang}}")


def test_lone_carriage_return_does_not_shift_pairs(tmp_path):
    """One stray \\r inside a sentence of each file (same `wc -l`): 🤗 datasets' text loader split there and shifted
    every later pair; lines end at \\n only."""
    source = [f"quelle {i}" for i in range(6)]
    target = [f"target {i}" for i in range(6)]
    source[1] = "quelle 1 mit\rwagenrücklauf"
    target[4] = "target 4 with\ra carriage return"
    pattern = write_pair(tmp_path, "\n".join(source) + "\n", "\n".join(target) + "\n")
    pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert pairs["de"] == source and pairs["en"] == target


def test_crlf_lines_and_missing_final_newline(tmp_path):
    pattern = write_pair(tmp_path, "eins\r\nzwei\r\n", "one\ntwo")
    pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert (pairs["de"], pairs["en"]) == (["eins", "zwei"], ["one", "two"])


def test_gzip_text_files(tmp_path):
    for lang, text in (("de", "ein hund\rläuft\n"), ("en", "a dog runs\n")):
        with gzip.open(tmp_path / f"train.{lang}.gz", "wt", encoding="utf-8") as handle:
            handle.write(text)
    pairs = load_parallel({"train": str(tmp_path / "train.{lang}.gz")}, "de", "en")["train"]
    assert (pairs["de"], pairs["en"]) == (["ein hund\rläuft"], ["a dog runs"])


def test_line_counts_of_the_files_decide_alignment(tmp_path):
    pattern = write_pair(tmp_path, "a\nb\nc\n", "a\nb\n")
    with pytest.raises(ValueError, match=r"not aligned: .*train\.de has 3 lines, .*train\.en has 2 lines"):
        load_parallel({"train": pattern}, "de", "en")


def test_empty_text_file_is_named(tmp_path):
    pattern = write_pair(tmp_path, "a\n", "", name="val")
    with pytest.raises(ValueError, match=r"validation file .*val\.en is empty"):
        load_parallel({"validation": pattern}, "de", "en")


def test_non_utf8_text_file_names_file_line_and_byte(tmp_path):
    pattern = write_pair(tmp_path, "eins\nzwei\n", "one\nt\xe9o\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"train file .*train\.en is not UTF-8: line 2, byte offset 5 "):
        load_parallel({"train": pattern}, "de", "en")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv"])
def test_empty_table_file_is_named(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"train file .*train\{suffix} is empty"):
        load_parallel({"train": str(path)}, "de", "en")


def test_non_utf8_json_file_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    row = json.dumps({"de": "zwei", "en": "two"})
    path.write_bytes((row + "\n" + '{"de": "zw\xf6lf", "en": "twelve"}\n').encode("latin-1"))
    with pytest.raises(ValueError, match=r"train file .*train\.jsonl is not UTF-8: line 2"):
        load_parallel({"train": str(path)}, "de", "en")


def test_monolingual_text_keeps_lone_carriage_returns_and_names_empty_files(tmp_path):
    (tmp_path / "train.txt").write_text("first\rline\nsecond\n")
    assert load_monolingual({"train": str(tmp_path / "train.txt")})["train"]["text"] == ["first\rline", "second"]
    (tmp_path / "val.txt").write_text("")
    with pytest.raises(ValueError, match=r"validation file .*val\.txt is empty"):
        load_monolingual({"validation": str(tmp_path / "val.txt")})


# Formerly test_data_reading.py -------------------------------------------------------------------------------------
# Data read as written (issue 34 §4): old-Mac line endings, empty pairs, literal special-token strings, a card label
# that names other data, a header-only csv and a split of empty lines, each named.


def test_old_mac_line_endings_are_split_with_a_warning(tmp_path, caplog):
    """CR-only files read as one line each (counts equal, so "aligned"): one 20 kB pair trained silently."""
    pattern = write_pair(tmp_path, "eins\rzwei\rdrei\r", "one\rtwo\rthree\r")
    with caplog.at_level(logging.WARNING):
        pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert pairs["de"] == ["eins", "zwei", "drei"] and pairs["en"] == ["one", "two", "three"]
    assert "train.de" in caplog.text and "old Mac line endings" in caplog.text


def test_mostly_lone_cr_with_some_newlines_is_refused_by_name(tmp_path):
    path = tmp_path / "mixed.txt"
    path.write_text("a\rb\rc\rd\n")
    with pytest.raises(ValueError, match=r"mixed\.txt holds 3 lone \\r line breaks but only 1 \\n"):
        read_text_lines(str(path), "train")
    path.write_text("a\rb\nc\n")  # a stray \r inside a sentence stays (tests/training/test_data.py)
    assert read_text_lines(str(path), "train") == ["a\rb", "c"]


def test_empty_pairs_are_dropped_with_a_warning(tmp_path, caplog):
    source = ["eins", "", "drei", "vier"]
    target = ["one", "two", "   ", "four"]
    pattern = write_pair(tmp_path, "\n".join(source) + "\n", "\n".join(target) + "\n")
    with caplog.at_level(logging.WARNING):
        pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert pairs["de"] == ["eins", "vier"] and pairs["en"] == ["one", "four"]
    assert "2 pairs with an empty or whitespace-only side (the first at line 2)" in caplog.text
    kept = load_parallel({"train": pattern}, "de", "en", keep_empty=True)["train"]
    assert kept["de"] == source


def test_a_split_of_empty_lines_says_so(tmp_path):
    """A validation file of one empty line per side was refused as "training would learn to copy"."""
    pattern = write_pair(tmp_path, "\n", "\n", name="val")
    with pytest.raises(ValueError, match=r"validation files .*val\.de.*every pair has an empty .*1 line\)"):
        load_parallel({"validation": pattern}, "de", "en")


def test_a_header_only_csv_is_named(tmp_path):
    path = tmp_path / "pairs.csv"
    path.write_text("de,en\n")
    with pytest.raises(ValueError, match=r"train file .*pairs\.csv holds a csv header only"):
        load_parallel({"train": str(path)}, "de", "en")


def test_literal_special_token_strings_stay_text(tmp_path):
    """"<pad>" / "</s>" in a sentence became pad / eos ids in sources and labels (a pad id in labels is not -100)."""
    tokenizer = tiny_tokenizer()
    pattern = write_pair(tmp_path, "ein <pad> hund </s> läuft\n", "a <pad> dog </s> runs\n")
    pairs = load_parallel({"train": pattern}, "de", "en")
    encoded = tokenize_parallel(pairs, tokenizer, "de", "en")["train"][0]
    special = {tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.bos_token_id}
    for column in ("input_ids", "labels"):
        ids = encoded[column]
        assert ids[-1] == tokenizer.eos_token_id and not special & set(ids[:-1]), (column, ids)
    blocks = group_texts(pairs.rename_column("en", "text").remove_columns("de"), tokenizer, block_size=4)["train"]
    flat = [i for block in blocks["input_ids"] for i in block]
    assert tokenizer.pad_token_id not in flat and flat.count(tokenizer.eos_token_id) <= 1


@pytest.mark.parametrize("script", ["run_translation", "run_clm"])
def test_dataset_name_that_is_not_the_files_is_refused(script):
    """`--dataset_name wmt16` trained on the default Multi30k files while the card said "Trained on wmt16"."""
    data_arguments = load_script(script).DataArguments
    with pytest.raises(ValueError, match=r"--dataset_name wmt16 .*reads the Multi30k files.*does not download"):
        data_arguments(dataset_name="wmt16")
    assert data_arguments(dataset_name="bentrevett/multi30k").dataset_name == "bentrevett/multi30k"


# --- issue 40 S14, U10 ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["ein hund läuft \n eine frau liest\n", "ein  hund läuft\neine frau liest\t\n",
                                    "ein hund läuft\r\neine frau liest\u00a0\n"])
def test_a_target_equal_to_the_source_up_to_whitespace_is_a_copy_task(tmp_path, target):
    """S14: a target file that is the source plus whitespace trained as a copy task; only identical lines were
    refused."""
    pattern = write_pair(tmp_path, "ein hund läuft\neine frau liest\n", target)
    with pytest.raises(ValueError, match=r"train source file .*train\.de and target file .*train\.en hold the same "
                                         r"lines \(up to whitespace\): training would learn to copy"):
        load_parallel({"train": pattern}, "de", "en")
    with pytest.raises(ValueError, match=r"would learn to copy"):  # whatever --keep_copied_pairs says
        load_parallel({"train": pattern}, "de", "en", keep_copies=True)


def test_copied_pairs_are_dropped_with_a_warning(tmp_path, caplog):
    """Some pairs whose target is the source up to whitespace: dropped with the count and first line, as empty pairs
    are; --keep_copied_pairs keeps them (still warned)."""
    source = ["eins", "Berlin", "", "drei", "ok"]
    target = ["one", " Berlin ", "two", "three", "ok"]
    pattern = write_pair(tmp_path, "\n".join(source) + "\n", "\n".join(target) + "\n")
    with caplog.at_level(logging.WARNING):
        pairs = load_parallel({"train": pattern}, "de", "en")["train"]
    assert pairs["de"] == ["eins", "drei"] and pairs["en"] == ["one", "three"]
    copies = "2 pairs whose target equals the source up to whitespace (a copy) (the first at line 2) dropped"
    assert copies in caplog.text
    assert "1 pairs with an empty or whitespace-only side (the first at line 3)" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        kept = load_parallel({"train": pattern}, "de", "en", keep_copies=True)["train"]
    assert kept["de"] == ["eins", "Berlin", "drei", "ok"] and "kept (--keep_copied_pairs)" in caplog.text


def test_table_columns_equal_up_to_whitespace_are_a_copy_task(tmp_path):
    path = tmp_path / "pairs.jsonl"
    path.write_text('{"de": "ein hund", "en": "ein hund "}\n{"de": "eine frau", "en": "eine  frau"}\n')
    with pytest.raises(ValueError, match=r"pairs\.jsonl: the 'de' and 'en' columns hold the same text \(up to "
                                         r"whitespace\): training would learn to copy"):
        load_parallel({"train": str(path)}, "de", "en")


@pytest.mark.parametrize("name", ["train.{lang}", "train.{lang}.GZ", "train.{lang}.txt"])
def test_gzip_is_told_by_its_bytes_not_its_name(tmp_path, caplog, name):
    """U10: a gzip file without .gz (or with .GZ) was reported as "not UTF-8, convert it with iconv"."""
    for lang, text in (("de", "ein hund läuft\n"), ("en", "a dog runs\n")):
        (tmp_path / name.format(lang=lang)).write_bytes(gzip.compress(text.encode()))
    with caplog.at_level(logging.WARNING):
        pairs = load_parallel({"train": str(tmp_path / name)}, "de", "en")["train"]
    assert pairs["de"] == ["ein hund läuft"] and pairs["en"] == ["a dog runs"]
    assert ("is gzip-compressed" in caplog.text) == (not name.endswith(".GZ"))


def test_a_gzipped_table_named_gz_in_capitals_is_a_table(tmp_path):
    path = tmp_path / "pairs.jsonl.GZ"
    path.write_bytes(gzip.compress(b'{"de": "ein hund", "en": "a dog"}\n'))
    assert load_parallel({"train": str(path)}, "de", "en")["train"]["en"] == ["a dog"]


def test_a_directory_given_as_a_data_file_is_named_as_one(tmp_path):
    """U10: a directory was "not found"."""
    (tmp_path / "data.de").mkdir()
    (tmp_path / "data.en").write_text("a dog\n")
    with pytest.raises(IsADirectoryError, match=r"train file .*data\.de is a directory, not a file"):
        load_parallel({"train": str(tmp_path / "data.{lang}")}, "de", "en")
    (tmp_path / "pairs.jsonl").mkdir()
    with pytest.raises(IsADirectoryError, match=r"validation file .*pairs\.jsonl is a directory"):
        load_parallel({"validation": str(tmp_path / "pairs.jsonl")}, "de", "en")
    with pytest.raises(IsADirectoryError, match=r"test file .*data\.de is a directory"):
        read_text_lines(str(tmp_path / "data.de"), "test")


def test_the_scored_splits_keep_every_pair_training_drops_copies_and_empty_pairs(tmp_path, caplog):
    """Issue 48 (9): copy pairs (and empty ones) were dropped from the test split too, so test BLEU and
    test_predictions.txt covered a subset and line i no longer answered source line i; only a log line said so. The
    validation score covers its whole file too; only training data is filtered."""
    source = ["eins", "Berlin", "", "drei", "ok"]
    target = ["one", " Berlin ", "two", "three", "ok"]
    files = {split: write_pair(tmp_path, "\n".join(source) + "\n", "\n".join(target) + "\n", name=split)
             for split in ("train", "validation", "test")}
    table = tmp_path / "test.jsonl"
    table.write_text("".join(f'{{"de": "{de}", "en": "{en}"}}\n' for de, en in zip(source, target)))
    with caplog.at_level(logging.WARNING):
        pairs = load_parallel(files, "de", "en")
        tables = load_parallel({"train": files["train"], "test": str(table)}, "de", "en")
    assert pairs["train"]["de"] == ["eins", "drei"] and pairs["train"]["en"] == ["one", "three"]
    for kept in (pairs["validation"], pairs["test"], tables["test"]):
        assert kept["de"] == source and kept["en"] == target  # line i is source line i
    assert "test files" in caplog.text and "kept (every test pair is scored" in caplog.text
    assert "kept (every validation pair is scored" in caplog.text
