"""A family added in this file alone (issues 41, 50): a tied GPT-2 parent with the normalized head, written with the
package's public names only. Its config lists the two config mixins before ``GPT2Config``; its LM lists
``TiedNormCausalLMMixin`` before ``GPT2PreTrainedModel`` and builds GPT-2's body, then the head: no label shift by
hand, no hidden hook. Its row is two keywords (``ModelFamily(lm_class=..., source_class=...)``), everything else
derived. With no edit to the package it trains, saves and reloads through the Auto classes, converts from a GPT-2
checkpoint 1:1, exports back to ``GPT2LMHeadModel`` and names itself on its card. tests/test_toy_extensions.py takes
it through the training script and a remote-code load."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub.dataclasses import strict
from transformers import AutoModelForCausalLM, GenerationMixin, GPT2Config, GPT2LMHeadModel, GPT2Model
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel

from hf_tiednorm import (
    ModelFamily,
    TiedNormCausalLMMixin,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    register_family,
    unregister_family,
)
from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.export import export_plain
from hf_tiednorm.publishing.model_card import render_model_card

TINY = dict(
    vocab_size=61,
    n_embd=32,
    n_layer=2,
    n_head=4,
    n_positions=64,
    bos_token_id=1,
    eos_token_id=2,
    resid_pdrop=0.0,
    embd_pdrop=0.0,
    attn_pdrop=0.0,
)


@strict
class ToyGPT2Config(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, GPT2Config):
    model_type = "tiednorm_toy_gpt2"
    input_embedding_path = "transformer.wte"  # the token embedding's module path from the LM (the tie's owner)


class ToyGPT2ForCausalLM(TiedNormCausalLMMixin, GPT2PreTrainedModel, GenerationMixin):
    config_class = ToyGPT2Config

    def __init__(self, config):
        super().__init__(config)
        self.transformer = GPT2Model(config)  # GPT-2's base_model_prefix: the body the mixin's forward calls
        self.add_tied_norm_head(config.n_embd)  # the normalized head; wte becomes its tied TiedNormEmbedding
        self.post_init()


@pytest.fixture(scope="module")
def toy_family():
    row = register_family(ModelFamily(lm_class=ToyGPT2ForCausalLM, source_class=GPT2LMHeadModel,
                                      cpu_bf16_eager_attention=False))  # fmt: skip
    yield row
    unregister_family(row.name)  # the other tests wrap GPT-2 sources


def test_a_row_derives_what_it_can_and_takes_keywords_only(toy_family):
    assert (toy_family.name, toy_family.model_type, toy_family.config_class) == (
        "toy_gpt2", "tiednorm_toy_gpt2", ToyGPT2Config)  # fmt: skip
    assert toy_family.auto_class is AutoModelForCausalLM and not toy_family.is_encoder_decoder
    assert (toy_family.hf_parent_config, toy_family.source_model_type) == (GPT2Config, "gpt2")
    assert toy_family.card_name == "gpt2-style causal language model"
    with pytest.raises(TypeError):
        ModelFamily(ToyGPT2ForCausalLM)  # positional rows are gone: each field is named
    assert register_family(ModelFamily(lm_class=ToyGPT2ForCausalLM)) is toy_family  # the same classes again: kept

    class OtherLM(ToyGPT2ForCausalLM):
        pass

    with pytest.raises(ValueError, match="'tiednorm_toy_gpt2' is registered already"):
        register_family(ModelFamily(lm_class=OtherLM, name="other"))
    with pytest.raises(ValueError, match="names no config class"):
        ModelFamily(lm_class=torch.nn.Linear)


def test_a_family_without_its_embedding_path_is_refused_by_name():
    @strict
    class NoPathConfig(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, GPT2Config):
        model_type = "tiednorm_toy_no_path"

    class NoPathLM(ToyGPT2ForCausalLM):
        config_class = NoPathConfig

    with pytest.raises(AttributeError, match="input_embedding_path"):
        NoPathLM(NoPathConfig(**TINY))


def test_a_family_that_builds_no_body_is_refused_by_name():
    class NoBodyLM(ToyGPT2ForCausalLM):
        def __init__(self, config):
            GPT2PreTrainedModel.__init__(self, config)
            self.body = GPT2Model(config)  # not under GPT-2's base_model_prefix ("transformer")
            self.add_tied_norm_head(config.n_embd)

    with pytest.raises(TypeError, match="no body under base_model_prefix='transformer'"):
        NoBodyLM(ToyGPT2Config(**TINY))


def test_a_family_registered_in_a_test_trains_saves_converts_exports_and_names_itself(toy_family, tmp_path):
    torch.manual_seed(0)
    model = ToyGPT2ForCausalLM(ToyGPT2Config(**TINY, head_mode="cosine", logit_scale_kind="vector")).train()
    ids = torch.randint(4, 61, (2, 9))
    before = model.lm_head.weight.detach().clone()
    loss = model(input_ids=ids, labels=ids).loss
    logits = model(input_ids=ids).logits
    expected = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 61), ids[:, 1:].reshape(-1))
    torch.testing.assert_close(loss, expected)  # the mixin shifted the labels: position t predicts token t+1
    loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert not torch.equal(before, model.lm_head.weight)  # it trains, through the tied matrix
    assert model.lm_head.weight is model.transformer.wte.weight
    model.eval().save_pretrained(tmp_path / "trained")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "trained").eval()
    assert type(reloaded) is ToyGPT2ForCausalLM
    torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)
    out = reloaded.generate(ids[:, :3], max_new_tokens=4, do_sample=False)
    assert out.shape == (2, 7)  # generation through the mixin's forward and GPT-2's cache

    torch.manual_seed(1)
    GPT2LMHeadModel(GPT2Config(**TINY)).eval().save_pretrained(tmp_path / "gpt2")  # a plain tied GPT-2 checkpoint
    converted = convert_checkpoint(tmp_path / "gpt2", tmp_path / "converted", head_mode="cosine", lossless_start=True)
    assert type(converted) is ToyGPT2ForCausalLM  # 1:1 onto the registered family, not the wrapper
    source = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    torch.testing.assert_close(converted(input_ids=ids).logits, source(input_ids=ids).logits, rtol=1e-4, atol=1e-4)

    result = export_plain(converted, tmp_path / "plain")
    assert result.parent == "GPT2LMHeadModel"
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["model_type"] == "gpt2" and "auto_map" not in config

    card = render_model_card(tmp_path / "trained")
    assert "gpt2-style causal language model" in card.text
