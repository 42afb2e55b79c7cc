"""Hugging Face's common model tests (``ModelTesterMixin`` and ``ConfigTester`` from the installed transformers'
sdist, tests/hf_common_suite.py) on every family at cosine and baseline, the wrapper around a tied Llama, Qwen3, GPT-2
and BART, and, as controls, HF's own classes at the same sizes and inputs (issue 46).

A test that passes for a control passes for ours, except the deliberate differences in ``DELIBERATE``, each skipped
by name with the docs line that explains it. The default run holds a representative slice (``FAST``: the causal
family and the wrapper around Llama, cosine); the whole matrix is marked slow.
"""

from __future__ import annotations

import unittest

import hf_common_suite
import pytest
from hf_common_suite import TinyModelTester
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import hf_tiednorm
from hf_tiednorm import TiedNormWrappedConfig, TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM

HF = hf_common_suite.load()

SPECIAL = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
DECODER = {"vocab_size": 99, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
           "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512} | SPECIAL
ENCODER_DECODER = {"vocab_size": 99, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                   "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 37,
                   "decoder_ffn_dim": 37, "max_position_embeddings": 512, "decoder_start_token_id": 0} | SPECIAL

# The wrapped architectures: (config class, its fields, its HF class: the control).
WRAPPED = {
    "llama": (LlamaConfig, DECODER | {"tie_word_embeddings": True}, LlamaForCausalLM),
    "qwen3": (Qwen3Config, DECODER | {"head_dim": 8, "tie_word_embeddings": True}, Qwen3ForCausalLM),
    "gpt2": (GPT2Config, {"vocab_size": 99, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 512} | SPECIAL,
             GPT2LMHeadModel),
    "bart": (BartConfig, ENCODER_DECODER, BartForConditionalGeneration),
}

# (config class, its fields, model classes, is_encoder_decoder) per case; ours get head_mode. The LM classes: a bare
# body of ours is not in transformers' MODEL_MAPPING, which HF's training tests read to leave bodies out.
OWN = {
    "causal": (hf_tiednorm.TiedNormCausalConfig, DECODER, (hf_tiednorm.TiedNormForCausalLM,), False),
    "seq2seq": (hf_tiednorm.TiedNormSeq2SeqConfig, ENCODER_DECODER, (hf_tiednorm.TiedNormForConditionalGeneration,),
                True),
    "bart": (hf_tiednorm.TiedNormBartConfig, ENCODER_DECODER, (hf_tiednorm.TiedNormBartForConditionalGeneration,),
             True),
}
CONTROLS = {
    "llama": (LlamaConfig, DECODER | {"tie_word_embeddings": True}, (LlamaForCausalLM,), False),
    "marian": (MarianConfig, ENCODER_DECODER, (MarianMTModel,), True),
    "bart": (BartConfig, ENCODER_DECODER, (BartForConditionalGeneration,), True),
    **{f"{name}_lm": (config_class, fields, (lm,), config_class is BartConfig)
       for name, (config_class, fields, lm) in WRAPPED.items() if name != "llama"},
}

# Deliberate differences of ours from HF's classes: test name -> the docs line that explains it.
DELIBERATE: dict[str, str] = {}


def case(config_class, fields, model_classes, is_encoder_decoder, *, wrapped=None, slow=True):
    """A ``unittest.TestCase`` running HF's common tests on ``model_classes`` built from ``config_class(**fields)``
    (``wrapped``: the wrapped config class, whose ``fields`` become the wrapper's ``text_config``)."""

    def make_config(tester):
        if wrapped is None:
            return config_class(**fields)
        return config_class(text_config=wrapped(**fields["text_config"]), **{
            k: v for k, v in fields.items() if k != "text_config"})

    if wrapped is not None:
        # ConfigTester compares each field with its saved JSON: text_config as saved.
        fields = fields | {"text_config": wrapped(**fields["text_config"]).to_diff_dict()}

    class Case(HF.ModelTesterMixin, HF.GenerationTesterMixin, unittest.TestCase):
        all_model_classes = model_classes

        def setUp(self):
            self.model_tester = TinyModelTester(self, make_config, is_encoder_decoder)
            self.config_tester = HF.ConfigTester(
                self, config_class=config_class, has_text_modality=wrapped is None, **fields)

        def test_config(self):
            self.config_tester.run_common_tests(can_init_without_params=wrapped is None and not fields)

    Case.is_encoder_decoder = is_encoder_decoder
    for name, reason in DELIBERATE.items():
        if model_classes[-1].__module__.startswith("hf_tiednorm"):
            setattr(Case, name, unittest.skip(reason)(getattr(Case, name)))
    return pytest.mark.slow(Case) if slow else Case


FAST = {("causal", "cosine"), ("wrapped_llama", "cosine")}

for _family, (_config, _fields, _classes, _encdec) in OWN.items():
    for _mode in ("cosine", "baseline"):
        globals()[f"Test_{_family}_{_mode}"] = case(
            _config, _fields | {"head_mode": _mode}, _classes, _encdec, slow=(_family, _mode) not in FAST)
for _name, (_config, _fields, _control) in WRAPPED.items():
    _encdec = _config is BartConfig
    _lm = TiedNormWrappedForSeq2SeqLM if _encdec else TiedNormWrappedForCausalLM
    for _mode in ("cosine", "baseline"):
        globals()[f"Test_wrapped_{_name}_{_mode}"] = case(
            TiedNormWrappedConfig, {"text_config": _fields, "head_mode": _mode}, (_lm,), _encdec, wrapped=_config,
            slow=(f"wrapped_{_name}", _mode) not in FAST)
for _name, (_config, _fields, _classes, _encdec) in CONTROLS.items():
    globals()[f"Test_control_{_name}"] = case(_config, _fields, _classes, _encdec)
