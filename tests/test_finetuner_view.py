"""What a fine-tuner of a pretrained LLM sees (issue 43): cards that state only what is known, learned head terms
that stay fp32 and train under bf16 weights, one conversion route, wrapped configs that refuse own-family fields by
name, and run_clm's ``--validation_file None``."""

from __future__ import annotations

from script_helpers import load_script
from transformers import HfArgumentParser


def test_validation_file_none_means_no_evaluation():
    script = load_script("run_clm")
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses(
        ["--validation_file", "None", "--test_file", "none"]
    )
    assert data.validation_file is None and data.test_file is None
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses([])
    assert data.validation_file.endswith("val.en.gz")


# --- item 2: the head's learned terms stay fp32 under a bf16 load, on both routes, and train -------------------------

import pytest  # noqa: E402
import torch  # noqa: E402
from testing_utils import run_without_package  # noqa: E402
from tiny_architectures import inputs_for, source_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head  # noqa: E402

HEAD_TERMS = {"head_mode": "cosine", "lossless_start": True, "logit_bias": True}


def _head_terms(model) -> dict[str, torch.Tensor]:
    head = model.get_output_embeddings()
    return {"logit_scale": head.logit_scale, "logit_bias": head.logit_bias}


@pytest.fixture(scope="module", params=["llama", "gpt2"])  # an own family and a wrapped architecture
def saved_source(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{request.param}-source")
    source_model(request.param).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def converted(saved_source, tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted") / "c"
    convert_checkpoint(saved_source, folder, **HEAD_TERMS)
    return folder


@pytest.mark.parametrize("route", ["cli", "in_memory", "in_memory_generic"])
def test_head_terms_stay_fp32_under_a_bf16_load_and_train(saved_source, converted, route, tmp_path):
    if route == "cli":
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.bfloat16)
    else:
        source = AutoModelForCausalLM.from_pretrained(saved_source, dtype=torch.bfloat16)
        model = normalize_tied_head(source, generic=route == "in_memory_generic", **HEAD_TERMS)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert {name: t.dtype for name, t in _head_terms(model).items()} == dict.fromkeys(_head_terms(model), torch.float32)
    # One optimizer step at a small learning rate moves them (in bf16 it rounds away: 8 mantissa bits).
    before = {name: t.detach().clone() for name, t in _head_terms(model).items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    inputs = inputs_for(model)
    model.train()
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    optimizer.step()
    for name, tensor in _head_terms(model).items():
        assert not torch.equal(tensor.detach(), before[name]), f"{name} did not move in one step ({route})"
    # Saved and reloaded in bf16, they are fp32 again.
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    for name, tensor in _head_terms(reloaded).items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, _head_terms(model)[name].detach()), name


@pytest.mark.slow  # a fresh process without hf_tiednorm imports torch and transformers again (~6 s)
def test_head_terms_stay_fp32_in_remote_code(converted, tmp_path):
    out = run_without_package(
        f"""
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(converted)!r}, dtype=torch.bfloat16, trust_remote_code=True)
head = model.get_output_embeddings()
print(type(model).__module__.startswith("transformers_modules"), head.weight.dtype, head.logit_scale.dtype,
      head.logit_bias.dtype)
""",
        cwd=tmp_path,
    )
    assert out.split()[-4:] == ["True", "torch.bfloat16", "torch.float32", "torch.float32"]
