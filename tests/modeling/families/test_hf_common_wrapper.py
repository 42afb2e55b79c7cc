"""The wrapper (``TiedNormWrappedFor*``) behaves as an HF composite model (issues 46, 47): ``base_model`` is the
headless backbone, the body's config is a sub-config that every output and attention setting reaches, SDPA/flash
support follows the body's, ``inputs_embeds`` is accepted, and ``config.vocab_size`` is the body's."""

from __future__ import annotations

import pytest
import torch
from tiny_architectures import CONFIGS, inputs_for, source_model

from hf_tiednorm.convert import normalize_tied_head

WRAPPED = ("llama", "qwen3", "gpt2", "bart")
# The wrapped model's headless backbone, by architecture (its base_model_prefix in transformers).
BACKBONES = {"llama": "LlamaModel", "qwen3": "Qwen3Model", "gpt2": "GPT2Model", "bart": "BartModel"}


def wrapped(name: str, head_mode: str = "cosine"):
    return normalize_tied_head(source_model(name), head_mode, generic=True).eval()


@pytest.mark.parametrize("name", WRAPPED)
def test_base_model_is_the_headless_backbone(name):
    """As in every HF ``*ForCausalLM``: ``model.base_model`` (= ``getattr(model, model.base_model_prefix)``) is the
    body without its head, whose output has ``last_hidden_state`` (TRL's fused LM head runs it, issue 47)."""
    model = wrapped(name)
    backbone = getattr(model, model.base_model_prefix)
    assert backbone is model.base_model is model.model.base_model
    assert type(backbone).__name__ == BACKBONES[name]
    assert backbone.get_output_embeddings() is None if hasattr(backbone, "get_output_embeddings") else True
    inputs = inputs_for(model)
    with torch.no_grad():
        hidden = backbone(**inputs).last_hidden_state
        captured = {}
        hook = model.get_output_embeddings().register_forward_hook(lambda _m, a, _o: captured.update(h=a[0]))
        model(**inputs)
        hook.remove()
    torch.testing.assert_close(hidden, captured["h"])  # the backbone's output is what the head scores


@pytest.mark.parametrize("name", ["llama", "bart"])
def test_save_and_reload_keep_the_state_dict_keys(name, tmp_path):
    """The backbone is reached inside ``self.model`` (not registered twice): the keys are the ``model.*`` ones every
    saved wrapper folder holds, and a saved folder reloads to the same logits."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    model = wrapped(name)
    keys = set(model.state_dict())
    assert keys == {f"model.{key}" for key in model.model.state_dict()}
    assert not any(key.startswith(f"{model.base_model_prefix}.") for key in keys)
    model.save_pretrained(tmp_path)
    auto = AutoModelForSeq2SeqLM if CONFIGS[name].is_encoder_decoder else AutoModelForCausalLM
    reloaded = auto.from_pretrained(tmp_path, trust_remote_code=True).eval()
    inputs = inputs_for(model)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(**inputs).logits, model(**inputs).logits)
    assert type(reloaded.base_model).__name__ == BACKBONES[name]


def test_output_settings_and_attention_reach_the_wrapped_model(tmp_path):
    """``text_config`` is a sub-config: what is set on the wrapper's config (outputs, attention implementation,
    also at ``from_pretrained``) is what the wrapped model runs with."""
    model = wrapped("llama")
    assert model.config.sub_configs and model.config.get_text_config() is model.model.config
    assert model.config._attn_implementation == model.model.config._attn_implementation == "sdpa"
    model.config.output_hidden_states = True
    inputs = inputs_for(model)
    with torch.no_grad():
        assert len(model(**inputs).hidden_states) == CONFIGS["llama"].num_hidden_layers + 1
    model.save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    eager = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True, attn_implementation="eager")
    attention = eager.model.model.layers[0].self_attn
    assert eager.config._attn_implementation == attention.config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["gpt2", "bart"])
def test_inputs_embeds_and_tuples(name):
    """``inputs_embeds`` is a named argument and gives the logits ``input_ids`` give; ``return_dict=False`` gives
    the output's tuple (logits first), also on the fused training path."""
    import inspect

    model = wrapped(name)
    assert "inputs_embeds" in inspect.signature(model.forward).parameters
    inputs = inputs_for(model)
    with torch.no_grad():
        expected = model(**inputs).logits
        embeds = model.get_input_embeddings()(inputs["input_ids"])
        from_embeds = model(**{k: v for k, v in inputs.items() if k != "input_ids"}, inputs_embeds=embeds).logits
        torch.testing.assert_close(from_embeds, expected)
        as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], expected)
    if name == "gpt2":
        model.train()
        model.config.loss_implementation = "chunked"
        loss = model(**inputs, labels=inputs["input_ids"], return_dict=False)[0]
        assert loss.ndim == 0


