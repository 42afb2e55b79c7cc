"""The head's settings are one value (hf_tiednorm/modeling/head/settings.py), checked once and passed whole; a
conversion checks its source once."""

from __future__ import annotations

import dataclasses

import pytest
from testing_utils import tiny_config
from tiny_architectures import source_model

import hf_tiednorm.conversion.convert as convert
from hf_tiednorm.conversion.lossless_start import with_lossless_start
from hf_tiednorm.modeling.head.layer import TiedNormHead
from hf_tiednorm.modeling.head.modes import get_head_mode
from hf_tiednorm.modeling.head.settings import HeadSettings
from hf_tiednorm.registration.head_modes import HEAD_MODES


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"head_mode": "cosinus"}, "head_mode must be one of .*got 'cosinus'"),
        ({"logit_scale_kind": "learned"}, "logit_scale_kind must be one of"),
        ({"logit_scale_kind": "fixed", "logit_scale_init": 0.0}, "logit_scale_init must be > 0"),
        ({"logit_scale_init": 2.0}, "logit_scale_kind='none'"),
        ({"norm_eps": 0.0}, "norm_eps must be > 0"),
        ({"logit_bias": 1}, "logit_bias must be True or False"),
    ],
)
def test_bad_options_are_refused_when_made(fields, message):
    with pytest.raises(ValueError, match=message):
        HeadSettings(**fields)


def test_a_config_passes_its_settings_whole_to_the_head():
    config = tiny_config("causal", head_mode="square", logit_scale_kind="vector", logit_scale_init=3.0, logit_bias=True)
    settings = config.head_settings
    assert settings == HeadSettings(head_mode="square", logit_scale_kind="vector", logit_scale_init=3.0,
                                    logit_bias=True, norm_eps=config.norm_eps)
    head = TiedNormHead(8, 5, settings=settings)
    assert head.settings is settings and head.mode.name == "square"
    assert head.logit_scale.shape == (5,) and float(head.logit_scale.detach()[0]) == 3.0 and head.logit_bias is not None
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.head_mode = "cosine"


def test_the_lossless_start_options_follow_the_mode():
    cosine = HeadSettings(head_mode="cosine", logit_scale_kind="vector")
    assert with_lossless_start(HeadSettings(head_mode="cosine")) == cosine
    distance = HeadSettings(head_mode="distance", logit_bias=True)
    assert with_lossless_start(HeadSettings(head_mode="distance")) == distance
    assert with_lossless_start(HeadSettings(head_mode="baseline")) == HeadSettings(head_mode="baseline")
    with pytest.raises(ValueError, match="impossible for head_mode 'l2'"):
        with_lossless_start(HeadSettings(head_mode="l2"))
    with pytest.raises(ValueError, match="logit_scale_kind='scalar' cannot give back"):
        with_lossless_start(HeadSettings(head_mode="cosine", logit_scale_kind="scalar"))


SCALE_STARTS = [name for name in HEAD_MODES if "logit_scale" in (get_head_mode(name).lossless_start or ())]


@pytest.mark.parametrize("head_mode", SCALE_STARTS)
def test_an_explicit_logit_scale_init_is_refused_where_the_lossless_start_sets_g(head_mode):
    assert SCALE_STARTS  # cosine and square at least
    with pytest.raises(
        ValueError,
        match=r"logit_scale_init=5.0 \(--logit-scale-init\) cannot be combined with "
        r"lossless_start \(--lossless-start\)",
    ):
        with_lossless_start(HeadSettings(head_mode=head_mode, logit_scale_kind="vector", logit_scale_init=5.0))
    # Every other mode cannot even be given a logit_scale_init with a lossless start: its start needs
    # logit_scale_kind='none', and logit_scale_init without a logit_scale is refused when the options are made.


def test_the_converter_cli_refuses_logit_scale_init_with_lossless_start_and_writes_nothing(tmp_path):
    source_model("llama").save_pretrained(tmp_path / "source")
    flags = ["--head-mode", "cosine", "--logit-scale", "vector", "--logit-scale-init", "5", "--lossless-start"]
    with pytest.raises(ValueError, match=r"--logit-scale-init\) cannot be combined with .*--lossless-start"):
        convert.main([str(tmp_path / "source"), str(tmp_path / "out"), *flags])
    assert not (tmp_path / "out" / "config.json").exists()


@pytest.mark.parametrize("generic", [True, False])
def test_a_conversion_checks_its_source_once(generic, tmp_path, monkeypatch):
    calls = {"check_convertible": 0, "check_tied": 0, "check_unit_lookups": 0}
    for name in calls:
        original = getattr(convert, name)

        def counted(*args, _name=name, _original=original, **kwargs):
            calls[_name] += 1
            return _original(*args, **kwargs)

        monkeypatch.setattr(convert, name, counted)
    source_model("llama").save_pretrained(tmp_path / "source")
    convert.convert_checkpoint(tmp_path / "source", head_mode="l2", generic=generic)
    assert calls == {"check_convertible": 1, "check_tied": 1, "check_unit_lookups": 1 if generic else 0}
    for name in calls:
        calls[name] = 0
    convert.normalize_tied_head(source_model("llama"), settings=HeadSettings(head_mode="l2"), generic=generic)
    assert calls == {"check_convertible": 1, "check_tied": 1, "check_unit_lookups": 1 if generic else 0}


# The names of 0.1 and what replaced them (issue 56): one vocabulary, HeadSettings / HeadTerm / HEAD_TERMS /
# ExtraHeadTerm / register_head_term; the old names work one more release, each with a FutureWarning.
RENAMED = {"HeadOptions": "HeadSettings", "HeadOption": "ExtraHeadTerm", "HEAD_OPTIONS": "HEAD_TERMS",
           "register_head_option": "register_head_term"}  # fmt: skip


@pytest.mark.parametrize(("old", "new"), RENAMED.items())
def test_an_old_name_still_works_with_a_future_warning_naming_the_new_one(old, new):
    import hf_tiednorm

    with pytest.warns(FutureWarning, match=rf"hf_tiednorm\.{old} is renamed hf_tiednorm\.{new}"):
        assert getattr(hf_tiednorm, old) is getattr(hf_tiednorm, new)
    assert old not in hf_tiednorm.__all__ and new in hf_tiednorm.__all__
    with pytest.raises(AttributeError, match="no attribute 'HeadOptionz'"):
        hf_tiednorm.HeadOptionz  # noqa: B018


def test_the_old_keywords_still_work_with_a_future_warning():
    settings = HeadSettings(head_mode="cosine")
    with pytest.warns(FutureWarning, match=r"TiedNormHead\(options=...\) is renamed settings="):
        assert TiedNormHead(4, 5, options=settings).settings is settings
    with pytest.warns(FutureWarning, match="the keyword options= is renamed settings="):
        model = convert.normalize_tied_head(source_model("gpt2"), options=settings)
    assert model.get_output_embeddings().head_mode == "cosine"
