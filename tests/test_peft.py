"""PEFT never bypasses the normalized tied head: what it supports is exact, what would bypass it is refused.

One parametrized set over a decoder (Qwen3) and an encoder-decoder (T5), in cosine and l2 mode (l2 also normalizes
the lookups, which an adapter on the embedding would bypass).
"""

from __future__ import annotations

import pytest
import torch
from testing_utils import tiny_model
from tiny_architectures import auto_class, inputs_for, source_model

from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.head.layer import TiedNormHead
from hf_tiednorm.modeling.head.peft_guard import check_head_not_bypassed

peft = pytest.importorskip("peft")

ATTENTION = {"qwen3": ["q_proj", "v_proj"], "t5": ["q", "v"]}
CASES = [(name, mode) for name in ATTENTION for mode in ("cosine", "l2")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each (architecture, mode) converted once and saved."""
    folders = {}
    for name, mode in CASES:
        folder = tmp_path_factory.mktemp(f"{name}_{mode}")
        normalize_tied_head(source_model(name), mode, generic=True).save_pretrained(folder)
        folders[name, mode] = folder
    return folders


def load(folder, name: str):
    return auto_class(source_model(name).config).from_pretrained(folder).eval()


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def assert_head_intact(model) -> None:
    head = model.get_output_embeddings()
    assert isinstance(head, TiedNormHead) and head.weight is model.get_input_embeddings().weight


@pytest.mark.parametrize(("name", "mode"), CASES)
def test_lora_on_attention_is_exact(name, mode, converted, tmp_path):
    base = load(converted[name, mode], name)
    inputs = inputs_for(base)
    before = logits(base, inputs)
    # Random (non-zero) adapter weights, as after training.
    model = peft.get_peft_model(base, peft.LoraConfig(target_modules=ATTENTION[name], init_lora_weights=False))
    assert_head_intact(model.get_base_model())
    unmerged = logits(model, inputs)
    assert not torch.allclose(unmerged, before)  # the adapter is active
    model.save_pretrained(tmp_path / "adapter")

    reloaded = peft.PeftModel.from_pretrained(load(converted[name, mode], name), tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded, inputs), unmerged, rtol=0, atol=0)
    merged = model.merge_and_unload()
    assert_head_intact(merged)
    torch.testing.assert_close(logits(merged, inputs), unmerged, rtol=0, atol=2e-6)


def test_training_the_shared_embedding_with_the_adapter_is_exact(converted, tmp_path):
    # The way PEFT_EMBEDDING_ADVICE gives: unfreeze the shared matrix, save it with the adapter.
    base = load(converted["qwen3", "l2"], "qwen3")
    inputs = inputs_for(base)
    model = peft.get_peft_model(base, peft.LoraConfig(target_modules=ATTENTION["qwen3"]))
    weight = model.get_input_embeddings().weight
    weight.requires_grad_(True)
    loss = model(**inputs, labels=inputs["input_ids"]).loss
    loss.backward()
    assert weight.grad is not None and weight.grad.abs().sum() > 0  # through the lookups and the normalized head
    with torch.no_grad():
        weight.add_(torch.randn_like(weight) * 0.1)  # as a training step would
    trained = logits(model, inputs)
    model.save_pretrained(tmp_path / "adapter", save_embedding_layers=True)

    reloaded = peft.PeftModel.from_pretrained(load(converted["qwen3", "l2"], "qwen3"), tmp_path / "adapter")
    assert_head_intact(reloaded.get_base_model())
    torch.testing.assert_close(logits(reloaded, inputs), trained, rtol=0, atol=0)
    torch.testing.assert_close(logits(model.merge_and_unload(), inputs), trained, rtol=0, atol=2e-6)


REFUSED = {
    "trainable_token_indices": (
        lambda target: peft.LoraConfig(target_modules=target, trainable_token_indices=[5, 6]),
        "trainable_token_indices scores and looks up tokens with the raw matrix",
    ),
    "TrainableTokensConfig": (
        lambda target: peft.TrainableTokensConfig(token_indices=[5, 6]),
        "trainable_token_indices scores and looks up tokens with the raw matrix",
    ),
    "lora_on_lm_head": (
        lambda target: peft.LoraConfig(target_modules=["lm_head"]),
        "lm_head is wrapped by Linear: an adapter there adds an unnormalized term",
    ),
    "lora_on_embedding": (
        lambda target: peft.LoraConfig(target_modules=["embed_tokens", "shared"]),
        "is wrapped by Embedding: an adapter there adds an unnormalized term",
    ),
    "modules_to_save_lm_head": (
        lambda target: peft.LoraConfig(target_modules=target, modules_to_save=["lm_head"], ensure_weight_tying=True),
        "is wrapped by ModulesToSaveWrapper: PEFT.s modules_to_save trains a copy",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
@pytest.mark.parametrize(("name", "mode"), CASES)
def test_peft_that_would_bypass_the_head_is_refused(name, mode, case, converted):
    make_config, message = REFUSED[case]
    model = peft.get_peft_model(load(converted[name, mode], name), make_config(ATTENTION[name]))
    inputs = inputs_for(model.get_base_model())
    with pytest.raises(ValueError, match=message) as refused:
        model(**inputs)
    assert "requires_grad_(True)" in str(refused.value)  # it says what to do instead
    with pytest.raises(ValueError, match=message):
        model.generate(input_ids=inputs["input_ids"], max_new_tokens=2)


@pytest.mark.parametrize("case", list(REFUSED))
def test_our_own_families_refuse_the_same_cases(case):
    make_config, message = REFUSED[case]
    allowed = peft.get_peft_model(tiny_model("causal", head_mode="l2"), peft.LoraConfig(target_modules=["q_proj"]))
    inputs = {"input_ids": torch.randint(4, 61, (2, 6))}
    allowed(**inputs)
    allowed.generate(**inputs, max_new_tokens=2)
    refused = peft.get_peft_model(tiny_model("causal", head_mode="l2"), make_config(["q_proj"]))
    with pytest.raises(ValueError, match=message):
        refused(**inputs)
    with pytest.raises(ValueError, match=message):
        refused.generate(**inputs, max_new_tokens=2)
    check_head_not_bypassed(allowed)  # callable on any model too
