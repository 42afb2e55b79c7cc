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


@pytest.mark.parametrize("family", (*FAMILIES, "wrapped_causal", "wrapped_seq2seq"))
def test_the_trainer_finds_labels_as_its_only_label_column(family):
    """The Trainer reads its label columns from the forward's signature (``find_labels``: every parameter naming a
    label) and computes an evaluation loss only for batches that hold all of them. ``shift_labels`` therefore
    comes through ``**kwargs``, as in HF's LMs: a named parameter cost ``run_clm --do_eval`` its ``eval_loss``."""
    from transformers.utils import find_labels

    import hf_tiednorm

    wrapped = {"wrapped_causal": hf_tiednorm.TiedNormWrappedForCausalLM,
               "wrapped_seq2seq": hf_tiednorm.TiedNormWrappedForSeq2SeqLM}
    model_class = wrapped[family] if family in wrapped else hf_tiednorm.FAMILIES[family].lm_class
    assert find_labels(model_class) == ["labels"]


@pytest.mark.parametrize(("fields", "kept"), [
    ({}, set()),
    ({"logit_scale_kind": "vector"}, {"logit_scale"}),
    ({"logit_scale_kind": "scalar", "logit_bias": True}, {"logit_scale", "logit_bias"}),
])
def test_keep_in_fp32_names_only_the_head_terms_the_model_has(fields, kept):
    model = tiny_model("causal", **fields)
    assert set(model._keep_in_fp32_modules_strict) == kept


@pytest.mark.parametrize("family", ("seq2seq", "bart"))
def test_a_bare_encoder_decoder_body_refuses_a_folder_without_its_shared_embedding(family, tmp_path):
    """HF's ``test_model_weights_reload_no_missing_tied_weights`` found the bodies loading such a folder with
    ``shared.weight`` left on the meta device and nothing reported; they refuse it by name as the LMs do, and still
    load their own folders and an LM's (transformers strips the ``model.`` prefix)."""
    from safetensors.torch import load_file, save_file

    model = tiny_model(family)
    body_class = type(model.model)
    model.model.save_pretrained(tmp_path / "body")
    weights = tmp_path / "body" / "model.safetensors"
    tensors = load_file(weights)
    del tensors["shared.weight"]
    save_file(tensors, weights, metadata={"format": "pt"})
    with pytest.raises(ValueError, match="'shared.weight' was not in the weights"):
        body_class.from_pretrained(tmp_path / "body")
    model.save_pretrained(tmp_path / "lm")
    loaded, info = body_class.from_pretrained(tmp_path / "lm", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    torch.testing.assert_close(loaded.shared.weight, model.model.shared.weight, rtol=0, atol=0)
