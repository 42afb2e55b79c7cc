"""Hugging Face's common model tests (``ModelTesterMixin`` and ``ConfigTester`` from the installed transformers'
sdist, tests/hf_common_suite.py) on every family at cosine and baseline, the wrapper around a tied Llama, Qwen3, GPT-2
and BART, and, as controls, HF's own classes at the same sizes and inputs (issue 46).

A test that passes for a control passes for ours, except the deliberate differences in ``DELIBERATE``, each skipped
by name with the docs line that explains it. The default run holds a representative slice (``FAST``: the causal
family and the wrapper around Llama, cosine); the whole matrix is marked slow.
"""

from __future__ import annotations

import json
import re
import unittest
from pathlib import Path

import hf_common_suite
import pytest
import torch
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

ROOT = Path(__file__).resolve().parents[3]

# Deliberate differences of ours from HF's classes (at most five): test name -> (the kinds of ours it applies to,
# the docs line that explains it). "strict load": HF's tests load folders lacking weights and expect a report of
# missing keys; ours refuse such a folder by name. "tied": HF's tests untie a model by config.tie_word_embeddings.
STRICT_LOAD = ("docs/run_safety.md «loads a folder as trained or not at all»: from_pretrained (our families and the "
               "wrapper) refuses a tensor missing from the weights by name; it does not report and initialize it")
TIED = ("docs/techniques.md «is the encoder-decoders' one tie setting»: tie_word_embeddings set against tie_topology "
        "is refused where the model is built, and the wrapper is tied by definition")
OWN_KINDS, TIE_KINDS = {"causal", "seq2seq", "bart", "wrapped"}, {"seq2seq", "bart", "wrapped"}
DELIBERATE: dict[str, tuple[set[str], str]] = {
    "test_model_weights_reload_no_missing_tied_weights": (OWN_KINDS, STRICT_LOAD),
    "test_correct_missing_keys": ({"wrapped"}, STRICT_LOAD),  # a wrapper loaded from its bare body's folder
    "test_load_save_without_tied_weights": (TIE_KINDS, TIED),
    "test_resize_embeddings_untied": (TIE_KINDS, TIED),
    "test_resize_embeddings_untied_no_reinit_on_post_init": (TIE_KINDS, TIED),
}


def case(config_class, fields, model_classes, is_encoder_decoder, *, kind=None, wrapped=None, slow=True):
    """A ``unittest.TestCase`` running HF's common tests on ``model_classes`` built from ``config_class(**fields)``
    (``wrapped``: the wrapped config class, whose ``fields`` become the wrapper's ``text_config``)."""

    def make_config(tester):
        if wrapped is None:
            return config_class(**fields)
        return config_class(text_config=wrapped(**fields["text_config"]), **{
            k: v for k, v in fields.items() if k != "text_config"})

    if wrapped is not None:
        # ConfigTester compares each field with its saved JSON: text_config as the wrapper's JSON holds it.
        saved = json.loads(make_config(None).to_json_string())["text_config"]
        fields = fields | {"text_config": saved}

    class Case(HF.ModelTesterMixin, HF.GenerationTesterMixin, unittest.TestCase):
        all_model_classes = model_classes

        def setUp(self):
            self.model_tester = TinyModelTester(self, make_config, is_encoder_decoder)
            self.config_tester = HF.ConfigTester(
                self, config_class=config_class, has_text_modality=wrapped is None, **fields)

        def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
            # HF gives labels to the classes in its static name mappings; an encoder-decoder LM of ours (or the
            # wrapper) is in none of them: labels as HF gives MarianMTModel's.
            inputs = super()._prepare_for_class(inputs_dict, model_class, return_labels)
            if return_labels and is_encoder_decoder and "labels" not in inputs:
                inputs["labels"] = torch.zeros_like(inputs["decoder_input_ids"])
            return inputs

        def test_config(self):
            self.config_tester.run_common_tests(can_init_without_params=wrapped is None and not fields)

    Case.is_encoder_decoder = is_encoder_decoder
    for name, (kinds, reason) in DELIBERATE.items():
        if kind in kinds:
            setattr(Case, name, unittest.skip(f"deliberate: {reason}")(getattr(Case, name)))
    return pytest.mark.slow(Case) if slow else Case


