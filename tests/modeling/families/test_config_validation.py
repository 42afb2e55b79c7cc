"""Bad config values fail at construction, in every model family, with huggingface_hub ``@strict``'s errors naming
the field (type or range) or the validator and the field it checks (issues 14, 16)."""

import math

import pytest
from huggingface_hub.errors import (
    StrictDataclassClassValidationError,
    StrictDataclassError,
    StrictDataclassFieldValidationError,
)
from testing_utils import FAMILIES, tiny_config, tiny_seq2seq_config

import hf_tiednorm
from hf_tiednorm import TiedNormWrappedConfig

# Before these checks: inf scales and eps were accepted (nan or uniform losses), negative layer counts and zero sizes
# were accepted (ZeroDivisionError or empty models later), decoder_vocab_size=0 was silently replaced by vocab_size,
# and adaptive_cutoffs=50 / [True, 50] gave a TypeError or were accepted.
HEAD_CASES = [
    ({"head_mode": "cosinus"}, "head_mode"),
    ({"logit_scale_kind": "learned"}, "logit_scale_kind"),
    ({"logit_scale_kind": "scalar", "logit_scale_init": math.inf}, "logit_scale_init"),
    ({"logit_scale_kind": "fixed", "logit_scale_init": math.inf}, "logit_scale_init"),
    ({"norm_eps": math.inf}, "norm_eps"),
    ({"norm_eps": 0.0}, "norm_eps"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"vocab_size": -5}, "vocab_size"),
    ({"label_smoothing": 1.0}, "label_smoothing"),
    ({"weight_norm_regularization": -1e-3}, "weight_norm_regularization"),
    ({"projection_regularization": math.nan}, "projection_regularization"),
    ({"embedding_init_std": 0.0}, "embedding_init_std"),
    ({"loss_chunk_size": 0}, "loss_chunk_size"),
    ({"adaptive_cutoffs": 50}, "adaptive_cutoffs"),
    ({"adaptive_cutoffs": [True, 50]}, "adaptive_cutoffs"),
]
FAMILY_CASES = {
    "seq2seq": [
        ({"encoder_layers": -1}, "encoder_layers"),
        ({"decoder_layers": -2}, "decoder_layers"),
        ({"d_model": 0}, "d_model"),
        ({"tie_topology": "two_way"}, "tie_topology"),
        ({"tie_topology": "decoder", "decoder_vocab_size": 0}, "decoder_vocab_size"),
    ],
    "causal": [
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"hidden_size": 0}, "hidden_size"),
    ],
}
FAMILY_CASES["bart"] = FAMILY_CASES["seq2seq"]

