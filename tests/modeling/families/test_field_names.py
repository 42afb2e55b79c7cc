"""Our config fields do not collide with names the ecosystem reads with another meaning (issue 47): TRL, vLLM and
transformers' Cohere models read ``config.logit_scale`` as a float multiplier of the logits, so the head's scale kind
is ``logit_scale_kind``; configs and command lines written with the old name still work, with a deprecation message,
and the parameters keep their state-dict names, so saved weights load as they are."""

import json
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from testing_utils import FAMILIES, tiny_config, tiny_model
from tiny_architectures import source_model

import hf_tiednorm
from hf_tiednorm.conversion.convert import build_parser
from hf_tiednorm.conversion.field_flags import head_settings_from_flags
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.training.arguments import TiedNormModelArguments, argument_parser

# What TRL's add_fused_lm_head, vLLM and transformers' Cohere/Granite/Falcon-H1 read from a text config, as a float.
ECOSYSTEM_FLOAT_FIELDS = ("logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling",
                          "final_logit_softcapping")  # fmt: skip


@pytest.mark.parametrize("family", FAMILIES)
def test_no_field_is_a_name_the_ecosystem_reads_as_a_float_multiplier(family):
    config = tiny_config(family, head_mode="cosine", logit_scale_kind="vector", logit_bias=True)
    for name in ECOSYSTEM_FLOAT_FIELDS:
        assert getattr(config.get_text_config(), name, None) is None, name
        assert name not in config.to_dict(), name
    assert config.logit_scale_kind == "vector"


def test_the_wrapped_config_passes_the_wrapped_models_own_multiplier_through():
    """A wrapped model's text config keeps its own float ``logit_scale`` (Cohere's), which TRL reads."""
    model = normalize_tied_head(source_model("gpt2"), "cosine", logit_scale_kind="scalar", generic=True)
    assert getattr(model.config.get_text_config(), "logit_scale", None) is None
    assert model.config.logit_scale_kind == "scalar"


def _saved_with_old_name(model, folder):
    model.save_pretrained(folder)
    path = folder / "config.json"
    fields = json.loads(path.read_text())
    fields["logit_scale"] = fields.pop("logit_scale_kind")
    path.write_text(json.dumps(fields))


@pytest.mark.parametrize("family", ["causal", "seq2seq", "wrapped"])
def test_a_folder_saved_under_the_old_field_name_loads_with_a_deprecation_message(family, tmp_path):
    if family == "wrapped":
        model = normalize_tied_head(source_model("gpt2"), "cosine", logit_scale_kind="vector", generic=True)
    else:
        model = tiny_model(family, head_mode="cosine", logit_scale_kind="vector")
    with torch.no_grad():
        model.get_output_embeddings().logit_scale.uniform_(2.0, 3.0)  # a trained g, state-dict key unchanged
    _saved_with_old_name(model, tmp_path)
    with pytest.warns(FutureWarning, match="'logit_scale' is renamed 'logit_scale_kind'"):
        loaded = type(model).from_pretrained(tmp_path)
    assert loaded.config.logit_scale_kind == "vector"
    assert "logit_scale" not in loaded.config.to_dict()
    torch.testing.assert_close(loaded.get_output_embeddings().logit_scale, model.get_output_embeddings().logit_scale)


def test_the_old_name_as_a_keyword_is_accepted_too():
    with pytest.warns(FutureWarning, match="logit_scale_kind='scalar'"):
        config = hf_tiednorm.TiedNormCausalConfig(logit_scale="scalar")
    assert config.logit_scale_kind == "scalar"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"logit_scale": 2.0}, "logit_scale=2.0: hf_tiednorm's configs have no logit_scale field"),
        ({"logit_scale": "vector", "logit_scale_kind": "scalar"}, "contradicts logit_scale_kind='scalar'"),
    ],
)
def test_a_float_or_contradicting_old_field_is_refused_by_name(fields, message):
    with warnings.catch_warnings(), pytest.raises(ValueError, match=message):
        warnings.simplefilter("ignore", FutureWarning)
        hf_tiednorm.TiedNormCausalConfig(**fields)


@contextmanager
def _deprecated_unless_new(flag: str, new: str):
    """A FutureWarning naming ``flag`` and ``new`` where ``flag`` is an old name; no FutureWarning for ``new``."""
    if flag == new:
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            yield
    else:
        with pytest.warns(FutureWarning, match=rf"the flag {flag} is renamed {new} .* Write {new}"):
            yield


@pytest.mark.parametrize("flag", ["--logit-scale-kind", "--logit-scale", "--logit_scale"])
def test_the_converter_takes_the_new_flag_and_the_old_one_with_a_deprecation_message(flag, tmp_path):
    # issue 58 case 3, bcb37a5: --logit-scale was a silent alias
    with _deprecated_unless_new(flag, "--logit-scale-kind"):
        args = build_parser().parse_args(["src", str(tmp_path), "--head-mode", "cosine", flag, "vector"])
    assert head_settings_from_flags(args).logit_scale_kind == "vector"


@pytest.mark.parametrize("flag", ["--logit_scale_kind", "--logit_scale", "--logit-scale"])
def test_the_training_scripts_take_the_new_flag_and_the_old_ones_with_a_deprecation_message(flag):
    # issue 58 case 3, bcb37a5: --logit_scale a silent alias, --logit-scale "ambiguous option" (the last release's)
    with _deprecated_unless_new(flag, "--logit_scale_kind"):
        (model_args,) = argument_parser((TiedNormModelArguments,)).parse_args_into_dataclasses([flag, "scalar"])
    assert model_args.logit_scale_kind == "scalar"


def test_the_old_keyword_of_normalize_tied_head_converts_with_a_deprecation_message():
    """A script written for the last release: bcb37a5 raised ``TypeError: HeadOptions.__init__() got an unexpected
    keyword argument 'logit_scale'``."""
    with pytest.warns(FutureWarning, match="keyword argument 'logit_scale' is renamed 'logit_scale_kind'.*Write "
                                           "logit_scale_kind='vector'") as caught:
        model = normalize_tied_head(source_model("gpt2"), "cosine", logit_scale="vector")
    assert {Path(warning.filename).name for warning in caught} == {Path(__file__).name}  # the caller's own line
    assert model.config.logit_scale_kind == "vector"
    assert model.get_output_embeddings().logit_scale.shape == (model.config.vocab_size,)
    with pytest.warns(FutureWarning, match="'logit_scale' is renamed"):
        assert hf_tiednorm.HeadSettings(logit_scale="scalar").logit_scale_kind == "scalar"


def test_the_old_keyword_of_convert_checkpoint_is_saved_under_the_new_name(tmp_path):
    source_model("gpt2").save_pretrained(tmp_path / "src")
    with pytest.warns(FutureWarning, match="'logit_scale' is renamed 'logit_scale_kind'"):
        convert_checkpoint(tmp_path / "src", tmp_path / "out", head_mode="cosine", logit_scale="scalar")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert saved["logit_scale_kind"] == "scalar" and "logit_scale" not in saved


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"logit_scale": 2.0}, "logit_scale=2.0: hf_tiednorm's configs have no logit_scale field"),
        ({"logit_scale": "vector", "logit_scale_kind": "scalar"}, "contradicts logit_scale_kind='scalar'"),
    ],
)
def test_a_float_or_contradicting_old_keyword_is_refused_by_name(keywords, message):
    with warnings.catch_warnings(), pytest.raises(ValueError, match=message):
        warnings.simplefilter("ignore", FutureWarning)
        normalize_tied_head(source_model("gpt2"), "cosine", **keywords)
