"""Bad config values fail at construction with a ValueError naming the field, in every model family (issue 14)."""

from __future__ import annotations

import math

import pytest
from testing_utils import FAMILIES, tiny_config, tiny_seq2seq_config

# Before these checks: inf scales and eps were accepted (nan or uniform losses), negative layer counts and zero sizes
# were accepted (ZeroDivisionError or empty models later), decoder_vocab_size=0 was silently replaced by vocab_size,
# and adaptive_cutoffs=50 / [True, 50] gave a TypeError or were accepted.
HEAD_CASES = [
    ({"logit_scale": "scalar", "logit_scale_init": math.inf}, "logit_scale_init"),
    ({"logit_scale": "fixed", "logit_scale_init": math.inf}, "logit_scale_init"),
    ({"norm_eps": math.inf}, "norm_eps"),
    ({"vocab_size": 0}, "vocab_size"),
    ({"vocab_size": -5}, "vocab_size"),
    ({"adaptive_cutoffs": 50}, "adaptive_cutoffs"),
    ({"adaptive_cutoffs": [True, 50]}, "adaptive_cutoffs"),
]
FAMILY_CASES = {
    "seq2seq": [
        ({"encoder_layers": -1}, "encoder_layers"),
        ({"decoder_layers": -2}, "decoder_layers"),
        ({"d_model": 0}, "d_model"),
        ({"tie_topology": "decoder", "decoder_vocab_size": 0}, "decoder_vocab_size"),
    ],
    "causal": [
        ({"num_hidden_layers": -1}, "num_hidden_layers"),
        ({"hidden_size": 0}, "hidden_size"),
    ],
}
FAMILY_CASES["bart"] = FAMILY_CASES["seq2seq"]


@pytest.mark.parametrize(
    ("family", "fields", "name"),
    [(family, fields, name) for family in FAMILIES for fields, name in HEAD_CASES + FAMILY_CASES[family]],
)
def test_bad_value_names_the_field(family, fields, name):
    with pytest.raises(ValueError, match=rf"^{name} must be"):
        tiny_config(family, **fields)


@pytest.mark.parametrize("family", FAMILIES)
def test_good_values_still_pass(family):
    config = tiny_config(family, adaptive_cutoffs=[10, 30], adaptive_div_value=2.0)
    assert config.adaptive_cutoffs == [10, 30]
    tiny_config(family, logit_scale="scalar", logit_scale_init=12.0, norm_eps=1e-5)


def test_decoder_vocab_size_is_kept():
    config = tiny_seq2seq_config(tie_topology="decoder", decoder_vocab_size=40)
    assert config.decoder_vocab_size == 40