FAST = {("causal", "cosine"), ("wrapped_llama", "cosine")}

for _family, (_config, _fields, _classes, _encdec) in OWN.items():
    for _mode in ("cosine", "baseline"):
        globals()[f"Test_{_family}_{_mode}"] = case(
            _config, _fields | {"head_mode": _mode}, _classes, _encdec, kind=_family,
            slow=(_family, _mode) not in FAST)
for _name, (_config, _fields, _control) in WRAPPED.items():
    _encdec = _config is BartConfig
    _lm = TiedNormWrappedForSeq2SeqLM if _encdec else TiedNormWrappedForCausalLM
    for _mode in ("cosine", "baseline"):
        globals()[f"Test_wrapped_{_name}_{_mode}"] = case(
            TiedNormWrappedConfig, {"text_config": _fields, "head_mode": _mode}, (_lm,), _encdec, kind="wrapped",
            wrapped=_config,
            slow=(f"wrapped_{_name}", _mode) not in FAST)
for _name, (_config, _fields, _classes, _encdec) in CONTROLS.items():
    globals()[f"Test_control_{_name}"] = case(_config, _fields, _classes, _encdec)


@pytest.mark.parametrize("reason", sorted({reason for _, reason in DELIBERATE.values()}))
def test_each_deliberate_difference_quotes_the_docs_that_explain_it(reason):
    """A skip's reason names a docs page and quotes its words (no line number, which every edit of the page moves):
    the quoted words stand on that page, and the differences are at most five."""
    page, quoted = re.fullmatch(r"(docs/[\w.]+) «([^»]+)»: .*", reason, flags=re.S).groups()
    assert quoted in (ROOT / page).read_text(encoding="utf-8"), (page, quoted)
    assert len(DELIBERATE) <= 5


def test_hf_generation_mixin_is_used_where_it_stands(tmp_path, monkeypatch):
    """Where transformers' ``generation/test_utils.py`` stands beside the sdist's tests (put there by hand: the
    manual check of docs/deploy.md, "Generation"), the suite imports HF's real mixin: its absolute import of the export
    mixin (``tests.exporters.test_export``) gets the empty one, and no ``tests`` module is left behind. A stand-in file
    with the real one's import, under a package name of its own (the suite's is imported already)."""
    import sys
    import types

    folder = tmp_path / "tests"
    (folder / "generation").mkdir(parents=True)
    (folder / "generation" / "__init__.py").touch()
    (folder / "generation" / "test_utils.py").write_text(
        "from tests.exporters.test_export import ExportGenerateTesterMixin\n\n\n"
        "class GenerationTesterMixin(ExportGenerateTesterMixin):\n"
        "    def test_greedy_generate(self):\n        pass\n"
    )
    package = types.ModuleType("stand_in_sdist_tests")
    package.__path__ = [str(folder)]
    monkeypatch.setattr(hf_common_suite, "HF_TESTS", folder)
    monkeypatch.setattr(hf_common_suite, "PACKAGE", package.__name__)
    monkeypatch.setitem(sys.modules, package.__name__, package)
    assert hf_common_suite.has_generation_tests()
    empty = type("ExportGenerateTesterMixin", (), {})
    try:
        hf_common_suite._import_generation_tests({"ExportGenerateTesterMixin": empty})
        mixin = sys.modules[f"{package.__name__}.generation.test_utils"].GenerationTesterMixin
    finally:
        for name in [name for name in sys.modules if name.startswith(f"{package.__name__}.")]:
            del sys.modules[name]
    assert "test_greedy_generate" in vars(mixin) and mixin.__bases__ == (empty,)
    assert not [name for name in sys.modules if name == "tests" or name.startswith("tests.")]
