"""Data files: pairs stay aligned whatever characters the sentences hold, and unreadable files fail naming the file
(issue 14). Tiny files written in each test."""

from __future__ import annotations

import gzip
import json

import pytest

from hf_tiednorm.training.data import load_monolingual, load_parallel


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
