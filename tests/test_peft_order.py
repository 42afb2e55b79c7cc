"""``normalize_tied_head`` after ``get_peft_model``: refused, saying to normalize first (it was accepted with LoRA on
attention layers, whose saved keys then reloaded re-initialized; with LoRA on lm_head it failed with "got Linear"
and no word of PEFT)."""

from __future__ import annotations

import pytest
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head

peft = pytest.importorskip("peft")


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], ["lm_head"]])
@pytest.mark.parametrize("give", ["base model", "PeftModel"])
def test_normalizing_a_peft_wrapped_model_says_normalize_first(targets, give):
    base = source_model("llama")
    wrapped = peft.get_peft_model(base, peft.LoraConfig(target_modules=targets))
    with pytest.raises(ValueError, match=r"PEFT has wrapped already .*normalize first, then add adapters"):
        normalize_tied_head(base if give == "base model" else wrapped, "cosine")


def test_the_right_order_works():
    model = normalize_tied_head(source_model("llama"), "cosine")
    peft.get_peft_model(model, peft.LoraConfig(target_modules=["q_proj", "v_proj"]))
