"""A model folder loads as trained or not at all: a learned head term (``logit_scale``, ``logit_bias``) missing from
the weights, a config edited to contradict the weights, or weights without the shared embedding are errors at
``from_pretrained`` naming the tensor and the config field, for every family and the wrapper (also as remote code)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from testing_utils import FAMILIES, run_without_package, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.modeling.head.settings import HEAD_TERMS, HeadSettings
from hf_tiednorm.modeling.head.terms import head_terms

WRAPPED = ("gpt2", "t5")
# Every model of the package: its name, and a builder taking the head's learned-term options.
MODELS = [*FAMILIES, *(f"wrapped-{name}" for name in WRAPPED)]


def build(name: str, **head):
    if name.startswith("wrapped-"):
        return normalize_tied_head(source_model(name.removeprefix("wrapped-")), "cosine", generic=True, **head)
    return tiny_model(name, **head)


def saved(name: str, folder: Path, **head) -> type:
    """Save ``name`` with a trained-looking head (non-default g and b) in ``folder``; return its class."""
    model = build(name, **head)
    head_module = model.get_output_embeddings()
    with torch.no_grad():
        for term in (getattr(head_module, term.name, None) for term in head_terms()):
            if term is not None:
                term.uniform_(0.5, 2.0)
    model.save_pretrained(folder)
    return type(model)


def drop_tensors(folder: Path, predicate) -> list[str]:
    weights = load_file(folder / "model.safetensors")
    dropped = [key for key in weights if predicate(key)]
    assert dropped
    kept = {key: value for key, value in weights.items() if key not in dropped}
    save_file(kept, folder / "model.safetensors", metadata={"format": "pt"})
    return dropped


def edit_config(folder: Path, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | fields))


@pytest.mark.parametrize("term", [term.name for term in head_terms()])  # the built-in ones (an added one: its test)
@pytest.mark.parametrize("name", MODELS)
def test_a_learned_head_term_missing_from_the_weights_is_refused(name, term, tmp_path):
    cls = saved(name, tmp_path, logit_scale_kind="vector", logit_bias=True)
    (key,) = drop_tensors(tmp_path, lambda key: key.endswith(f".{term}"))
    declared = HEAD_TERMS[term].setting(HeadSettings(logit_scale_kind="vector", logit_bias=True))
    assert declared in ("logit_scale_kind='vector'", "logit_bias=True")  # as config.json states it
    with pytest.raises(
        ValueError,
        match=rf"tensor '{key}' is missing from the weights, but config.json declares "
        rf"{declared}",
    ) as error:
        cls.from_pretrained(tmp_path)
    assert str(tmp_path) in str(error.value)


@pytest.mark.parametrize("name", MODELS)
def test_a_config_edited_to_drop_trained_terms_is_refused(name, tmp_path):
    cls = saved(name, tmp_path, logit_scale_kind="scalar", logit_bias=True)
    edit_config(tmp_path, logit_scale_kind="none", logit_bias=False)
    with pytest.raises(ValueError) as error:
        cls.from_pretrained(tmp_path)
    message = str(error.value)
    assert "the weights hold a trained" in message
    assert "config.json declares logit_scale_kind='none'" in message
    assert "config.json declares logit_bias=False" in message


@pytest.mark.parametrize("name", MODELS)
def test_a_config_edited_to_add_a_learned_scale_is_refused(name, tmp_path):
    cls = saved(name, tmp_path)
    edit_config(tmp_path, logit_scale_kind="vector")
    with pytest.raises(
        ValueError,
        match=r"logit_scale' is missing from the weights, but config.json declares "
        r"logit_scale_kind='vector'",
    ):
        cls.from_pretrained(tmp_path)


@pytest.mark.parametrize("name", MODELS)
def test_weights_without_the_shared_embedding_are_refused(name, tmp_path):
    cls = saved(name, tmp_path)
    embedding = cls.from_pretrained(tmp_path).get_input_embeddings().weight.detach()
    stored = load_file(tmp_path / "model.safetensors")
    (key,) = drop_tensors(tmp_path, lambda k: stored[k].shape == embedding.shape and torch.equal(stored[k], embedding))
    with pytest.raises(ValueError, match=rf"tensor '{key}' .*(missing from the weights|left on the meta device)"):
        cls.from_pretrained(tmp_path)


def test_a_complete_folder_still_loads_exactly(tmp_path):
    cls = saved("wrapped-t5", tmp_path, logit_scale_kind="vector", logit_bias=True)
    loaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_the_remote_code_refuses_too(tmp_path):
    saved("wrapped-gpt2", tmp_path / "model", logit_scale_kind="vector")
    drop_tensors(tmp_path / "model", lambda key: key.endswith(".logit_scale"))
    # and a folder missing a layer tensor (own family), in the same process (one interpreter start)
    saved("causal", tmp_path / "layer")
    key = a_layer_tensor(load_file(tmp_path / "layer" / "model.safetensors"))
    drop_tensors(tmp_path / "layer", lambda k: k == key)
    out = run_without_package(
        f"""
