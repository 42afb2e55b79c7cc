"""Loading aligned parallel / monolingual text with 🤗 datasets, tokenizing it, and counting tokens.

A split is given either as one ``.json``/``.jsonl``/``.csv`` file with one column per language code (or an HF
``translation`` column of ``{lang: text}`` dicts), or as aligned text files, one sentence a line (``.gz`` works),
named by a pattern holding ``{lang}``: ``train.{lang}.gz`` reads ``train.de.gz`` and ``train.en.gz``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from datasets import Dataset, DatasetDict, concatenate_datasets, load_dataset

TABLE_FORMATS = {".json": "json", ".jsonl": "json", ".csv": "csv"}


def _table_format(path: str) -> str | None:
    suffixes = Path(path).suffixes
    suffix = suffixes[-2] if len(suffixes) > 1 and suffixes[-1] == ".gz" else (suffixes[-1] if suffixes else "")
    return TABLE_FORMATS.get(suffix)


def _check_exists(path: str, split: str) -> None:
    if not Path(path).is_file():
        raise FileNotFoundError(f"{split} file not found: {path}")


def load_parallel(split_files: dict[str, str], source_lang: str, target_lang: str) -> DatasetDict:
    """A ``DatasetDict`` with one string column per language (``source_lang``, ``target_lang``) for each split."""
    if source_lang == target_lang:
        raise ValueError(f"source_lang and target_lang are both {source_lang!r}; give two different languages")
    splits = {}
    for split, pattern in split_files.items():
        fmt = _table_format(pattern)
        if fmt is not None:
            _check_exists(pattern, split)
            table = load_dataset(fmt, data_files={split: pattern}, split=split)
            if "translation" in table.column_names:
                table = table.map(lambda row: row["translation"], remove_columns=table.column_names)
            missing = [lang for lang in (source_lang, target_lang) if lang not in table.column_names]
            if missing:
                columns = table.column_names
                raise ValueError(f"{split} file {pattern} has no column {missing}; its columns are {columns}")
            splits[split] = table.select_columns([source_lang, target_lang])
            continue
        if "{lang}" not in pattern:
            raise ValueError(
                f"{split} file {pattern!r} is neither .json/.jsonl/.csv nor a text-file pattern holding '{{lang}}' "
                f"(e.g. train.{{lang}}.gz)"
            )
        sides = []
        for lang in (source_lang, target_lang):
            path = pattern.format(lang=lang)
            _check_exists(path, split)
            text = load_dataset("text", data_files={split: path}, split=split)
            sides.append(text.rename_column("text", lang))
        if len(sides[0]) != len(sides[1]):
            raise ValueError(
                f"{split} files are not aligned: {pattern.format(lang=source_lang)} has {len(sides[0])} lines, "
                f"{pattern.format(lang=target_lang)} has {len(sides[1])}"
            )
        splits[split] = concatenate_datasets(sides, axis=1)
    return DatasetDict(splits)


def load_monolingual(split_files: dict[str, str], text_column: str = "text") -> DatasetDict:
    """A ``DatasetDict`` with one ``text`` column: plain text files (one line a row) or a json/jsonl/csv column."""
    splits = {}
    for split, path in split_files.items():
        _check_exists(path, split)
        table = load_dataset(_table_format(path) or "text", data_files={split: path}, split=split)
        if text_column not in table.column_names:
            raise ValueError(f"{split} file {path} has no column {text_column!r}; its columns are {table.column_names}")
        table = table.select_columns([text_column])
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
    """``input_ids``/``attention_mask`` from the source column and ``labels`` from the target column."""

    def encode(batch):
        encoded = tokenizer(batch[source_lang], max_length=max_source_length, truncation=True)
        targets = tokenizer(text_target=batch[target_lang], max_length=max_target_length, truncation=True)
        encoded["labels"] = targets["input_ids"]
        return encoded

    columns = [source_lang, target_lang]
    return dataset.map(encode, batched=True, remove_columns=columns, num_proc=num_proc, desc="Tokenizing")


def group_texts(dataset: DatasetDict | Dataset, tokenizer, block_size: int, num_proc: int | None = None):
    """Tokenize the ``text`` column (each line ends with </s>) and cut the concatenation into ``block_size`` blocks;
    the remainder shorter than a block is dropped, as in HF's run_clm."""

    def encode(batch):
        return tokenizer(batch["text"])

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


__all__ = ["group_texts", "load_monolingual", "load_parallel", "token_counts", "tokenize_parallel", "training_texts"]
