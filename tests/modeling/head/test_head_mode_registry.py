"""A head mode is described once (hf_tiednorm/modeling/head/modes.py): a sixth mode defined and registered in this test
alone, with no edit to the package, trains in every family, saves and reloads, writes its card, is a choice of both
training scripts and converts with the lossless start it declares; a saved folder's remote code, which does not define
it, refuses it by name."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from script_helpers import load_script
from testing_utils import FAMILIES, model_inputs, run_without_package, tiny_model
from tiny_architectures import inputs_for, source_model
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from hf_tiednorm import HEAD_MODES
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.modeling.head.modes import HeadMode, get_head_mode, inverse_row_norms
from hf_tiednorm.publishing.model_card import write_model_card
from hf_tiednorm.registration.head_modes import register_head_mode, unregister_head_mode
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
        assert model.config.head_mode == toy_mode and model.config.logit_scale_kind == "vector"
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
    with pytest.raises(ValueError, match="'cosine' is built in"):
        register_head_mode(taken)
    bad = RootNorm()
    bad.lossless_start = ("temperature",)
    with pytest.raises(ValueError, match="logit_scale"):
        register_head_mode(bad)


def rows(weight: torch.Tensor) -> int:
    return weight.shape[0]


# What a user's column_terms may get wrong, and the term the refusal names (U9 of issue 40).
BAD_TERMS = {
    "a (V, 1) scale": (lambda w: (torch.ones(rows(w), 1), None), r"a scale of shape \(7, 1\) .*must have shape \(7,\)"),
    "a (d,) bias": (lambda w: (None, torch.zeros(w.shape[1])), r"a bias of shape \(5,\) .*must have shape \(7,\)"),
    "a Python float scale": (lambda w: (2.0, None), r"a float as its scale \(2.0\); it must be a tensor"),
    "an integer bias": (lambda w: (None, torch.ones(rows(w), dtype=torch.long)), r"a torch.int64 bias; .*floating"),
    "one tensor": (lambda w: torch.ones(rows(w)), r"Tensor .*it must return a pair \(scale, bias\)"),
    "a scale on another device": (lambda w: (torch.ones(rows(w), device="meta"), None), r"its scale on meta, the"),
}


@pytest.mark.parametrize("case", BAD_TERMS)
def test_a_mode_returning_bad_column_terms_is_refused_naming_the_mode_and_the_term(case):
    terms, message = BAD_TERMS[case]

    class Bad(HeadMode):
        name, equation = "bad_terms", "s_i = ?"

        def column_terms(self, weight, eps):
            return terms(weight)

    instance = HeadMode()  # the same terms set on an instance instead of a subclass
    instance.name, instance.column_terms = "bad_terms", lambda weight, eps: terms(weight)
    for mode in (Bad(), instance):
        try:
            with pytest.raises(
                (TypeError, ValueError), match=rf"head mode 'bad_terms': column_terms returned {message}"
            ):
                register_head_mode(mode)
            assert "bad_terms" not in HEAD_MODES
        finally:
            unregister_head_mode("bad_terms")


class SevenRows(HeadMode):
    """Right on the 7-row registration probe, wrong for any other vocabulary: checked where a model uses it too."""

    name, equation = "seven_rows", "s_i = w_i·h·2"

    def column_terms(self, weight, eps):
        return torch.full((7,), 2.0), None


@pytest.mark.parametrize("length", [2, 40])  # tokens ≤ d scale the logits, tokens > d the rows of W
def test_a_wrong_shape_is_refused_where_the_model_uses_the_mode_for_every_batch(length):
    register_head_mode(SevenRows())
    try:
        model = tiny_model("causal", head_mode="seven_rows")
        inputs = model_inputs(model, batch_size=1, length=length)
        with pytest.raises(ValueError, match=r"head mode 'seven_rows': column_terms returned a scale of shape \(7,\)"):
            model(**inputs)
    finally:
        unregister_head_mode("seven_rows")


def test_a_0_dim_term_stands_for_one_value_for_every_row():
    class Doubled(HeadMode):
        name, equation = "doubled", "s_i = 2·w_i·h − 1"

        def column_terms(self, weight, eps):
            return torch.tensor(2.0, device=weight.device), torch.tensor(-1.0, device=weight.device)

    register_head_mode(Doubled())
    try:
        head = tiny_model("causal", head_mode="doubled").get_output_embeddings()
        scale, bias = head.mode.column_terms(head.weight, head.norm_eps)
        assert scale.shape == bias.shape == (head.weight.shape[0],) and scale.dtype == torch.float32
        for tokens in (3, 40):
            hidden = torch.randn(tokens, head.weight.shape[1])
            with torch.no_grad():
                torch.testing.assert_close(head(hidden), 2 * hidden @ head.weight.T - 1)
    finally:
        unregister_head_mode("doubled")


class Shifted(RootNorm):
    """s_i = w_i·h/‖w_i‖^½ − 0.1: a bias term that only a logit bias can undo."""

    name = "root_shifted"

    def column_terms(self, weight, eps):
        scale, _ = super().column_terms(weight, eps)
        return scale, torch.full_like(scale, -0.1)


LOSSLESS_REFUSAL = (
    r"head mode '{}' declares lossless_start=\('logit_scale',\), but its lossless_terms do not give back the plain "
    r"scores .*g_i·bias_i \+ b_i = -0\.\d+ \(must be 0\)"
)


def test_a_lossless_start_that_cannot_undo_the_modes_bias_is_refused_when_registered():
    try:
        with pytest.raises(ValueError, match=LOSSLESS_REFUSAL.format("root_shifted")):
            register_head_mode(Shifted())
        assert "root_shifted" not in HEAD_MODES
    finally:
        unregister_head_mode("root_shifted")


def test_a_lossless_start_that_declares_the_bias_too_converts_with_the_sources_logits():
    class ShiftedWithBias(Shifted):
        lossless_start = ("logit_scale", "logit_bias")

    register_head_mode(ShiftedWithBias())
    try:
        source = source_model("llama")
        inputs = inputs_for(source)
        with torch.no_grad():
            expected = source(**inputs).logits
            converted = normalize_tied_head(copy.deepcopy(source), "root_shifted", lossless_start=True).eval()
            torch.testing.assert_close(converted(**inputs).logits, expected, rtol=0, atol=1e-5)
    finally:
        unregister_head_mode("root_shifted")


class ShiftedAboveTen(RootNorm):
    """s_i = w_i·h/‖w_i‖^½ − 0.1·[‖w_i‖ > 10]: its plain lossless start holds on the small registration probe and
    fails on a weight with a long row, so it is verified on the weights being converted too."""

    name = "root_shifted_above_ten"

    def column_terms(self, weight, eps):
        scale, _ = super().column_terms(weight, eps)
        return scale, -0.1 * (torch.linalg.vector_norm(weight.float(), dim=-1) > 10).float()


def test_a_lossless_start_is_verified_on_the_weights_it_converts():
    register_head_mode(ShiftedAboveTen())
    try:
        source = source_model("llama")
        with torch.no_grad():
            source.get_input_embeddings().weight[5] *= 100
        with pytest.raises(ValueError, match=r"head mode 'root_shifted_above_ten' .* at row 5 of"):
            normalize_tied_head(source, "root_shifted_above_ten", lossless_start=True)
    finally:
        unregister_head_mode("root_shifted_above_ten")


def test_a_lossless_term_the_start_does_not_declare_is_refused():
    class ExtraBias(RootNorm):
        name = "root_extra_bias"

        def lossless_terms(self, weight, eps):
            g, _ = super().lossless_terms(weight, eps)
            return g, torch.zeros_like(g)

    try:
        with pytest.raises(ValueError, match=r"'root_extra_bias': lossless_terms returned a logit_bias but lossless_"):
            register_head_mode(ExtraBias())
    finally:
        unregister_head_mode("root_extra_bias")


# --- issue 58, cases 1 and 2: a mode's name keeps its definition while a model lives; a refused save writes nothing --


class Scaled(HeadMode):
    """s_i = c·(w_i·h): two definitions under one name differ by their c (the issue's logits × 0.5)."""

    def __init__(self, name: str, c: float) -> None:
        self.name, self.c, self.equation = name, c, f"s_i = {c}·w_i·h"

    def column_terms(self, weight, eps):
        return torch.full((weight.shape[0],), self.c, device=weight.device), None


LIVE = "scaled_live"
REFUSED_REDEFINITION = rf"head mode '{LIVE}' cannot be redefined while a model built with it lives"


def _family_model(family: str, head_mode: str):
    """A tiny model of ``family`` (the wrapper through normalize_tied_head) scoring with ``head_mode``."""
    if family == "wrapped":
        return normalize_tied_head(source_model("gpt2"), head_mode).eval()
    return tiny_model(family, head_mode=head_mode).eval()


# Each registration looks for live heads among the garbage collector's objects: seconds in a long test process. The
# causal family and the wrapper by default, the encoder-decoders with -m slow.
@pytest.mark.parametrize("family", [f if f in ("causal", "wrapped") else pytest.param(f, marks=pytest.mark.slow)
                                    for f in [*FAMILIES, "wrapped"]])
def test_a_mode_is_not_redefined_while_a_model_built_with_it_lives(family, tmp_path):
    """bcb37a5: register_head_mode(Scaled(c=0.25), replace=True) was accepted while a c = 0.5 model lived; the live
    model kept 0.5, its saved folder reloaded in the same process with 0.25 (logits × 0.5), no warning."""
    original = register_head_mode(Scaled(LIVE, 0.5))
    try:
        model = _family_model(family, LIVE)
        inputs = model_inputs(model) if family != "wrapped" else inputs_for(model)
        with pytest.raises(ValueError, match=REFUSED_REDEFINITION + r" .*Delete those models first"):
            register_head_mode(Scaled(LIVE, 0.25), replace=True)
        unregister_head_mode(LIVE)  # the other way to a new definition: unregister, then register another
        with pytest.raises(ValueError, match=REFUSED_REDEFINITION):
            register_head_mode(Scaled(LIVE, 0.25))
        assert register_head_mode(original) is original  # its own definition again: nothing changes
        model.save_pretrained(tmp_path)  # live model, saved folder and reload agree
        reloaded = type(model).from_pretrained(tmp_path).eval()
        with torch.no_grad():
            assert torch.equal(reloaded(**inputs).logits, model(**inputs).logits)
        copied = copy.deepcopy(model)  # a deep copy (TRL's reference model) scores with the same definition, and lives
        assert copied.get_output_embeddings().mode is original
        unpickled = pickle.loads(pickle.dumps(model))  # torch.save of a whole model: the mode pickles as its name
        assert unpickled.get_output_embeddings().mode is original
        unpickled.save_pretrained(tmp_path / "unpickled")
        del unpickled
        del model, reloaded
        with pytest.raises(ValueError, match=REFUSED_REDEFINITION):
            register_head_mode(Scaled(LIVE, 0.25), replace=True)
        del copied  # no model of the mode is left: it may be redefined
        assert register_head_mode(Scaled(LIVE, 0.25), replace=True).c == 0.25
    finally:
        unregister_head_mode(LIVE)


@pytest.mark.parametrize("family", [*FAMILIES, "wrapped"])
def test_a_refused_save_leaves_the_folder_as_it_was(family, tmp_path):
    """bcb37a5: the save of a model whose mode was unregistered wrote configuration_tiednorm.py and
    modeling_tiednorm.py, then refused; the folder held two .py files and no config.json, and failed later with
    transformers' "Should have a `model_type` key"."""
    register_head_mode(Scaled(LIVE, 0.5))
    try:
        model = _family_model(family, LIVE)
        config = copy.deepcopy(model.config)
    finally:
        unregister_head_mode(LIVE)
    refused = rf"is refused, and nothing was written: .*head mode <head mode '{LIVE}'.* is not registered"
    # Any refusal first (bcb37a5 raised the config validator's StrictDataclassError), then what it left behind, then
    # its words: so the old code fails on its debris, not only on its wording.
    with pytest.raises((ValueError, StrictDataclassError)) as refusal:
        model.save_pretrained(tmp_path / "new")
    assert sorted(path.name for path in tmp_path.iterdir()) == []  # bcb37a5: new/ with the two .py files, no config
    assert refusal.match(refused + r".*register_head_mode")
    # a folder holding an earlier save: every file as it was
    earlier = tmp_path / "earlier"
    tiny_model("causal").save_pretrained(earlier)
    before = {path.name: path.read_bytes() for path in earlier.iterdir()}
    with pytest.raises(ValueError, match=refused):
        model.save_pretrained(earlier)
    with pytest.raises(ValueError, match=r"(?s)is refused, and nothing was written: .*got 'scaled_live'.*register it"):
        config.save_pretrained(earlier)  # the config alone (its validation) refuses before its code files too
    assert {path.name: path.read_bytes() for path in earlier.iterdir()} == before
