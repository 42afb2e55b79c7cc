"""Weight-norm initialization (Herold, Gao & Ney) from real Multi30k token counts."""

from __future__ import annotations

import gzip
import math
from itertools import islice

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from testing_utils import FAMILIES, tiny_config, tiny_model

import hf_tiednorm
from hf_tiednorm.training.tokenization import train_joint_tokenizer
from hf_tiednorm.training.weight_norm_init import MIN_COUNT, weight_norm_init_, weight_norm_targets

LINES = 3000  # per language: enough for a real Zipfian count profile, fast to tokenize


@pytest.fixture(scope="module")
def multi30k_counts(multi30k_dir):
    """(tokenizer, counts): a small joint BPE trained on Multi30k train lines and its unigram counts there."""
    texts = []
    for lang in ("de", "en"):
        with gzip.open(multi30k_dir / f"train.{lang}.gz", "rt", encoding="utf-8") as f:
            texts += [line.strip() for line in islice(f, LINES)]
    tokenizer = train_joint_tokenizer(texts, vocab_size=600)
    ids = [i for line in tokenizer(texts)["input_ids"] for i in line]
    counts = torch.bincount(torch.tensor(ids), minlength=len(tokenizer))
    return tokenizer, counts


def _check_norms(model, counts, sigma):
    norms = torch.cat([torch.linalg.vector_norm(w.float(), dim=-1) for w in model.output_embedding_weights()])
    expected = torch.tensor([sigma * math.log(max(int(c), MIN_COUNT)) for c in counts])
    pad = model.config.pad_token_id
    assert norms[pad] == 0  # HF's zero padding row stays zero
    keep = torch.arange(len(counts)) != pad
    assert torch.allclose(norms[keep], expected[keep], rtol=1e-5)
    assert (norms[keep] > 0).all()  # no zero row: unseen tokens and singletons get sigma * log 2


@pytest.mark.parametrize(
    "family,overrides",
    [
        *[(family, {}) for family in FAMILIES],
        *[(family, {"head_mode": "distance", "adaptive_cutoffs": [50, 200]}) for family in FAMILIES],
    ],
)
def test_weight_norm_init_sets_log_count_norms(multi30k_counts, family, overrides):
    tokenizer, counts = multi30k_counts
    assert (counts == 0).any() and (counts == 1).any() and counts.max() > 1000  # the rare cases are exercised
    model = tiny_model(family, vocab_size=len(tokenizer), **overrides)
    directions = [torch.nn.functional.normalize(w.detach().clone(), dim=-1) for w in model.output_embedding_weights()]
    weight_norm_init_(model, counts, sigma=0.5)
    _check_norms(model, counts, sigma=0.5)
    for before, w in zip(directions, model.output_embedding_weights()):  # directions are kept
        assert torch.allclose(torch.nn.functional.normalize(w, dim=-1), before, atol=1e-5)
    assert model.config.weight_norm_init_sigma == 0.5
    if not overrides:
        assert model.get_input_embeddings().weight is model.lm_head.weight  # the tied input got the same norms


def test_weight_norm_init_survives_save_and_load(multi30k_counts, tmp_path):
    tokenizer, counts = multi30k_counts
    model = weight_norm_init_(tiny_model("causal", vocab_size=len(tokenizer)), counts, sigma=1.0)
    model.save_pretrained(tmp_path)
    loaded = hf_tiednorm.TiedNormForCausalLM.from_pretrained(tmp_path)
    assert loaded.config.weight_norm_init_sigma == 1.0
    _check_norms(loaded, counts, sigma=1.0)


def test_weight_norm_targets_floor_rare_counts():
    targets = weight_norm_targets(torch.tensor([0, 1, 2, 100]), sigma=2.0)
    assert torch.allclose(targets, torch.tensor([2 * math.log(2)] * 3 + [2 * math.log(100)]))


@pytest.mark.parametrize(
    "counts,sigma,overrides,message",
    [
        (None, 1.0, {}, "token counts"),
        (torch.ones(10, dtype=torch.long), 1.0, {}, "10 entries"),
        (-torch.ones(61, dtype=torch.long), 1.0, {}, ">= 0"),
        (torch.ones(61, dtype=torch.long), 0.0, {}, "sigma"),
        (torch.ones(61, dtype=torch.long), 1.0, {"head_mode": "l2"}, "l2"),
    ],
)
def test_weight_norm_init_rejects_bad_inputs(counts, sigma, overrides, message):
    model = tiny_model("causal", **overrides)
    with pytest.raises(ValueError, match=message):
        weight_norm_init_(model, counts, sigma=sigma)


@pytest.mark.parametrize("family", FAMILIES)
def test_weight_norm_init_sigma_is_validated_in_the_config(family):
    with pytest.raises(StrictDataclassError, match="weight_norm_init_sigma"):
        tiny_config(family, weight_norm_init_sigma=0.0)
