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


TINY_ENCODER_DECODER = dict(
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


def tiny_seq2seq_config(**overrides) -> hf_tiednorm.TiedNormSeq2SeqConfig:
    return hf_tiednorm.TiedNormSeq2SeqConfig(**TINY_ENCODER_DECODER | overrides)


def tiny_bart_config(**overrides) -> hf_tiednorm.TiedNormBartConfig:
    # scale_embedding=True (BART's default is False) so that the tests cover the in-module sqrt(d) scaling.
    return hf_tiednorm.TiedNormBartConfig(**TINY_ENCODER_DECODER | {"scale_embedding": True} | overrides)


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
    """A tiny randomly initialized model of one family ("seq2seq", "bart" or "causal"), in eval mode."""
    torch.manual_seed(0)
    if family == "seq2seq":
        return hf_tiednorm.TiedNormForConditionalGeneration(tiny_seq2seq_config(**overrides)).eval()
    if family == "bart":
        return hf_tiednorm.TiedNormBartForConditionalGeneration(tiny_bart_config(**overrides)).eval()
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


# Prepended to code run by `run_without_package`: makes `import hf_tiednorm` fail even when the package is
# installed (editable installs put a finder on sys.meta_path), so only remote code can provide the classes.
_BLOCK_PACKAGE = """
import sys
class _BlockHfTiednorm:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_tiednorm" or name.startswith("hf_tiednorm."):
            raise ImportError("hf_tiednorm is blocked in this process")
        return None
sys.meta_path.insert(0, _BlockHfTiednorm())
sys.path = [p for p in sys.path if p not in ("", ".") and "hf_tiednorm" not in p]
try:
    import hf_tiednorm
except ImportError:
    pass
else:
    raise SystemExit("hf_tiednorm is importable in the isolated process")
"""


def run_without_package(code: str, cwd: Path, timeout: int = 300) -> str:
    """Run `code` in a fresh Python process where `hf_tiednorm` cannot be imported; return its stdout."""
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", _BLOCK_PACKAGE + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated process failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def tiny_tokenizer(vocab_size: int = TINY_VOCAB):
    """A BPE tokenizer trained in code on a few sentences, with hf_tiednorm's special-token layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    sentences = [
        "a dog runs on the grass .", "ein hund läuft auf dem gras .", "two men play music in the street .",
        "zwei männer spielen musik auf der straße .", "a woman reads a book .", "eine frau liest ein buch .",
    ] * 5
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    tokenizer.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
