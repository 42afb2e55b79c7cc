"""The plain export asks the head-mode registry (hf_tiednorm/modeling/head/modes.py) what a mode is — its column terms,
its input lookups, its equation for the card — and compares no mode name: a toy sixth mode, registered in this test
alone, with unit-row input lookups and a bias term of its own, exports with the source's logits."""

from __future__ import annotations

import pytest
import torch
from testing_utils import model_inputs, tiny_model

from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.modeling.head.modes import HeadMode, inverse_row_norms
from hf_tiednorm.registration.head_modes import register_head_mode, unregister_head_mode

TOY = "root_shift"
TOY_EQUATION = "s_i = ŵ_i·h·‖w_i‖^½ − ‖w_i‖/10 (toy), with unit-row input lookups"


class RootShift(HeadMode):
    """s_i = w_i·h/‖w_i‖^½ − ‖w_i‖/10, looking up ŵ_i at the input like l2: every question the export asks (scale,
    bias, lookups, equation) has an answer that no built-in mode gives."""

    name, equation, paper, summary = TOY, TOY_EQUATION, "a test's own mode", "toy"
    normalizes_input_lookups = True
    keeps_row_norms = False

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps, power=0.5), -0.1 * torch.linalg.vector_norm(weight.float(), dim=-1)


@pytest.fixture
def toy_mode():
    register_head_mode(RootShift())
    try:
        yield TOY
    finally:
        unregister_head_mode(TOY)


@torch.no_grad()
def logits_of(model, inputs):
    return model(**inputs).logits.float()


@pytest.mark.parametrize("logit_scale", ["none", "vector"])
def test_a_registered_mode_with_its_own_lookups_and_bias_exports_with_equal_logits(toy_mode, logit_scale, tmp_path):
    source = tiny_model("seq2seq", head_mode=toy_mode, logit_scale_kind=logit_scale)
    with torch.no_grad():
        if source.lm_head.logit_scale is not None:
            source.lm_head.logit_scale.uniform_(0.5, 2.0, generator=torch.Generator().manual_seed(0))
    result = export_plain(source, tmp_path / "out")
    assert result.parent == "MarianMTModel" and result.bias_slot == "final_logits_bias"
    inputs = model_inputs(source)
    torch.testing.assert_close(logits_of(result.model, inputs), logits_of(source, inputs), rtol=0, atol=1e-4)
    embedding = result.model.get_input_embeddings().weight
    torch.testing.assert_close(embedding.norm(dim=-1)[1:], torch.ones(embedding.shape[0] - 1))  # the toy lookups
    reloaded = type(result.model).from_pretrained(tmp_path / "out").eval()
    torch.testing.assert_close(logits_of(reloaded, inputs), logits_of(source, inputs), rtol=0, atol=1e-4)
    card = (tmp_path / "out" / "README.md").read_text()
    assert TOY_EQUATION in card and f"--head-mode {TOY} --lossless-start" not in card  # no lossless start declared


def test_a_registered_mode_whose_bias_llama_cannot_hold_is_refused_naming_the_mode(toy_mode):
    with pytest.raises(ValueError, match=f"head_mode '{TOY}'.*{TOY_EQUATION[:10]}"):
        export_plain(tiny_model("causal", head_mode=toy_mode))
