"""Tiny configs built in code, shared by every test module (HF's own tests work the same way)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import hf_tiednorm  # noqa: E402  (registers the Auto classes)

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
TINY_VOCAB = 61


def tiny_seq2seq_config(**overrides) -> hf_tiednorm.TiedNormSeq2SeqConfig:
    fields = dict(
        vocab_size=TINY_VOCAB,
        d_model=32,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
        dropout=0.0,
    )
    fields.update(overrides)
    return hf_tiednorm.TiedNormSeq2SeqConfig(**fields)


def tiny_causal_config(**overrides) -> hf_tiednorm.TiedNormCausalConfig:
    fields = dict(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
    )
    fields.update(overrides)
    return hf_tiednorm.TiedNormCausalConfig(**fields)


def tiny_model(family: str, **overrides):
    """A tiny randomly initialized model of one family ("seq2seq" or "causal"), in eval mode."""
    torch.manual_seed(0)
    if family == "seq2seq":
        return hf_tiednorm.TiedNormForConditionalGeneration(tiny_seq2seq_config(**overrides)).eval()
    if family == "causal":
        return hf_tiednorm.TiedNormForCausalLM(tiny_causal_config(**overrides)).eval()
    raise ValueError(f"unknown family {family!r}")


def model_inputs(model, batch_size: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special token ids (and decoder ids for seq2seq) for a forward pass."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size, (batch_size, length), generator=generator)
    if model.config.is_encoder_decoder:
        decoder_vocab = model.config.decoder_vocab_size
        decoder_ids = torch.randint(4, decoder_vocab, (batch_size, length - 2), generator=generator)
        return {"input_ids": ids, "decoder_input_ids": decoder_ids}
    return {"input_ids": ids}


@pytest.fixture(scope="session")
def multi30k_dir() -> Path:
    if not (MULTI30K / "train.de.gz").exists():
        pytest.skip(f"Multi30k not found at {MULTI30K}")
    return MULTI30K
