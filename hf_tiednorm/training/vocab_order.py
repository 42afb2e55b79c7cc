"""Frequency order of a vocabulary, for the bands of adaptive input / adaptive softmax
(hf_tiednorm/modeling/head/adaptive.py).

Adaptive bands only mean something when token ids are sorted by decreasing frequency (band 0 = the frequent
tokens). ``frequency_order`` builds that order from training counts, keeping the special tokens first;
``remap_tokenizer`` renumbers a 🤗 tokenizer's vocabulary accordingly (so it directly emits the new ids), and
``remap_ids`` / ``permute_counts`` move already-tokenized data and counts to the new numbering;
``frequency_ordered`` is the training scripts' step: a tokenizer renumbered by its training-data counts.

An order is a list ``order`` with ``order[new_id] = old_id``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)


def frequency_order(counts: torch.Tensor | Sequence[int], keep_first: Sequence[int] = (0, 1, 2, 3)) -> list[int]:
    """New → old ids: ``keep_first`` (the special tokens, default <pad>, <s>, </s>, <unk>) in that order, then the
    other tokens by decreasing count, ties broken by old id (so the order is deterministic)."""
    counts = torch.as_tensor(counts)
    if counts.dim() != 1:
        raise ValueError(f"counts must be 1-d, got shape {tuple(counts.shape)}")
    vocab_size = counts.shape[0]
    keep = list(keep_first)
    if len(set(keep)) != len(keep) or any(not 0 <= i < vocab_size for i in keep):
        raise ValueError(f"keep_first must be distinct ids in [0, {vocab_size}), got {keep}")
    kept = set(keep)
    rest = sorted((i for i in range(vocab_size) if i not in kept), key=lambda i: (-int(counts[i]), i))
    return keep + rest


def inverse_order(order: Sequence[int]) -> torch.Tensor:
    """Old → new ids, as a LongTensor (the inverse permutation of ``order``)."""
    order = torch.as_tensor(order, dtype=torch.long)
    if not torch.equal(order.sort().values, torch.arange(order.shape[0])):
        raise ValueError("order must be a permutation of 0..V-1")
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.shape[0])
    return inverse


def remap_ids(ids: torch.Tensor, order: Sequence[int], ignore_index: int = -100) -> torch.Tensor:
    """Renumber old token ids (any shape) to the new order; ``ignore_index`` entries are kept as they are."""
    old_to_new = inverse_order(order)
    ids = torch.as_tensor(ids)
    mapped = old_to_new.to(ids.device)[ids.clamp_min(0)]
    return torch.where(ids == ignore_index, ids, mapped)


def permute_counts(counts: torch.Tensor | Sequence[int], order: Sequence[int]) -> torch.Tensor:
    """Counts in the new numbering: ``new_counts[new_id] = counts[order[new_id]]``."""
    return torch.as_tensor(counts)[torch.as_tensor(order, dtype=torch.long)]


def _remap_processor(processor: dict | None, old_to_new: list[int]) -> None:
    """Renumber the special-token ids a serialized post-processor holds, in place."""
    if processor is None:
        return
    kind = processor.get("type")
    if kind == "TemplateProcessing":
        for special in processor["special_tokens"].values():
            special["ids"] = [old_to_new[i] for i in special["ids"]]
    elif kind in ("BertProcessing", "RobertaProcessing"):
        for name in ("sep", "cls"):
            token, old = processor[name]
            processor[name] = [token, old_to_new[old]]
    elif kind == "Sequence":
        for inner in processor["processors"]:
            _remap_processor(inner, old_to_new)
    elif kind != "ByteLevel":  # ByteLevel holds no ids
        raise ValueError(f"cannot renumber the ids of a {kind!r} post-processor")


def remap_tokenizer(tokenizer: PreTrainedTokenizerFast, order: Sequence[int]) -> PreTrainedTokenizerFast:
    """A copy of ``tokenizer`` whose token ids follow ``order`` (new id i = old id ``order[i]``).

    Works on vocabularies stored as a token → id map (BPE, WordPiece, WordLevel) and on Unigram's ordered list;
    added (special) tokens and the post-processor's special ids are renumbered too. Encoding with the result
    gives exactly ``remap_ids`` of what the original gives.
    """
    old_to_new = inverse_order(order).tolist()
    if len(old_to_new) != len(tokenizer):
        raise ValueError(f"order has {len(old_to_new)} ids but the tokenizer has {len(tokenizer)} tokens")
    state = json.loads(tokenizer.backend_tokenizer.to_str())
    model = state["model"]
    if model["type"] == "Unigram":
        model["vocab"] = [model["vocab"][old] for old in order]
        if model.get("unk_id") is not None:
            model["unk_id"] = old_to_new[model["unk_id"]]
    elif isinstance(model.get("vocab"), dict):
        model["vocab"] = {token: old_to_new[i] for token, i in model["vocab"].items()}
    else:
        raise ValueError(f"cannot renumber a {model['type']!r} tokenizer model")
    for added in state.get("added_tokens", []):
        added["id"] = old_to_new[added["id"]]
    _remap_processor(state.get("post_processor"), old_to_new)
    backend = Tokenizer.from_str(json.dumps(state))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        model_max_length=tokenizer.model_max_length,
        **tokenizer.special_tokens_map,
    )


def frequency_ordered(
    tokenizer: PreTrainedTokenizerBase, counts: torch.Tensor, tokenizer_name: str | None, output_dir: Path
) -> PreTrainedTokenizerBase:
    """``tokenizer`` renumbered by decreasing ``counts`` (its token counts in the training data), its special tokens
    first: adaptive bands need band 0 to hold the frequent tokens. Warns when that renumbers the tokenizer given as
    ``tokenizer_name``, whose ids then no longer fit the new model."""
    order = frequency_order(counts, keep_first=sorted(tokenizer.all_special_ids))
    try:
        ordered = remap_tokenizer(tokenizer, order)
    except ValueError as error:
        raise ValueError(f"--adaptive_cutoffs needs a frequency-ordered vocabulary, but {error}") from None
    if tokenizer_name is not None and ordered.get_vocab() != tokenizer.get_vocab():
        logger.warning(
            "--adaptive_cutoffs: the ids of --tokenizer_name %s were renumbered by training-data frequency; "
            "the renumbered tokenizer is saved in %s and must be used with this model",
            tokenizer_name, output_dir,
        )
    return ordered


__all__ = ["frequency_order", "frequency_ordered", "inverse_order", "permute_counts", "remap_ids", "remap_tokenizer"]
