"""Loading aligned parallel / monolingual text with 🤗 datasets, tokenizing it, and counting tokens.

A split is given either as one ``.json``/``.jsonl``/``.csv`` file with one column per language code (or an HF
``translation`` column of ``{lang: text}`` dicts), or as aligned text files, one sentence a line (``.gz`` works),
named by a pattern holding ``{lang}``: ``train.{lang}.gz`` reads ``train.de.gz`` and ``train.en.gz``.

Nothing here changes the task silently (issue 24): a UTF-8 byte-order mark is stripped (and logged) instead of becoming
part of the first sentence and a vocabulary token; a target file that is the source file (the same path, a symlink
to it, or a copy with the same lines up to whitespace) is refused, since it would train a copy task; a truncated,
corrupt or mislabelled ``.gz`` file, a json/jsonl/csv row whose language field is missing, null or not a string, and a
``translation`` dict without one of the languages stop with the file (and row) named. gzip is told by a file's first
bytes (``.GZ`` and a compressed file without ``.gz`` read too, logged); a directory named as a data file is named as
one.

Text files are read here rather than with 🤗 datasets' ``text`` loader, which splits lines with ``str.splitlines``:
a lone ``\r`` (or another Unicode line break) inside a sentence would start a new row there, shifting every later
pair of a parallel corpus although both files have the same ``wc -l``. Here a line ends at ``\n`` only (a ``\r``
before it, as in CRLF files, is dropped), and two sides align when they have the same number of such lines. A file
with old-Mac ``\r`` line endings (no ``\n`` at all: it would read as one line) is split at ``\r`` with a warning;
more lone ``\r`` than ``\n`` is refused as ambiguous. An empty file, a csv header without rows and bytes that are
not UTF-8 stop with the file named (and the line and byte offset). A pair with an empty or whitespace-only side, and
a pair whose target equals its source up to whitespace (a copy), are dropped with a warning naming the count and the
first line (``keep_empty`` / ``keep_copies``: kept, still warned); a split of such pairs only is refused. Literal
special-token strings in the text stay text (``split_special_tokens``).
"""

from __future__ import annotations

import gzip
import logging
import os
import string
import zlib
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, DatasetDict, load_dataset
from datasets.exceptions import DatasetGenerationError

logger = logging.getLogger(__name__)

TABLE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv"}


def _table_format(path: str) -> str | None:
    suffixes = [suffix.lower() for suffix in Path(path).suffixes]
    suffix = suffixes[-2] if len(suffixes) > 1 and suffixes[-1] == ".gz" else (suffixes[-1] if suffixes else "")
    return TABLE_FORMATS.get(suffix)


def _check_exists(path: str, split: str) -> None:
    if Path(path).is_dir():
        raise IsADirectoryError(f"{split} file {path} is a directory, not a file: name the file in it (e.g. "
                                f"{Path(path) / 'train.jsonl'}, or a text-file pattern such as "
                                f"{Path(path) / 'train.{lang}.gz'})")
    if not Path(path).is_file():
        raise FileNotFoundError(f"{split} file not found: {path}")


GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: str) -> bool:
    """Whether ``path`` is gzip-compressed, by its first two bytes (whatever its name: ``.gz``, ``.GZ`` or none)."""
    with open(path, "rb") as handle:
        return handle.read(2) == GZIP_MAGIC