# Values each valid on its own that contradict one another: the validator names the fields.
COMBINATION_CASES = [
    ({"logit_scale_init": 4.0}, "validate_head_settings", "logit_scale_init=4.0 is set but logit_scale_kind='none'"),
    ({"adaptive_cutoffs": [10, 10]}, "validate_adaptive_cutoffs", "adaptive_cutoffs must be strictly increasing"),
    ({"adaptive_cutoffs": [10, 64]}, "validate_adaptive_cutoffs", r"\[1, vocab_size - 1\]"),
    ({"adaptive_cutoffs": [10], "loss_chunk_size": 8}, "validate_loss_chunk_size", "the adaptive softmax .*ignored"),
    # issue 48: accepted and ignored before
    ({"loss_implementation": "plain", "loss_chunk_size": 8}, "validate_loss_chunk_size",
     "loss_chunk_size=8 .*loss_implementation='plain' .*would be ignored"),
]
SEQ2SEQ_COMBINATION_CASES = [
    ({"tie_word_embeddings": False}, "validate_tie_topology", "tie_word_embeddings=False contradicts"),
    ({"tie_topology": "untied", "share_encoder_decoder_embeddings": True}, "validate_tie_topology",
     "share_encoder_decoder_embeddings=True contradicts"),
    ({"decoder_vocab_size": 40}, "validate_tie_topology", "decoder_vocab_size=40 != vocab_size"),
    ({"tie_topology": "decoder", "adaptive_cutoffs": [10]}, "validate_tie_topology", "adaptive_cutoffs needs"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("family", "fields", "name"),
    [(family, fields, name) for family in FAMILIES for fields, name in HEAD_CASES + FAMILY_CASES[family]],
)
def test_bad_value_names_the_field(family, fields, name):
    with pytest.raises(StrictDataclassFieldValidationError, match=rf"^Validation error for field '{name}'"):
        tiny_config(family, **fields)


@pytest.mark.parametrize(
    ("family", "fields", "validator", "message"),
    [(family, *case) for family in FAMILIES for case in COMBINATION_CASES]
    + [(family, *case) for family in ("seq2seq", "bart") for case in SEQ2SEQ_COMBINATION_CASES],
)
def test_contradicting_values_name_the_fields(family, fields, validator, message):
    with pytest.raises(StrictDataclassClassValidationError, match=rf"'{validator}':\s+ValueError: .*{message}"):
        tiny_config(family, **fields)


# What the head mode's math rules out is checked where the model is built (the configuration imports no torch and
# checks names and ranges only, issue 56): the config is accepted, the model refused, naming the fields.
MODE_CASES = [
    ({"head_mode": "l2", "weight_norm_regularization": 1e-3}, "weight_norm_regularization .*head_mode='l2' removes"),
    ({"head_mode": "l2", "weight_norm_init_sigma": 0.5}, "weight_norm_init_sigma act on row norms"),
    ({"head_mode": "l2", "lossless_start": True}, "lossless_start=True, but head_mode='l2' has no lossless start"),
    ({"head_mode": "cosine", "lossless_start": True}, r"'cosine' with these settings lacks \['logit_scale'\]"),
    ({"head_mode": "cosine", "logit_scale_kind": "scalar", "lossless_start": True}, r"lacks \['logit_scale'\]"),
]


@pytest.mark.parametrize(("family", "fields", "message"), [(f, *case) for f in FAMILIES for case in MODE_CASES])
def test_what_the_modes_math_rules_out_is_refused_where_the_model_is_built(family, fields, message):
    config = tiny_config(family, **fields)
    row = hf_tiednorm.FAMILIES[family]
    with pytest.raises(ValueError, match=message):
        row.lm_class(config)
    config.lossless_start, config.weight_norm_regularization, config.weight_norm_init_sigma = False, 0.0, None
    row.lm_class(config)  # the same config without them builds


@pytest.mark.parametrize("family", FAMILIES)
def test_assignment_is_validated_too(family):
    config = tiny_config(family)
    with pytest.raises(StrictDataclassFieldValidationError, match="'head_mode'"):
        config.head_mode = "cosinus"
    assert config.head_mode == "cosine"


@pytest.mark.parametrize("family", FAMILIES)
def test_good_values_still_pass(family):
    config = tiny_config(family, adaptive_cutoffs=[10, 30], adaptive_div_value=2.0)
    assert config.adaptive_cutoffs == [10, 30]
    tiny_config(family, logit_scale_kind="scalar", logit_scale_init=12.0, norm_eps=1e-5)
    # Whole numbers are accepted where a float is meant (the JSON of older configs, or `label_smoothing=0`).
    tiny_config(family, logit_scale_kind="fixed", logit_scale_init=16, label_smoothing=0, weight_norm_target=2)


@pytest.mark.parametrize("family", FAMILIES)
def test_config_keeps_transformers_repr_and_equality(family):
    """The field mixins add fields only: repr stays PreTrainedConfig's JSON, equality compares every field (the
    mixins' too), and a saved config loads back with the same fields."""
    config = tiny_config(family, head_mode="square", adaptive_cutoffs=[10])
    assert repr(config).startswith(f"{type(config).__name__} {{") and '"head_mode": "square"' in repr(config)
    assert type(config).from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert config == tiny_config(family, head_mode="square", adaptive_cutoffs=[10])
    assert config != tiny_config(family, head_mode="l2", adaptive_cutoffs=[10])


def test_decoder_vocab_size_is_kept():
    config = tiny_seq2seq_config(tie_topology="decoder", decoder_vocab_size=40)
    assert config.decoder_vocab_size == 40
    assert (config.tie_word_embeddings, config.share_encoder_decoder_embeddings) == (True, False)


def test_the_wrapper_refuses_exactly_the_own_families_fields():
    """The wrapper's configuration names the techniques' fields without importing them (its folder carries no
    techniques' code): the list is theirs and the tie topology's, no more, no fewer."""
    from dataclasses import fields

    from hf_tiednorm.modeling.families.configuration_techniques import TiedNormTechniquesConfigMixin
    from hf_tiednorm.modeling.families.configuration_wrapped import OWN_FAMILY_FIELDS

    assert OWN_FAMILY_FIELDS == (*(f.name for f in fields(TiedNormTechniquesConfigMixin)), "tie_topology")


def test_wrapped_config_validates_the_same_head_fields():
    text_config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64}
    for fields, name in HEAD_CASES[:6]:
        with pytest.raises(StrictDataclassError, match=f"'{name}'"):
            TiedNormWrappedConfig(text_config=text_config, **fields)
    with pytest.raises(StrictDataclassClassValidationError, match="validate_head_settings"):
        TiedNormWrappedConfig(text_config=text_config, logit_scale_init=4.0)
    for own_field in ("label_smoothing", "embedding_init_std", "tie_topology"):
        with pytest.raises(ValueError, match=own_field):
            TiedNormWrappedConfig(text_config=text_config, **{own_field: 0.1})


def test_the_wrapper_config_says_it_has_no_defaults_for_older_transformers(tmp_path):
    """transformers 5.17-5.19's ``to_diff_dict`` (run by ``repr()``, and by the log line of every ``from_dict``, so
    by every ``AutoConfig.from_pretrained``) builds ``type(config)()`` unless the class sets
    ``has_no_defaults_at_init``: the wrapper's config, which has no default ``text_config``, failed to load there with
    "text_config is required" (vLLM's venv, transformers 5.19). Later versions read the declared defaults instead; the
    older rule is applied here as 5.19 applies it."""
    text_config = {"model_type": "gpt2", "n_layer": 1, "n_embd": 16, "n_head": 2, "vocab_size": 64}
    config = TiedNormWrappedConfig(text_config=text_config, head_mode="cosine")
    cls = type(config)
    defaults = cls().to_dict() if not getattr(cls, "has_no_defaults_at_init", False) else {}  # 5.19's line
    assert defaults == {}
    config.save_pretrained(tmp_path)
    assert "tiednorm_wrapped" in repr(cls.from_pretrained(tmp_path))
