"""Tiny random tied configs, built in code, of the transformers architectures the generic conversion supports."""

from __future__ import annotations

import copy
from functools import cache

import torch
from testing_utils import TINY_DECODER, TINY_ENCODER_DECODER, TINY_VOCAB
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartConfig,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    M2M100Config,
    MarianConfig,
    MBartConfig,
    MistralConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
    T5Config,
)

SPECIAL = {"vocab_size": TINY_VOCAB, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DECODER = TINY_DECODER | SPECIAL | {"num_key_value_heads": 2, "tie_word_embeddings": True}
ENCODER_DECODER = TINY_ENCODER_DECODER | SPECIAL | {"decoder_start_token_id": 1}

# name -> config; what each exercises around the head is noted where it is more than a final norm.
CONFIGS: dict[str, PretrainedConfig] = {
    "gpt2": GPT2Config(n_layer=2, n_embd=32, n_head=4, n_positions=64, **SPECIAL),  # learned positions
    "llama": LlamaConfig(**DECODER),
    "qwen2": Qwen2Config(**DECODER),
    "qwen3": Qwen3Config(head_dim=8, **DECODER),
    # sqrt(d) scaled embedding, final-logit soft-capping (a small cap, so that it bends these tiny logits)
    "gemma2": Gemma2Config(head_dim=8, final_logit_softcapping=0.5, **DECODER),
    "gemma3_text": Gemma3TextConfig(head_dim=8, final_logit_softcapping=0.5, **DECODER),
    "mistral": MistralConfig(**DECODER),
    "phi3": Phi3Config(**DECODER),
    "t5": T5Config(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, decoder_start_token_id=0, **SPECIAL),
    "bart": BartConfig(scale_embedding=True, **ENCODER_DECODER),  # in-module sqrt(d) scale, final_logits_bias
    "mbart": MBartConfig(scale_embedding=True, **ENCODER_DECODER),
    "marian": MarianConfig(**ENCODER_DECODER),  # sqrt(d) scale in the encoder/decoder, final_logits_bias
    "m2m_100": M2M100Config(scale_embedding=True, **ENCODER_DECODER),  # NLLB's architecture
}
ARCHITECTURES = list(CONFIGS)


def auto_class(config: PretrainedConfig) -> type:
    return AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM


@cache
def _source(name: str) -> PreTrainedModel:
    torch.manual_seed(0)
    model = auto_class(CONFIGS[name]).from_config(copy.deepcopy(CONFIGS[name])).eval()
    if hasattr(model, "final_logits_bias"):  # non-zero, so that its place after the head is tested
        model.final_logits_bias.normal_(0, 0.1)
    return model


def source_model(name: str) -> PreTrainedModel:
    """A fresh copy of the (cached) tiny random source model of architecture ``name``, in eval mode."""
    return copy.deepcopy(_source(name))


def inputs_for(model: PreTrainedModel, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special ids (batch 2), with decoder ids for an encoder-decoder."""
    generator = torch.Generator().manual_seed(seed)
    inputs = {"input_ids": torch.randint(4, TINY_VOCAB, (2, 7), generator=generator)}
    if model.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = torch.randint(4, TINY_VOCAB, (2, 5), generator=generator)
    return inputs