def read_lines(path: str, split: str) -> list[str]:
    """The lines of a UTF-8 text file (``.gz`` works), split on ``\n`` only; ``ValueError`` naming the file when it
    is empty, not UTF-8 (with the line and byte offset of the first bad byte) or a ``.gz`` file that does not
    decompress (truncated, corrupt, or not gzip at all). gzip is told by the file's first bytes, so ``.GZ`` or a
    compressed file without ``.gz`` reads too (logged). A directory is named as one. A leading UTF-8 byte-order mark
    is stripped, with a log line.
    """
    _check_exists(path, split)
    named_gz = path.lower().endswith(".gz")
    compressed = is_gzip(path)
    if compressed and not named_gz:
        logger.warning("%s file %s is gzip-compressed (its first bytes) although its name does not end in .gz: "
                       "decompressed", split, path)
    opener = gzip.open if compressed or named_gz else open
    try:
        with opener(path, "rb") as handle:
            data = handle.read()
    except (EOFError, zlib.error, gzip.BadGzipFile) as error:
        # gzip names neither the file nor what is wrong with it in words a user can act on.
        what = "is truncated" if isinstance(error, EOFError) else "is not a valid gzip file"
        raise ValueError(f"{split} file {path} {what} ({type(error).__name__}: {error}); re-download or re-compress "
                         f"it (a plain text file must not end in .gz)") from None
    if data.startswith(b"\xef\xbb\xbf"):
        logger.warning("%s file %s starts with a UTF-8 byte-order mark: stripped", split, path)
        data = data[3:]
    if not data:
        raise ValueError(f"{split} file {path} is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        where = "of the decompressed text " if compressed else ""
        raise ValueError(
            f"{split} file {path} is not UTF-8: line {line}, byte offset {error.start} {where}"
            f"({data[error.start:error.start + 1]!r}: {error.reason}); convert it, e.g. with iconv -t UTF-8"
        ) from None
    lone_cr = text.count("\r") - text.count("\r\n")
    if lone_cr and "\n" not in text:  # old Mac line endings: every line ends at \r
        logger.warning("%s file %s ends its lines with a lone \\r (old Mac line endings): split there into %d lines",
                       split, path, lone_cr + (not text.endswith("\r")))
        text = text.replace("\r", "\n")
    elif lone_cr > text.count("\n"):
        raise ValueError(
            f"{split} file {path} holds {lone_cr} lone \\r line breaks but only {text.count(chr(10))} \\n: mixed "
            "line endings, where a line ends is ambiguous; convert it to \\n line endings (e.g. with dos2unix -c mac)"
        )
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()  # the final newline ends the last line rather than starting an empty one
    return [line.removesuffix("\r") for line in lines]


def _load_table(fmt: str, path: str, split: str) -> Dataset:
    """A json/jsonl/csv file as a Dataset; an empty, non-UTF-8 or malformed file fails naming the file."""
    # 🤗 datasets fails on an empty file without naming it and reads some non-UTF-8 bytes without complaint.
    lines = read_lines(path, split)
    if fmt == "csv" and sum(bool(line.strip()) for line in lines) <= 1:
        raise ValueError(f"{split} file {path} holds a csv header only ({lines[0][:80]!r}), no rows")
    try:
        table = load_dataset(fmt, data_files={split: path}, split=split)
    except (DatasetGenerationError, ValueError) as error:  # e.g. "Instruction train corresponds to no data"
        raise ValueError(f"{split} file {path} is not valid {fmt}: {error.__cause__ or error}") from error
    if len(table) == 0:
        raise ValueError(f"{split} file {path} holds no rows")
    return table


def _check_pattern(pattern: str, split: str) -> None:
    """A text-file pattern holds ``{lang}`` and no other ``{...}`` placeholder."""
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(pattern) if name is not None}
    except ValueError as error:  # an unmatched brace
        raise ValueError(f"{split} file pattern {pattern!r} is malformed ({error}); it must hold '{{lang}}'") from None
    if "lang" not in fields:
        raise ValueError(
            f"{split} file {pattern!r} is neither .json/.jsonl/.csv nor a text-file pattern holding '{{lang}}' "
            f"(e.g. train.{{lang}}.gz)"
        )
    other = sorted(fields - {"lang"})
    if other:
        raise ValueError(
            f"{split} file pattern {pattern!r} holds the placeholder(s) {', '.join('{' + f + '}' for f in other)}; "
            "only {lang} is filled in (write other parts of the name out, e.g. train.{lang}.gz)"
        )


def _check_not_copy_task(paths: dict[str, str], split: str) -> None:
    """Refuse a source file that is the target file (same path, a link to it): a copy task. The same lines in two
    files (up to whitespace) are ``drop_pairs``' to refuse."""
    (source, target) = paths.values()
    if os.path.samefile(source, target):
        raise ValueError(f"{split} source file {source} and target file {target} are the same file (a link?): "
                         "training would learn to copy; give the target language's file")


