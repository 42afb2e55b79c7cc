"""The PEFT guard walks the modules once per structural change, not at every forward (every decoding step), and still
refuses a bypass made after a check (hf_tiednorm/modeling/head/peft_guard.py); what it keeps is the model's own, no
torch global hook (issue 55)."""

from __future__ import annotations

import copy
import subprocess
import sys

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


def test_a_matrix_replaced_behind_torchs_registration_is_still_refused(walks):
    """A write into ``_parameters`` (as accelerate's set_module_tensor_to_device does) fires no torch registration
    hook, which the guard relied on before: it was let through."""
    model = tiny_model("causal")
    with torch.no_grad():
        model(**model_inputs(model))
    model.model.embed_tokens._parameters["weight"] = nn.Parameter(model.lm_head.weight.detach().clone())
    with pytest.raises(ValueError, match="no longer shares the input embedding"), torch.no_grad():
        model(**model_inputs(model))


def test_a_deep_copy_keeps_its_own_check(walks):
    model = tiny_model("causal")
    with torch.no_grad():
        model(**model_inputs(model))
    copied = copy.deepcopy(model)
    walks[0] = 0
    with torch.no_grad():
        copied(**model_inputs(copied))
    assert walks[0] == 0  # the kept objects were mapped to the copy's own
    copied.model.embed_tokens.weight = nn.Parameter(copied.lm_head.weight.detach().clone())  # unties the copy
    with pytest.raises(ValueError, match="no longer shares the input embedding"), torch.no_grad():
        copied(**model_inputs(copied))
    with torch.no_grad():
        model(**model_inputs(model))  # the original is untouched


GLOBAL_HOOKS = """
import torch
from torch.nn.modules import module
def hooks():
    return {name: len(value) for name, value in vars(module).items()
            if name.startswith("_global_") and isinstance(value, dict)}
before = hooks()
import hf_tiednorm
model = hf_tiednorm.TiedNormForCausalLM(hf_tiednorm.TiedNormCausalConfig(
    vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2))
model(input_ids=torch.tensor([[3, 4, 5]]))
print({name: count - before[name] for name, count in hooks().items() if count != before[name]})
"""


def test_importing_the_package_adds_no_torch_global_hook():
    """Before: a module and a parameter registration hook, process-wide, never removed (a loaded folder's code
    added another pair). A folder's code: tests/modeling/test_big_model_inference.py."""
    result = subprocess.run([sys.executable, "-c", GLOBAL_HOOKS], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "{}"
