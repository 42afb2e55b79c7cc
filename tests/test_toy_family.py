"""A family added in this file alone (issue 41): a tied GPT-2 parent with the normalized head, registered with
``register_family`` and ``register_with_auto_classes``. With no edit to the package it trains, saves and reloads
through the Auto classes, converts from a GPT-2 checkpoint 1:1, exports back to ``GPT2LMHeadModel`` and names itself
on its card: every per-family answer is its row's. (A family that also travels as remote code keeps its config and
modeling classes in the flat model layer: utils/generate_remote_code.py inlines them into a saved model's files.)"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from transformers import AutoModelForCausalLM, GenerationMixin, GPT2Config, GPT2LMHeadModel, GPT2Model
from transformers.models.gpt2.modeling_gpt2 import GPT2PreTrainedModel

from hf_tiednorm.conversion.convert import convert_checkpoint
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.modeling.families import table as families
from hf_tiednorm.modeling.families.common import TiedNormLMMixin, build_head, build_output_projection
from hf_tiednorm.modeling.families.configuration import TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin
from hf_tiednorm.modeling.families.embeddings import build_embedding
from hf_tiednorm.modeling.families.outputs import TiedNormCausalLMOutput
from hf_tiednorm.modeling.weight_checks import WeightChecksMixin
from hf_tiednorm.publishing.model_card import render_model_card

TINY = dict(vocab_size=61, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2)


@strict
class ToyGPT2Config(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, GPT2Config):
    model_type = "tiednorm_toy_gpt2"
    input_embedding_path = "transformer.wte"
    tie_word_embeddings: bool = True


class ToyGPT2ForCausalLM(WeightChecksMixin, TiedNormLMMixin, GPT2PreTrainedModel, GenerationMixin):
    config_class = ToyGPT2Config

    def __init__(self, config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.transformer.wte = build_embedding(config, config.vocab_size, config.n_embd)  # l2 lookups, the tie
        self.output_projection = build_output_projection(config, config.n_embd)
        self.lm_head = build_head(config, config.n_embd, config.vocab_size)
        self.post_init()

    def _extra_auto_map(self) -> dict[str, str]:
        return {}

    def forward(self, input_ids=None, attention_mask=None, labels=None, num_items_in_batch=None, **kwargs):
        outputs = self.transformer(input_ids=input_ids, attention_mask=attention_mask, **kwargs)
        next_tokens = None if labels is None else F.pad(labels, (0, 1), value=-100)[:, 1:]
        logits, loss, terms = self.score_and_loss(outputs.last_hidden_state, next_tokens, num_items_in_batch)
        return TiedNormCausalLMOutput(loss=loss, logits=logits, **terms)


@pytest.fixture(scope="module")
def toy_family():
    row = families.register_family(families.ModelFamily(
        "toy_gpt2", ToyGPT2Config, None, ToyGPT2ForCausalLM, AutoModelForCausalLM, GPT2Config, "GPT-2-style toy LM",
        "gpt2", GPT2LMHeadModel, cpu_bf16_eager_attention=False,
    ))  # fmt: skip
    families.register_with_auto_classes(row)
    yield row
    del families.FAMILIES[row.name], families.ROWS[row.model_type]  # the other tests wrap GPT-2 sources


def test_a_family_registered_in_a_test_trains_saves_converts_exports_and_names_itself(toy_family, tmp_path):
    torch.manual_seed(0)
    model = ToyGPT2ForCausalLM(ToyGPT2Config(**TINY, head_mode="cosine", logit_scale_kind="vector")).train()
    ids = torch.randint(4, 61, (2, 9))
    before = model.lm_head.weight.detach().clone()
    model(input_ids=ids, labels=ids).loss.backward()
    torch.optim.SGD(model.parameters(), lr=0.5).step()
    assert not torch.equal(before, model.lm_head.weight)  # it trains, through the tied matrix
    assert model.lm_head.weight is model.transformer.wte.weight
    model.eval().save_pretrained(tmp_path / "trained")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "trained").eval()
    assert type(reloaded) is ToyGPT2ForCausalLM
    torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)

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
    assert "GPT-2-style toy LM" in card.text