def _text_column(values: list, split: str, path: str, column: str) -> None:
    """Every value of a language column of a table is a string; else name the file, the row and what it holds."""
    for row, value in enumerate(values, start=1):
        if not isinstance(value, str):
            what = "missing or null" if value is None else f"of type {type(value).__name__} ({value!r}), not a string"
            raise ValueError(f"{split} file {path}, row {row}: the {column!r} field is {what}")


def _translation_columns(table: Dataset, split: str, path: str, languages: tuple[str, str]) -> Dataset:
    """An HF ``translation`` column of ``{lang: text}`` dicts as one column per language; a row without one of the
    languages fails naming the file, the row and the language."""
    columns = {lang: [] for lang in languages}
    for row, pair in enumerate(table["translation"], start=1):
        for lang in languages:
            if not isinstance(pair, dict) or pair.get(lang) is None:
                has = sorted(k for k, v in pair.items() if v is not None) if isinstance(pair, dict) else pair
                raise ValueError(f"{split} file {path}, row {row}: its 'translation' has no {lang!r} text ({has})")
            columns[lang].append(pair[lang])
    return Dataset.from_dict(columns)


def is_copy(source: str, target: str) -> bool:
    """Whether a pair's target is its source up to whitespace (spaces, tabs, a trailing \\r, NBSP: ``str.split``)."""
    return source.split() == target.split()


# The scored splits keep every pair of their files (``drop_pairs``): test BLEU and test_predictions.txt (line i answers
# source line i) cover the whole test file, and a validation score the whole validation file, comparable with any other
# system's score on the same files (a copied name is a fair test of a translation). Only training data drops the pairs
# that teach no translation.
UNFILTERED_SPLITS = ("validation", "test")


def drop_pairs(
    sides: dict[str, list[str]], split: str, where: str, keep_empty: bool = False, keep_copies: bool = False,
    copy_refusal: str | None = None,
) -> dict[str, list]:
    """``sides`` (language → aligned lines) without the pairs that teach no translation, each kind with a warning
    naming how many and the first line: a pair whose source or target is empty or whitespace only (``keep_empty``:
    kept, still warned), and a pair whose target equals its source up to whitespace, which trains a copy
    (``keep_copies``: kept, still warned). A scored split (``UNFILTERED_SPLITS``: validation, test) keeps every pair,
    warned: its score covers its whole file, and its predictions answer the file line for line. ``ValueError`` when
    no pair is left: a split of empty lines only, or of copies only (``copy_refusal``: the message; training would
    learn to copy, whatever ``keep_copies``)."""
    (source, target) = sides.values()
    empty, copies = [], []
    for row, (left, right) in enumerate(zip(source, target)):
        if not (left.strip() and right.strip()):
            empty.append(row)
        elif is_copy(left, right):
            copies.append(row)
    if not empty and not copies:
        return sides
    if len(empty) == len(source):
        raise ValueError(f"{split} {where}: every pair has an empty (or whitespace-only) side ({len(empty)} "
                         f"line{'s' * (len(empty) > 1)}): the {split} split holds no text to train or score on")
    if len(empty) + len(copies) == len(source):
        raise ValueError(copy_refusal or f"{split} {where}: every pair's target equals its source up to whitespace "
                         "(the same lines): training would learn to copy; give the target language's text")
    drop = set()
    scored = split in UNFILTERED_SPLITS
    for rows, what, keep, flag in ((empty, "with an empty or whitespace-only side", keep_empty, "--keep_empty_lines"),
                                   (copies, "whose target equals the source up to whitespace (a copy)", keep_copies,
                                    "--keep_copied_pairs")):
        if rows:
            action = f"kept ({flag})" if keep else f"dropped ({flag} keeps them)"
            if scored:
                keep, action = True, f"kept (every {split} pair is scored: prediction line i answers source line i)"
            logger.warning("%s %s: %d pairs %s (the first at line %d) %s", split, where, len(rows), what,
                           rows[0] + 1, action)
            if not keep:
                drop.update(rows)
    if not drop:
        return sides
    return {lang: [line for row, line in enumerate(lines) if row not in drop] for lang, lines in sides.items()}