from transformers import AutoModelForCausalLM
for folder, named in [({str(tmp_path / "model")!r}, "'model.lm_head.logit_scale' is missing"),
                      ({str(tmp_path / "layer")!r}, "'{key}' is missing from the weights: it would be initialized")]:
    try:
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    except ValueError as error:
        print("refused" if named in str(error) and folder in str(error) else error)
    else:
        print("loaded", folder)
""",
        cwd=tmp_path,
    )
    assert out.strip().splitlines()[-2:] == ["refused", "refused"], out


def a_layer_tensor(weights: dict) -> str:
    """A 2-d weight of the first layer (not the embedding, not a head term): Marian/BART's ``...layers.0.fc1``,
    Llama's ``...layers.0.mlp...``, GPT-2's ``...h.0.mlp...``, T5's ``...block.0.layer...``."""
    return next(key for key in sorted(weights) if ".0." in key and weights[key].dim() == 2)


@pytest.mark.parametrize("name", MODELS)
def test_weights_missing_a_layer_tensor_are_refused_naming_it_and_the_folder(name, tmp_path):
    cls = saved(name, tmp_path, logit_scale_kind="vector")
    key = a_layer_tensor(load_file(tmp_path / "model.safetensors"))
    drop_tensors(tmp_path, lambda k: k == key)
    with pytest.raises(
        ValueError, match=rf"tensor '{key}' is missing from the weights: it would be initialized"
    ) as error:
        cls.from_pretrained(tmp_path)
    assert str(tmp_path) in str(error.value)


@pytest.mark.parametrize("name", MODELS)
def test_weights_holding_a_tensor_the_model_has_no_place_for_are_refused(name, tmp_path):
    cls = saved(name, tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    key = a_layer_tensor(weights)
    extra = key.replace(".0.", ".7.")  # a layer the config does not build (e.g. weights of a deeper model)
    save_file(weights | {extra: weights[key].clone()}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=rf"the weights hold tensor '{extra}', which {cls.__name__} .*has no place"):
        cls.from_pretrained(tmp_path)


@pytest.mark.parametrize("name", ["llama", "gpt2", "marian"])  # our own family's route, the wrapper's, Marian's
def test_a_conversion_source_missing_a_layer_tensor_is_refused_naming_it(name, tmp_path):
    source_model(name).save_pretrained(tmp_path / "source")
    key = a_layer_tensor(load_file(tmp_path / "source" / "model.safetensors"))
    drop_tensors(tmp_path / "source", lambda k: k == key)
    with pytest.raises(ValueError, match=rf"cannot load {tmp_path / 'source'} .*\n  - tensor '{key}' is missing"):
        convert_checkpoint(tmp_path / "source", tmp_path / "out", head_mode="cosine", lossless_start=True)
    assert not (tmp_path / "out").exists()