def test_vocab_size_follows_a_resize():
    model = wrapped("qwen3")
    assert model.config.vocab_size == model.config.get_text_config().vocab_size == 61
    model.resize_token_embeddings(71)
    assert model.config.vocab_size == model.config.get_text_config().vocab_size == 71
    with torch.no_grad():
        assert model(**inputs_for(model)).logits.shape[-1] == 71


def test_an_untied_config_is_refused_where_the_model_is_built():
    """The normalized head is tied by definition: a wrapped config saying ``tie_word_embeddings=False`` is refused
    when the wrapper is built (it used to build tied anyway and then not reload its own save); so is an own-family
    config whose tie flag was set against its ``tie_topology``."""
    from testing_utils import tiny_config

    import hf_tiednorm
    from hf_tiednorm import TiedNormWrappedConfig, TiedNormWrappedForCausalLM

    text_config = CONFIGS["llama"].__class__(**CONFIGS["llama"].to_dict() | {"tie_word_embeddings": False})
    with pytest.raises(ValueError, match="tie_word_embeddings=False"):
        TiedNormWrappedForCausalLM(TiedNormWrappedConfig(text_config=text_config, head_mode="cosine"))
    config = tiny_config("seq2seq")
    config.tie_word_embeddings = False
    with pytest.raises(ValueError, match="contradicts tie_topology"):
        hf_tiednorm.TiedNormForConditionalGeneration(config)


@pytest.mark.parametrize("name", ["llama", "bart"])
def test_automodel_gives_the_wrapped_backbone_output(name, tmp_path):
    """A wrapper's folder names its base model as ``AutoModel`` (as our families' folders name their bare body):
    ``AutoModel.from_pretrained`` gives the states the normalized head scores (``last_hidden_state``), with the package
    and from the folder's own code where it cannot be imported."""
    from testing_utils import run_without_package
    from transformers import AutoModel

    model = wrapped(name)
    model.save_pretrained(tmp_path)
    inputs = inputs_for(model)
    captured = {}
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, a, _o: captured.update(h=a[0]))
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    base = AutoModel.from_pretrained(tmp_path).eval()
    assert type(base).__name__ == "TiedNormWrappedModel" and not base.can_generate()
    with torch.no_grad():
        torch.testing.assert_close(base(**inputs).last_hidden_state, captured["h"])
    torch.save({"inputs": inputs, "hidden": captured["h"]}, tmp_path / "expected.pt")
    out = run_without_package(f"""
import torch
from transformers import AutoModel
expected = torch.load({str(tmp_path / "expected.pt")!r})
base = AutoModel.from_pretrained({str(tmp_path)!r}, trust_remote_code=True).eval()
with torch.no_grad():
    torch.testing.assert_close(base(**expected["inputs"]).last_hidden_state, expected["hidden"])
print("base", type(base).__name__, type(base).__module__)
""", cwd=tmp_path)
    assert "base TiedNormWrappedModel transformers_modules." in out