def load_parallel(
    split_files: dict[str, str], source_lang: str, target_lang: str, keep_empty: bool = False,
    keep_copies: bool = False,
) -> DatasetDict:
    """A ``DatasetDict`` with one string column per language (``source_lang``, ``target_lang``) for each split;
    in train, pairs with an empty side are dropped with a warning unless ``keep_empty``, pairs whose target is the
    source up to whitespace unless ``keep_copies``; the scored splits (validation, test) keep every pair (warned); a
    split of copies only is refused (``drop_pairs``)."""
    if source_lang == target_lang:
        raise ValueError(f"source_lang and target_lang are both {source_lang!r}; give two different languages")
    splits = {}
    for split, pattern in split_files.items():
        fmt = _table_format(pattern)
        if fmt is not None:
            _check_exists(pattern, split)
            table = _load_table(fmt, pattern, split)
            if "translation" in table.column_names:
                table = _translation_columns(table, split, pattern, (source_lang, target_lang))
            missing = [lang for lang in (source_lang, target_lang) if lang not in table.column_names]
            if missing:
                columns = table.column_names
                raise ValueError(f"{split} file {pattern} has no column {missing}; its columns are {columns}")
            table = table.select_columns([source_lang, target_lang])
            for lang in (source_lang, target_lang):
                _text_column(table[lang], split, pattern, lang)
            refusal = (f"{split} file {pattern}: the {source_lang!r} and {target_lang!r} columns hold the same text "
                       "(up to whitespace): training would learn to copy")
            columns = drop_pairs({lang: table[lang] for lang in (source_lang, target_lang)}, split,
                                 f"file {pattern}", keep_empty, keep_copies, refusal)
            if len(columns[source_lang]) != len(table):
                table = Dataset.from_dict(columns)
            splits[split] = table
            continue
        _check_pattern(pattern, split)
        paths = {lang: pattern.format(lang=lang) for lang in (source_lang, target_lang)}
        for path in paths.values():
            _check_exists(path, split)
        sides = {lang: read_lines(path, split) for lang, path in paths.items()}
        counts = {paths[lang]: len(lines) for lang, lines in sides.items()}
        if len(set(counts.values())) > 1:
            raise ValueError(
                f"{split} files are not aligned: " + ", ".join(f"{path} has {n} lines" for path, n in counts.items())
            )
        _check_not_copy_task(paths, split)
        (source, target) = paths.values()
        refusal = (f"{split} source file {source} and target file {target} hold the same lines (up to whitespace): "
                   "training would learn to copy; give the target language's file")
        sides = drop_pairs(sides, split, f"files {' / '.join(paths.values())}", keep_empty, keep_copies, refusal)
        splits[split] = Dataset.from_dict(sides)
    return DatasetDict(splits)


def load_monolingual(split_files: dict[str, str], text_column: str = "text") -> DatasetDict:
    """A ``DatasetDict`` with one ``text`` column: plain text files (one line a row) or a json/jsonl/csv column."""
    splits = {}
    for split, path in split_files.items():
        _check_exists(path, split)
        fmt = _table_format(path)
        if fmt is None:
            if text_column != "text":
                raise ValueError(f"{split} file {path} is plain text (one 'text' column); text_column applies to "
                                 f"json/jsonl/csv files, got {text_column!r}")
            splits[split] = Dataset.from_dict({"text": read_lines(path, split)})
            continue
        table = _load_table(fmt, path, split)
        if text_column not in table.column_names:
            raise ValueError(f"{split} file {path} has no column {text_column!r}; its columns are {table.column_names}")
        table = table.select_columns([text_column])
        _text_column(table[text_column], split, path, text_column)
        splits[split] = table if text_column == "text" else table.rename_column(text_column, "text")
    return DatasetDict(splits)


def training_texts(dataset: Dataset, columns: list[str], batch_size: int = 1000):
    """Batches of text from several columns, for ``tokenizers``' ``train_from_iterator``."""
    for batch in dataset.iter(batch_size=batch_size):
        for column in columns:
            yield batch[column]


