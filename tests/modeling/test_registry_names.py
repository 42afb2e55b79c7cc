"""Every name a registry takes is checked against what it could shadow (issue 48, cases 1-5): a head mode may not
redefine a built-in one (a saved config records the name only), a head term may not replace what the head holds
or be a name that is no parameter or flag, a converter flag of an option is never accepted and dropped, a lossless
start with an option that changes the scores is refused, and ``extra_terms`` is a tuple of names, not a string."""

from __future__ import annotations

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from testing_utils import model_inputs, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.conversion.convert import build_parser
from hf_tiednorm.conversion.field_flags import head_settings_from_flags
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.head.modes import Cosine, get_head_mode, inverse_row_norms
from hf_tiednorm.modeling.head.settings import HEAD_TERMS, HeadSettings
from hf_tiednorm.modeling.head.terms import ExtraHeadTerm
from hf_tiednorm.registration.head_modes import register_head_mode, unregister_head_mode
from hf_tiednorm.registration.head_terms import register_head_term


class SharpCosine(Cosine):
    """cosine times 3: what a user's redefinition of the built-in name scored."""

    lossless_start = None

    def column_terms(self, weight, eps):
        return 3 * inverse_row_norms(weight, eps), None


def neutral_fold(term, scale, bias):
    return scale, bias


def divide_fold(tau, scale, bias):
    return (1 / tau if scale is None else scale / tau), (None if bias is None else bias / tau)


@pytest.fixture
def options_cleanup():
    before = dict(HEAD_TERMS)
    yield
    HEAD_TERMS.clear()
    HEAD_TERMS.update(before)


@pytest.mark.parametrize("name", ["baseline", "l2", "square", "distance", "cosine"])
def test_a_builtin_mode_can_be_neither_redefined_nor_unregistered(name):
    """Case 1: register_head_mode(..., replace=True) redefined cosine; the model saved its name only and reloaded in
    a fresh process as the built-in cosine, logits 7.9 off, no error."""
    original = get_head_mode(name)
    redefined = SharpCosine()
    redefined.name = name
    with pytest.raises(ValueError, match=rf"head mode '{name}' is built in .*cannot be redefined, even with replace"):
        register_head_mode(redefined, replace=True)
    with pytest.raises(ValueError, match=rf"head mode '{name}' is built in and cannot be unregistered"):
        unregister_head_mode(name)
    assert get_head_mode(name) is original
    assert register_head_mode(original, replace=True) is original  # the built-in object itself changes nothing


def test_a_mode_registered_at_runtime_may_still_be_replaced():
    first, second = SharpCosine(), SharpCosine()
    first.name = second.name = "sharp"
    register_head_mode(first)
    try:
        assert register_head_mode(second, replace=True) is get_head_mode("sharp") is second
    finally:
        unregister_head_mode("sharp")


@pytest.mark.parametrize("name", ["norm_eps", "weight", "settings", "logit_scale_init", "head_mode", "mode", "forward",
                                  "extra_terms", "training"])
def test_a_head_option_may_not_take_a_name_the_head_holds(name, options_cleanup):
    """Case 2: an option named norm_eps replaced the head's attribute (logits 1.77 off at its neutral init);
    weight / settings crashed in torch with errors naming neither the option nor the registry."""
    with pytest.raises(ValueError, match=rf"head term name '{name}' \(register_head_term\) is taken by the head"):
        register_head_term(ExtraHeadTerm(name, "h", 1.0, neutral_fold, "c"))
    assert name not in HEAD_TERMS


@pytest.mark.parametrize("name", ["", "a.b", "logit-temperature", "_private", "class", "two words", 3])
def test_a_head_option_name_must_be_a_parameter_and_a_flag(name, options_cleanup):
    """Cases 2-3: '' and 'a.b' crashed in torch; 'logit-temperature' got a tiednorm-convert flag that was accepted
    and dropped (the flag's destination is logit_temperature, the lookup used the dashed name)."""
    with pytest.raises(ValueError, match=r"must be a Python identifier not starting with '_'"):
        register_head_term(ExtraHeadTerm(name, "h", 1.0, neutral_fold, "c"))
    assert name not in HEAD_TERMS


@pytest.mark.parametrize("name", ["generic", "license", "output_dir", "source"])
def test_a_head_option_whose_flag_the_converter_has_is_refused_by_name(name, options_cleanup):
    """Case 3's class: an option named like a converter argument would read that argument's value (output_dir: the
    folder, always truthy) or clash with its flag."""
    register_head_term(ExtraHeadTerm(name, "h", 1.0, neutral_fold, "c"))
    with pytest.raises(ValueError, match=rf"head term '{name}' \(register_head_term\) would be the flag "
                                         rf"--{name.replace('_', '-')} of tiednorm-convert, which already has"):
        build_parser()


def test_a_registered_option_flag_switches_the_option_on(options_cleanup):
    register_head_term(ExtraHeadTerm("logit_temperature", "h", 1.0, divide_fold, "c"))
    parser = build_parser()
    assert head_settings_from_flags(parser.parse_args(["a", "b"])).extra_terms == ()
    on = head_settings_from_flags(parser.parse_args(["a", "b", "--logit-temperature"]))
    assert on.extra_terms == ("logit_temperature",)


def test_a_lossless_start_with_an_option_that_changes_the_scores_is_refused(options_cleanup):
    """Case 4: a registered term whose init is not neutral (a temperature starting at 2) was recorded as lossless
    while the logits were 0.36 off the source's."""
    register_head_term(ExtraHeadTerm("hot", "h", 2.0, divide_fold, "c"))
    register_head_term(ExtraHeadTerm("cool", "h", 1.0, divide_fold, "c"))
    with pytest.raises(ValueError, match=r"lossless_start cannot give back the source's logits with the registered "
                                         r"head term\(s\) \['hot'\] \(hot init=2.0\)"):
        normalize_tied_head(source_model("llama"), settings=HeadSettings(head_mode="cosine", extra_terms=("hot",)),
                            lossless_start=True)
    source = source_model("llama").eval()
    inputs = model_inputs(source)
    with torch.no_grad():
        expected = source(**inputs).logits
    converted = normalize_tied_head(source, settings=HeadSettings(head_mode="cosine", extra_terms=("cool",)),
                                    lossless_start=True)
    assert converted.config.lossless_start
    with torch.no_grad():
        torch.testing.assert_close(converted.eval()(**inputs).logits, expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("extra", ["logit_temperature", b"logit_temperature", 7, ("logit_temperature", 7)])
def test_extra_terms_is_a_tuple_of_names(extra, options_cleanup):
    """Case 5: a string crashed with a message listing its single characters as unknown options."""
    register_head_term(ExtraHeadTerm("logit_temperature", "h", 1.0, divide_fold, "c"))
    with pytest.raises(ValueError, match=r"extra_terms must be a tuple of registered head term names, got"):
        HeadSettings(extra_terms=extra)
    with pytest.raises(StrictDataclassError, match=r"extra_terms must be a tuple .*extra_terms=\('logit_temperature',"):
        tiny_model("causal", extra_terms="logit_temperature")  # the config's own check
    with pytest.raises(ValueError, match="names a head term twice"):
        HeadSettings(extra_terms=("logit_temperature", "logit_temperature"))
    assert HeadSettings(extra_terms=["logit_temperature"]).extra_terms == ("logit_temperature",)  # config.json's list
