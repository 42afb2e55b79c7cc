"""The card describes the head as the weights hold it and lists only hf_tiednorm's settings (issue 35 item 4)."""

from __future__ import annotations

import torch
from testing_utils import tiny_model

from hf_tiednorm.publishing.model_card import render_model_card


def learned_scale(model):
    return next(p for name, p in model.named_parameters() if name.endswith("logit_scale"))


def test_a_lossless_start_scale_is_described_by_its_values(tmp_path):
    """A lossless start sets g_i = ‖w_i‖ (1.79-7.49 on SmolLM2); the card said "initialized to 1"."""
    model = tiny_model("causal", head_mode="cosine", logit_scale_kind="vector")
    with torch.no_grad():
        learned_scale(model).copy_(torch.linspace(1.79, 7.49, learned_scale(model).numel()))
    model.save_pretrained(tmp_path)
    text = render_model_card(tmp_path).text
    assert "g_i in 1.79–7.49 in these weights" in text and "initialized to 1" not in text


def test_unk_token_id_is_not_listed_as_an_hf_tiednorm_setting(tmp_path):
    model = tiny_model("causal")
    model.config.unk_token_id = 3
    model.save_pretrained(tmp_path)
    text = render_model_card(tmp_path).text
    assert "`unk_token_id`" not in text
