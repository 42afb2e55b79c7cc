"""The PEFT guard walks the modules once per structural change, not at every forward (every decoding step), and still
refuses a bypass made after a check (hf_tiednorm/modeling/head/peft_guard.py)."""

from __future__ import annotations

import pytest
import torch
from testing_utils import model_inputs, tiny_model
from torch import nn

from hf_tiednorm.modeling.head import peft_guard


@pytest.fixture
def walks(monkeypatch):
    count = [0]
    walk = peft_guard.check_head_not_bypassed

    def counting(model):
        count[0] += 1
        return walk(model)

    monkeypatch.setattr(peft_guard, "check_head_not_bypassed", counting)
    return count


def test_a_generation_walks_the_modules_once(walks):
    model = tiny_model("causal")
    prompt = model_inputs(model)["input_ids"][:1]
    model.generate(prompt, do_sample=False, max_new_tokens=6, min_new_tokens=6)
    assert walks[0] <= 1  # before: one walk per decoding step (7 forwards) plus one per generate
    walks[0] = 0
    with torch.no_grad():
        model(**model_inputs(model))
        model(**model_inputs(model))
    assert walks[0] == 0


def test_a_module_replaced_after_a_check_is_still_refused(walks):
    model = tiny_model("causal")
    with torch.no_grad():
        model(**model_inputs(model))
    head = model.lm_head

    class Wrapper(nn.Module):  # named like PEFT's wrapper, which the guard recognizes by class name
        def __init__(self, base):
            super().__init__()
            self.original_module = base

        def forward(self, x):
            return self.original_module(x)

    Wrapper.__name__ = "ModulesToSaveWrapper"
    model.lm_head = Wrapper(head)
    with pytest.raises(ValueError, match="lm_head is wrapped by ModulesToSaveWrapper"), torch.no_grad():
        model(**model_inputs(model))
    model.lm_head = head
    model.model.embed_tokens.weight = nn.Parameter(head.weight.detach().clone())  # unties the output layer
    with pytest.raises(ValueError, match="no longer shares the input embedding"), torch.no_grad():
        model(**model_inputs(model))
