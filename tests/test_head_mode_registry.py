"""A head mode is described once (hf_tiednorm/head_modes.py): a sixth mode defined and registered in this test alone,
with no edit to the package, trains in every family, saves and reloads, writes its card, is a choice of both training
scripts and converts with the lossless start it declares; a saved folder's remote code, which does not define it,
refuses it by name."""

from __future__ import annotations

import copy

import pytest
import torch
from script_helpers import load_script
from testing_utils import FAMILIES, model_inputs, run_without_package, tiny_model
from tiny_architectures import inputs_for, source_model
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from hf_tiednorm import HEAD_MODES
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.head_modes import HeadMode, get_head_mode, inverse_row_norms, register_head_mode, unregister_head_mode
from hf_tiednorm.publishing.model_card import write_model_card
from hf_tiednorm.training.arguments import argument_parser

TOY = "root"
TOY_EQUATION = "s_i = w_i·h / ‖w_i‖^½"


class RootNorm(HeadMode):
    """s_i = w_i·h/‖w_i‖^½, half-way between baseline and cosine; its lossless start is the generic g = 1/scale."""

    name, equation, paper, summary = TOY, TOY_EQUATION, "a test's own mode", "w_i·h/‖w_i‖^½"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps, power=0.5), None


def root_scores(weight: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """The toy mode's equation written out directly (float64); a dead (zero) row scores 0."""
    w = weight.double()
    norms = w.norm(dim=-1, keepdim=True)
    return hidden.double() @ (w / torch.where(norms > 1e-6, norms, torch.inf).sqrt()).T


@pytest.fixture
def toy_mode():
    register_head_mode(RootNorm())
    try:
        yield TOY
    finally:
        unregister_head_mode(TOY)


def train_one_step(model) -> None:
    inputs = model_inputs(model)
    labels = inputs.get("decoder_input_ids", inputs["input_ids"])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    loss = model(**inputs, labels=labels).loss
    loss.backward()
    before = model.get_output_embeddings().weight.detach().clone()
    optimizer.step()
    assert torch.isfinite(loss) and not torch.equal(before, model.get_output_embeddings().weight)
    model.eval()


@pytest.mark.parametrize("family", FAMILIES)
def test_a_registered_mode_trains_saves_reloads_and_writes_its_card_in_every_family(toy_mode, family, tmp_path):
    model = tiny_model(family, head_mode=toy_mode)
    assert model.get_output_embeddings().mode is get_head_mode(toy_mode)
    train_one_step(model)
    head = model.get_output_embeddings()
    hidden = torch.randn(3, head.weight.shape[1], dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(head(hidden.to(head.weight.dtype)).double(), root_scores(head.weight, hidden), atol=1e-4)
    inputs = model_inputs(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    reloaded = type(model).from_pretrained(tmp_path).eval()
    assert reloaded.config.head_mode == toy_mode
    with torch.no_grad():
        assert torch.equal(reloaded(**inputs).logits, expected)
    card = write_model_card(tmp_path).read_text()
    assert f"`{toy_mode}`: {TOY_EQUATION} (a test's own mode)" in card


def test_the_wrapped_family_trains_in_a_registered_mode(toy_mode):
    model = normalize_tied_head(source_model("gpt2"), toy_mode)
    train_one_step(model)
    assert model.config.head_mode == toy_mode


def test_a_saved_folders_remote_code_refuses_a_mode_its_files_do_not_define(toy_mode, tmp_path):
    tiny_model("causal", head_mode=toy_mode).save_pretrained(tmp_path / "model")
    out = run_without_package(
        f"""
from transformers import AutoModelForCausalLM
try:
    AutoModelForCausalLM.from_pretrained({str(tmp_path / "model")!r}, trust_remote_code=True)
except Exception as error:
    print("REFUSED", error)
else:
    print("LOADED")
""",
        cwd=tmp_path,
    )
    assert "REFUSED" in out and f"got '{toy_mode}'" in out, out


@pytest.mark.parametrize("script", ["run_translation", "run_clm"])
def test_a_registered_mode_is_a_choice_of_both_training_scripts(toy_mode, script):
    module = load_script(script)
    parser = argument_parser((module.ModelArguments,))
    (action,) = [action for action in parser._actions if "--head_mode" in action.option_strings]
    assert toy_mode in action.choices and tuple(action.choices) == tuple(HEAD_MODES)
    (arguments,) = parser.parse_args_into_dataclasses(args=["--head_mode", toy_mode])
    assert arguments.head_mode == toy_mode
    unregister_head_mode(toy_mode)
    with pytest.raises(SystemExit):  # argparse: invalid choice
        parser.parse_args_into_dataclasses(args=["--head_mode", toy_mode])


def test_a_registered_mode_converts_with_its_lossless_start(toy_mode, tmp_path):
    source = source_model("llama")
    inputs = inputs_for(source)
    with torch.no_grad():
        expected = source(**inputs).logits
    source.save_pretrained(tmp_path / "source")
    own = convert_checkpoint(tmp_path / "source", tmp_path / "own", head_mode=toy_mode, lossless_start=True)
    wrapped = normalize_tied_head(copy.deepcopy(source), toy_mode, lossless_start=True, generic=True).eval()
    for model in (own, wrapped):
        assert model.config.head_mode == toy_mode and model.config.logit_scale == "vector"
        with torch.no_grad():
            assert torch.allclose(model(**inputs).logits, expected, atol=1e-5)
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "own").eval()
    with torch.no_grad():
        assert torch.allclose(reloaded(**inputs).logits, expected, atol=1e-5)
    assert isinstance(source, LlamaForCausalLM)


def test_a_mode_without_a_lossless_start_is_refused_by_name(toy_mode):
    class NoStart(RootNorm):
        name, lossless_start, lossless_refusal = "root_no_start", None, "root_no_start has no lossless start"

    register_head_mode(NoStart())
    try:
        with pytest.raises(ValueError, match="root_no_start has no lossless start"):
            normalize_tied_head(source_model("llama"), "root_no_start", lossless_start=True)
    finally:
        unregister_head_mode("root_no_start")


def test_registering_refuses_a_taken_name_and_a_bad_lossless_term():
    with pytest.raises(ValueError, match="identifier as name"):
        register_head_mode(HeadMode())  # a bare HeadMode has no name
    taken = copy.copy(get_head_mode("cosine"))
    with pytest.raises(ValueError, match="'cosine' is registered already"):
        register_head_mode(taken)
    bad = RootNorm()
    bad.lossless_start = ("temperature",)
    with pytest.raises(ValueError, match="logit_scale"):
        register_head_mode(bad)