def tokenize_parallel(
    dataset: DatasetDict | Dataset,
    tokenizer,
    source_lang: str,
    target_lang: str,
    max_source_length: int = 128,
    max_target_length: int = 128,
    num_proc: int | None = None,
) -> DatasetDict | Dataset:
    """``input_ids``/``attention_mask`` from the source column and ``labels`` from the target column. Text is
    text: a literal ``<pad>`` or ``</s>`` in a sentence is tokenized as characters (``split_special_tokens``), never
    as the control token (a pad id inside labels would not even be ignored as -100)."""

    def encode(batch):
        encoded = tokenizer(batch[source_lang], max_length=max_source_length, truncation=True,
                            split_special_tokens=True)
        targets = tokenizer(text_target=batch[target_lang], max_length=max_target_length, truncation=True,
                            split_special_tokens=True)
        encoded["labels"] = targets["input_ids"]
        return encoded

    columns = [source_lang, target_lang]
    return dataset.map(encode, batched=True, remove_columns=columns, num_proc=num_proc, desc="Tokenizing")


def group_texts(dataset: DatasetDict | Dataset, tokenizer, block_size: int, num_proc: int | None = None):
    """Tokenize the ``text`` column, end every line with the tokenizer's EOS token, and cut the concatenation into
    ``block_size`` blocks; the remainder shorter than a block is dropped, as in HF's run_clm.

    The EOS is appended here unless the tokenizer's own post-processor already ended the line with it (ours adds
    </s>; most modern tokenizers, SmolLM2's and Llama's among them, add none): without it consecutive lines would be
    glued ("…near many bushes.Several men…") and the model would learn, and be scored on, text that never occurs.
    """
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has no eos_token: lines would be concatenated with no "
            "separator; set one (tokenizer.eos_token = ...) before grouping the text into blocks"
        )

    def encode(batch):
        encoded = tokenizer(batch["text"], split_special_tokens=True)
        ends = [bool(ids) and ids[-1] == eos for ids in encoded["input_ids"]]
        for key, pad in (("input_ids", eos), ("attention_mask", 1), ("token_type_ids", 0)):
            if key in encoded:
                encoded[key] = [row if end else row + [pad] for row, end in zip(encoded[key], ends)]
        return encoded

    def chunk(batch):
        ids = np.concatenate([np.asarray(row, dtype=np.int64) for row in batch["input_ids"]] or [np.zeros(0, np.int64)])
        usable = (len(ids) // block_size) * block_size
        blocks = ids[:usable].reshape(-1, block_size).tolist()
        return {"input_ids": blocks, "attention_mask": [[1] * block_size for _ in blocks], "labels": blocks}

    tokenized = dataset.map(encode, batched=True, remove_columns=["text"], num_proc=num_proc, desc="Tokenizing")
    return tokenized.map(
        chunk, batched=True, batch_size=1000, remove_columns=["input_ids", "attention_mask"], num_proc=num_proc,
        desc=f"Grouping into blocks of {block_size}",
    )


def token_counts(
    dataset: Dataset, vocab_size: int, columns: tuple[str, ...] = ("input_ids", "labels")
) -> torch.LongTensor:
    """How often each token id occurs in ``columns`` of a tokenized dataset: a ``(vocab_size,)`` LongTensor.

    For a three-way tied model pass both sides (the default); for the decoder/output embedding alone pass
    ``("labels",)``. Ids < 0 (the -100 of ignored labels) are skipped; an id >= vocab_size is an error.
    """
    present = [column for column in columns if column in dataset.column_names]
    if not present:
        raise ValueError(f"none of the columns {columns} is in the dataset (columns: {dataset.column_names})")
    counts = np.zeros(vocab_size, dtype=np.int64)
    for batch in dataset.select_columns(present).iter(batch_size=2000):
        for column in present:
            ids = np.concatenate([np.asarray(row, dtype=np.int64) for row in batch[column]] or [np.zeros(0, np.int64)])
            ids = ids[ids >= 0]
            if ids.size and ids.max() >= vocab_size:
                raise ValueError(f"token id {int(ids.max())} in column {column!r} is >= vocab_size={vocab_size}")
            counts += np.bincount(ids, minlength=vocab_size)
    return torch.from_numpy(counts)


__all__ = [
    "group_texts", "load_monolingual", "load_parallel", "read_lines", "token_counts", "tokenize_parallel",
    "training_texts",
]
