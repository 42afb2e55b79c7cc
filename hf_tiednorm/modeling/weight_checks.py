"""Checks that keep a model from going on silently with weights or a vocabulary it cannot use: weights that load as
NaN/inf are named (``check_finite_weights``), and a resize that would drop a special token's row is refused
(``check_resize_keeps_special_tokens``)."""

from __future__ import annotations

import os

import torch
from torch import nn

SPECIAL_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def check_finite_weights(model: nn.Module, source: str | os.PathLike | None = None) -> None:
    """Raise ``ValueError`` naming the first parameter of ``model`` holding NaN or inf (and how many values do);
    ``source`` (the folder loaded) goes into the message. Tensors on the meta device are skipped."""
    for name, parameter in model.named_parameters():
        if not parameter.is_floating_point() or parameter.is_meta:
            continue
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter  # a DTensor: this rank's shard
        finite = torch.isfinite(local.detach())
        if not bool(finite.all()):
            bad = int((~finite).sum())
            origin = f" of {source}" if source is not None else ""
            raise ValueError(f"the weights{origin} are not finite: tensor {name!r} {tuple(parameter.shape)} holds "
                             f"{bad} NaN/inf value(s) of {parameter.numel()}; the weights file is corrupt (re-download "
                             "it, or resume from an earlier checkpoint)")


def special_token_ids(model: nn.Module) -> dict[str, int]:
    """The special-token ids the model generates and pads with, by field, from its config and generation config
    (a list-valued ``eos_token_id`` gives one entry per id)."""
    ids = {}
    config = model.config
    sources = [getattr(config, "text_config", None), config, getattr(model, "generation_config", None)]
    for source in filter(None, sources):
        for field in SPECIAL_TOKEN_FIELDS:
            value = getattr(source, field, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            for i, token_id in enumerate(values):
                if isinstance(token_id, int):
                    ids[field if len(values) == 1 else f"{field}[{i}]"] = token_id
    return ids


def check_resize_keeps_special_tokens(model: nn.Module, new_num_tokens: int | None,
                                      pad_to_multiple_of: int | None = None) -> None:  # fmt: skip
    """Refuse a vocabulary size that would drop a special token's row (pad, bos, eos, decoder start): ``ValueError``
    naming the size and the tokens. ``new_num_tokens`` None (only padding to a multiple) keeps every row."""
    if new_num_tokens is None:
        return
    size = new_num_tokens
    if pad_to_multiple_of is not None:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    dropped = {field: token_id for field, token_id in special_token_ids(model).items() if token_id >= size}
    if dropped:
        listed = ", ".join(f"{field}={token_id}" for field, token_id in dropped.items())
        raise ValueError(f"resize_token_embeddings({new_num_tokens}) keeps token ids 0..{size - 1} and would drop the "
                         f"special token(s) {listed}: generation could then never produce or pad with them; keep at "
                         f"least {max(dropped.values()) + 1} tokens")


__all__ = ["check_finite_weights", "check_resize_keeps_special_tokens", "special_token_ids"]
