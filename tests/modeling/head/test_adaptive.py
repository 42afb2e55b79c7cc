"""Adaptive input + tied adaptive softmax (Baevski & Auli) with the normalized modes, and the frequency order."""

from __future__ import annotations

import gzip
from itertools import islice

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from testing_utils import FAMILIES, model_inputs, tiny_causal_config, tiny_config, tiny_model

import hf_tiednorm
from hf_tiednorm.modeling.families.embeddings import ScaledAdaptiveInput
from hf_tiednorm.modeling.head.adaptive import AdaptiveInput, AdaptiveSoftmaxHead
from hf_tiednorm.modeling.head.settings import HeadSettings
from hf_tiednorm.training.tokenization import train_joint_tokenizer
from hf_tiednorm.training.vocab_order import frequency_order, inverse_order, permute_counts, remap_ids, remap_tokenizer

CUTOFFS = [20, 40]  # bands [0, 20), [20, 40), [40, 61) of the tiny vocabulary; widths 32, 8, 2


def _shared_embedding(model):
    return model.model.shared if model.config.is_encoder_decoder else model.model.embed_tokens


@pytest.mark.parametrize("logit_scale", ["none", "scalar", "vector"])
@pytest.mark.parametrize("head_mode", hf_tiednorm.HEAD_MODES)
def test_log_probs_sum_to_one(head_mode, logit_scale):
    model = tiny_model("causal", adaptive_cutoffs=CUTOFFS, head_mode=head_mode, logit_scale_kind=logit_scale)
    with torch.no_grad():
        log_probs = model(**model_inputs(model)).logits  # (batch, seq, V)
    assert log_probs.shape[-1] == model.config.vocab_size and log_probs.dtype == torch.float32
    assert torch.allclose(log_probs.logsumexp(-1), torch.zeros(()), atol=1e-5)
    assert (log_probs <= 0).all()


def test_baseline_matches_torch_adaptive_log_softmax():
    torch.manual_seed(0)
    d, vocab, cutoffs = 32, 61, CUTOFFS
    reference = torch.nn.AdaptiveLogSoftmaxWithLoss(d, vocab, cutoffs, div_value=4.0)
    head = AdaptiveSoftmaxHead(d, vocab, cutoffs, div_value=4.0, settings=HeadSettings(head_mode="baseline"))
    with torch.no_grad():  # torch's head = [shortlist rows; cluster rows], tail i = (d -> d_i, d_i -> n_i)
        head.bands[0].weight.copy_(reference.head.weight[: cutoffs[0]])
        head.cluster.weight.copy_(reference.head.weight[cutoffs[0] :])
        head.projections[0].weight.copy_(torch.eye(d))
        for i, tail in enumerate(reference.tail, start=1):
            head.projections[i].weight.copy_(tail[0].weight.T)
            head.bands[i].weight.copy_(tail[1].weight)
    hidden = torch.randn(9, d)
    targets = torch.randint(0, vocab, (9,))
    with torch.no_grad():
        log_probs = head(hidden)
        assert torch.allclose(log_probs, reference.log_prob(hidden), atol=1e-5)
        nll = F.nll_loss(log_probs, targets)
        assert nll.item() == pytest.approx(reference(hidden, targets).loss.item(), rel=1e-5)


def test_tied_projections_score_against_the_input_embedding():
    """With tied projections, the adaptive score of token j is e_j·h, e_j its adaptive input embedding."""
    model = tiny_model("causal", adaptive_cutoffs=CUTOFFS, head_mode="baseline")
    hidden = torch.randn(3, 32)
    with torch.no_grad():
        embeddings = model.model.embed_tokens(torch.arange(61))  # (V, d)
        scores = torch.cat(model.lm_head.band_scores(hidden), dim=-1)
    assert torch.allclose(scores, hidden @ embeddings.T, atol=1e-5)


@pytest.mark.parametrize("normalize", [False, True])
def test_adaptive_input_embeds_each_band_and_projects(normalize):
    torch.manual_seed(0)
    embedding = AdaptiveInput(61, 32, CUTOFFS, div_value=4.0, padding_idx=0, normalize=normalize)
    assert [band.embedding_dim for band in embedding.bands] == [32, 8, 2]
    ids = torch.tensor([[0, 5, 25, 60], [39, 40, 19, 20]])
    out = embedding(ids)
    for token, vector in zip(ids.flatten().tolist(), out.reshape(-1, 32)):
        band = sum(token >= c for c in CUTOFFS)
        row = embedding.bands[band].weight[token - embedding.edges[band]]
        if normalize:
            row = row / row.norm().clamp_min(1e-6)
        assert torch.allclose(vector, embedding.projections[band](row), atol=1e-6)
    with pytest.raises(IndexError):
        embedding(torch.tensor([61]))


