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
