"""What Hugging Face's common model tests found in our own families, checked directly (so that the default run
holds them even where the transformers sdist's tests are absent; issue 46)."""

from __future__ import annotations

import pytest
import torch
from testing_utils import model_inputs, tiny_model

FAMILIES = ("causal", "seq2seq", "bart")


@pytest.mark.parametrize("family", FAMILIES)
def test_return_dict_false_gives_the_tuple(family):
    model = tiny_model(family)
    inputs = model_inputs(model)
    with torch.no_grad():
        expected = model(**inputs).logits
        as_tuple = model(**inputs, return_dict=False)
    assert isinstance(as_tuple, tuple)
    torch.testing.assert_close(as_tuple[0], expected)


def test_the_causal_loss_reads_shift_labels():
    """``shift_labels`` (already aligned, as sequence/context parallel training passes them) replace the shifted
    ``labels``: the loss is the one of the labels they were shifted from, whatever ``labels`` holds."""
    model = tiny_model("causal")
    ids = model_inputs(model)["input_ids"]
    shifted = torch.nn.functional.pad(ids, (0, 1), value=-100)[:, 1:]
    with torch.no_grad():
        expected = model(input_ids=ids, labels=ids).loss
        given = model(input_ids=ids, labels=torch.zeros_like(ids), shift_labels=shifted).loss
    torch.testing.assert_close(given, expected)


@pytest.mark.parametrize(("fields", "kept"), [
    ({}, set()),
    ({"logit_scale_kind": "vector"}, {"logit_scale"}),
    ({"logit_scale_kind": "scalar", "logit_bias": True}, {"logit_scale", "logit_bias"}),
])
def test_keep_in_fp32_names_only_the_head_terms_the_model_has(fields, kept):
    model = tiny_model("causal", **fields)
    assert set(model._keep_in_fp32_modules_strict) == kept