@pytest.mark.parametrize("normalize", [False, True])
def test_scaled_adaptive_input_multiplies_the_lookup_by_embed_scale(normalize):
    """BART's scale_embedding inside the module: ScaledAdaptiveInput = AdaptiveInput × embed_scale, and in l2 mode
    the unit rows ŵ are what gets projected and scaled (embed_scale · P_i ŵ)."""
    scale = 32**0.5
    plain = AdaptiveInput(61, 32, CUTOFFS, div_value=4.0, padding_idx=0, normalize=normalize)
    scaled = ScaledAdaptiveInput(61, 32, CUTOFFS, div_value=4.0, padding_idx=0, normalize=normalize, embed_scale=scale)
    with torch.no_grad():  # rows of very different norms, so a missing or misplaced normalization would show
        for band in plain.bands:
            band.weight.mul_(torch.rand(band.weight.shape[0], 1) * 5)
        assert torch.equal(plain.bands[0].weight[0], torch.zeros(32))  # the padding row is zero
    scaled.load_state_dict(plain.state_dict())
    assert scaled.embed_scale == scale and f"embed_scale={scale:.6g}" in repr(scaled)
    ids = torch.tensor([[0, 5, 25, 60], [39, 40, 19, 20]])
    with torch.no_grad():
        out = scaled(ids)
        torch.testing.assert_close(out, plain(ids) * scale)
        for token, vector in zip(ids.flatten().tolist(), out.reshape(-1, 32)):
            band = sum(token >= c for c in CUTOFFS)
            row = scaled.bands[band].weight[token - scaled.edges[band]]
            if normalize and token != 0:  # the zero padding row stays zero
                row = row / row.norm()
            torch.testing.assert_close(vector, scale * scaled.projections[band](row))
    assert torch.equal(out[0, 0], torch.zeros(32))


@pytest.mark.parametrize("scale_embedding", [False, True])
@pytest.mark.parametrize("head_mode", ["baseline", "l2"])
def test_bart_with_adaptive_input_scales_its_lookups(head_mode, scale_embedding):
    """The BART family builds a ScaledAdaptiveInput shared by encoder, decoder and head, with embed_scale sqrt(d)
    when scale_embedding is set and 1 otherwise, as BART's BartScaledWordEmbedding does for plain lookups."""
    model = tiny_model("bart", adaptive_cutoffs=CUTOFFS, head_mode=head_mode, scale_embedding=scale_embedding)
    shared = model.model.shared
    assert isinstance(shared, ScaledAdaptiveInput)
    assert shared.embed_scale == (32**0.5 if scale_embedding else 1.0)
    assert model.model.encoder.embed_tokens is shared and model.model.decoder.embed_tokens is shared
    reference = AdaptiveInput(61, 32, CUTOFFS, div_value=4.0, padding_idx=0, normalize=head_mode == "l2")
    reference.load_state_dict(shared.state_dict())
    ids = model_inputs(model)["input_ids"]
    with torch.no_grad():
        torch.testing.assert_close(shared(ids), reference(ids) * (32**0.5 if scale_embedding else 1.0))


@pytest.mark.parametrize("family", FAMILIES)
def test_loss_is_the_exact_negative_log_likelihood(family):
    model = tiny_model(family, adaptive_cutoffs=CUTOFFS, head_mode="cosine", logit_scale_kind="scalar")
    inputs = model_inputs(model)
    encoder_decoder = model.config.is_encoder_decoder
    labels = inputs["decoder_input_ids"] if encoder_decoder else inputs["input_ids"]
    out = model(**inputs, labels=labels)
    targets = labels if encoder_decoder else labels[:, 1:]
    log_probs = out.logits if encoder_decoder else out.logits[:, :-1]
    nll = -log_probs.gather(-1, targets.unsqueeze(-1)).mean()
    assert out.loss.item() == pytest.approx(nll.item(), rel=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_reaches_tied_bands_from_input_and_output(family):
    model = tiny_model(family, adaptive_cutoffs=CUTOFFS, head_mode="cosine", logit_scale_kind="scalar").train()
    inputs = model_inputs(model)
    labels = inputs["decoder_input_ids"] if model.config.is_encoder_decoder else inputs["input_ids"]
    model(**inputs, labels=labels).loss.backward()
    for band, projection in zip(model.lm_head.bands, model.lm_head.projections):
        assert band.weight.grad is not None and band.weight.grad.abs().sum() > 0
        assert projection.weight.grad is not None and projection.weight.grad.abs().sum() > 0
    assert model.lm_head.cluster.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("tie_projections", [True, False])
@pytest.mark.parametrize("family", FAMILIES)
def test_tied_bands_survive_save_and_load(family, tie_projections, tmp_path):
    model = tiny_model(
        family, adaptive_cutoffs=CUTOFFS, head_mode="distance", logit_scale_kind="vector",
        adaptive_tie_projections=tie_projections, projection_regularization=0.15,
    )
    inputs = model_inputs(model)
    model.save_pretrained(tmp_path)
    loaded, info = type(model).from_pretrained(tmp_path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    loaded.eval()
    embedding = _shared_embedding(loaded)
    for i, band in enumerate(loaded.lm_head.bands):
        assert band.weight is embedding.bands[i].weight
        assert (loaded.lm_head.projections[i].weight is embedding.projections[i].weight) == tie_projections
        if model.config.is_encoder_decoder:  # three-way: the encoder and decoder inputs are the same tensors
            assert loaded.model.encoder.embed_tokens.bands[i].weight is embedding.bands[i].weight
            assert loaded.model.decoder.embed_tokens.projections[i].weight is embedding.projections[i].weight
    with torch.no_grad():
        assert torch.allclose(model(**inputs).logits, loaded(**inputs).logits, atol=1e-6)
    # Generation runs on the log-probabilities: greedy decoding picks their argmax.
    prompt = inputs["input_ids"][:1]
    generated = loaded.generate(
        prompt, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
    )
    assert torch.allclose(generated.logits[0].logsumexp(-1), torch.zeros(()), atol=1e-5)
    assert generated.sequences[0, -4] == generated.logits[0].argmax(-1)[0]


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"adaptive_cutoffs": [20, 61]}, "cover the vocabulary"),
        ({"adaptive_cutoffs": [40, 20]}, "strictly increasing"),
        ({"adaptive_cutoffs": [0, 20]}, "strictly increasing"),
        ({"adaptive_cutoffs": []}, "strictly increasing"),
        ({"adaptive_cutoffs": [10, 20, 30, 40]}, "width"),
        ({"adaptive_cutoffs": [20], "adaptive_div_value": 0.5}, "adaptive_div_value"),
        ({"adaptive_cutoffs": [20], "loss_chunk_size": 64}, "loss_chunk_size"),
        ({"adaptive_cutoffs": [20], "head_mode": "l2", "weight_norm_regularization": 1e-3}, "head_mode='l2'"),
    ],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_contradictory_adaptive_options_raise(family, overrides, message):
    """Refused when the config is made, or, where the head mode's math decides (l2 removes the row norms the
    weight-norm regularization acts on), when the model is built (issue 56)."""
    with pytest.raises((StrictDataclassError, ValueError), match=message.replace("(", r"\(")):
        tiny_model(family, **overrides)


