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

from hf_tiednorm.convert import normalize_tied_head

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
        for term in (head_module.logit_scale, head_module.logit_bias):
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


@pytest.mark.parametrize("term", ["logit_scale", "logit_bias"])
@pytest.mark.parametrize("name", MODELS)
def test_a_learned_head_term_missing_from_the_weights_is_refused(name, term, tmp_path):
    cls = saved(name, tmp_path, logit_scale="vector", logit_bias=True)
    (key,) = drop_tensors(tmp_path, lambda key: key.endswith(f".{term}"))
    declared = "logit_scale='vector'" if term == "logit_scale" else "logit_bias=True"
    with pytest.raises(
        ValueError,
        match=rf"tensor '{key}' is missing from the weights, but config.json declares "
        rf"{declared}",
    ) as error:
        cls.from_pretrained(tmp_path)
    assert str(tmp_path) in str(error.value)


@pytest.mark.parametrize("name", MODELS)
def test_a_config_edited_to_drop_trained_terms_is_refused(name, tmp_path):
    cls = saved(name, tmp_path, logit_scale="scalar", logit_bias=True)
    edit_config(tmp_path, logit_scale="none", logit_bias=False)
    with pytest.raises(ValueError) as error:
        cls.from_pretrained(tmp_path)
    message = str(error.value)
    assert "the weights hold a trained" in message
    assert "config.json declares logit_scale='none'" in message and "config.json declares logit_bias=False" in message


@pytest.mark.parametrize("name", MODELS)
def test_a_config_edited_to_add_a_learned_scale_is_refused(name, tmp_path):
    cls = saved(name, tmp_path)
    edit_config(tmp_path, logit_scale="vector")
    with pytest.raises(
        ValueError,
        match=r"logit_scale' is missing from the weights, but config.json declares "
        r"logit_scale='vector'",
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
    cls = saved("wrapped-t5", tmp_path, logit_scale="vector", logit_bias=True)
    loaded, info = cls.from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_the_remote_code_refuses_too(tmp_path):
    saved("wrapped-gpt2", tmp_path / "model", logit_scale="vector")
    drop_tensors(tmp_path / "model", lambda key: key.endswith(".logit_scale"))
    out = run_without_package(
        f"""
from transformers import AutoModelForCausalLM
try:
    AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
except ValueError as error:
    print("refused" if "'model.lm_head.logit_scale' is missing" in str(error) else error)
""",
        cwd=tmp_path,
    )
    assert out.strip().splitlines()[-1] == "refused"