def test_adaptive_needs_tied_embeddings_for_tied_projections():
    with pytest.raises(StrictDataclassError, match="adaptive_tie_projections"):
        tiny_causal_config(adaptive_cutoffs=[20], tie_word_embeddings=False)
    untied = tiny_model("causal", adaptive_cutoffs=[20], tie_word_embeddings=False, adaptive_tie_projections=False)
    assert untied.lm_head.bands[0].weight is not untied.model.embed_tokens.bands[0].weight
    for family in FAMILIES:
        if tiny_config(family).is_encoder_decoder:
            with pytest.raises(StrictDataclassError, match="three_way"):
                tiny_config(family, adaptive_cutoffs=[20], tie_topology="decoder")


def test_resize_is_refused():
    model = tiny_model("causal", adaptive_cutoffs=CUTOFFS)
    with pytest.raises(ValueError, match="resize_token_embeddings"):
        model.resize_token_embeddings(70)


def test_frequency_order_keeps_specials_and_sorts_by_count():
    counts = torch.tensor([0, 0, 5, 0, 1, 9, 9, 3])
    order = frequency_order(counts)
    assert order == [0, 1, 2, 3, 5, 6, 7, 4]
    assert permute_counts(counts, order).tolist() == [0, 0, 5, 0, 9, 9, 3, 1]
    assert remap_ids(torch.tensor([[5, 4, -100]]), order).tolist() == [[4, 7, -100]]
    assert inverse_order(order)[torch.tensor(order)].tolist() == list(range(8))
    with pytest.raises(ValueError, match="keep_first"):
        frequency_order(counts, keep_first=(0, 0))


def test_remap_tokenizer_orders_multi30k_vocabulary_by_frequency(multi30k_dir, tmp_path):
    with gzip.open(multi30k_dir / "train.en.gz", "rt", encoding="utf-8") as f:
        texts = [line.strip() for line in islice(f, 2000)]
    tokenizer = train_joint_tokenizer(texts, vocab_size=400)
    old_ids = tokenizer(texts)["input_ids"]
    counts = torch.bincount(torch.tensor([i for ids in old_ids for i in ids]), minlength=len(tokenizer))
    order = frequency_order(counts)
    remapped = remap_tokenizer(tokenizer, order)
    new_ids = remapped(texts)["input_ids"]
    assert [remap_ids(torch.tensor(ids), order).tolist() for ids in old_ids[:200]] == new_ids[:200]
    new_counts = torch.bincount(torch.tensor([i for ids in new_ids for i in ids]), minlength=len(remapped))
    assert (new_counts[4:-1] >= new_counts[5:]).all()  # frequency order after the specials
    assert [remapped.convert_tokens_to_ids(t) for t in ("<pad>", "<s>", "</s>", "<unk>")] == [0, 1, 2, 3]
    decoded = remapped.decode(new_ids[0], skip_special_tokens=True)
    assert decoded == tokenizer.decode(old_ids[0], skip_special_tokens=True)
    remapped.save_pretrained(tmp_path)  # the remapped tokenizer is a normal, savable tokenizer
    assert type(remapped).from_pretrained(tmp_path)(texts[:5])["input_ids"] == new_ids[:5]
