"""The three model families × 5 modes × tie topologies: tying, save/load, generation, resize, Auto classes."""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from huggingface_hub.errors import StrictDataclassError
from testing_utils import (
    FAMILIES,
    model_inputs,
    reference_scores,
    run_without_package,
    tiny_bart_config,
    tiny_causal_config,
    tiny_model,
    tiny_seq2seq_config,
)
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM
from transformers.models.bart.modeling_bart import BartScaledWordEmbedding

import hf_tiednorm
from hf_tiednorm import HEAD_MODES, TiedNormHead
from hf_tiednorm.modeling.families.outputs import CACHE_FIELD

# (family, extra config) pairs: the causal LM tied and untied, both encoder-decoders in their three topologies.
TOPOLOGIES = [
    {"tie_topology": "three_way"},
    {"tie_topology": "decoder", "decoder_vocab_size": 53},
    {"tie_topology": "untied"},
]
VARIANTS = [
    ("causal", {}),
    ("causal", {"tie_word_embeddings": False}),
    *[("seq2seq", extra) for extra in TOPOLOGIES],
    *[("bart", extra) for extra in TOPOLOGIES],
]
VARIANT_IDS = ["causal-tied", "causal-untied"] + [
    f"{prefix}-{extra['tie_topology']}" for prefix in ("s2s", "bart") for extra in TOPOLOGIES
]


def embedding_modules(model) -> dict[str, torch.nn.Embedding]:
    if model.config.is_encoder_decoder:
        return {"encoder": model.model.encoder.embed_tokens, "decoder": model.model.decoder.embed_tokens}
    return {"decoder": model.model.embed_tokens}


def assert_tying(model) -> None:
    """Tied parameters must be the *same* tensor object, untied ones must not be."""
    config = model.config
    embeddings = embedding_modules(model)
    head_tied = model.lm_head.weight is embeddings["decoder"].weight
    assert head_tied == bool(config.tie_word_embeddings)
    assert model.get_output_embeddings() is model.lm_head and isinstance(model.lm_head, TiedNormHead)
    if config.is_encoder_decoder:
        shared = embeddings["encoder"].weight is embeddings["decoder"].weight
        assert shared == (config.tie_topology == "three_way")
        if shared:
            assert model.model.shared.weight is model.lm_head.weight


def decoder_hidden_states(model, inputs) -> torch.Tensor:
    return model.model(**inputs).last_hidden_state


@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize(("family", "extra"), VARIANTS, ids=VARIANT_IDS)
def test_logits_are_the_mode_equation_on_the_last_hidden_state(family, extra, head_mode):
    model = tiny_model(family, head_mode=head_mode, **extra)
    assert_tying(model)
    inputs = model_inputs(model)
    with torch.no_grad():
        logits = model(**inputs).logits
        hidden = decoder_hidden_states(model, inputs)
    expected = reference_scores(model.lm_head.weight, hidden, head_mode)
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(("family", "extra"), VARIANTS, ids=VARIANT_IDS)
def test_l2_mode_looks_up_unit_rows(family, extra):
    model = tiny_model(family, head_mode="l2", **extra)
    ids = model_inputs(model)["input_ids"]
    for embedding in embedding_modules(model).values():
        vocab_ids = ids.clamp_max(embedding.num_embeddings - 1)
        # BART scales inside the embedding module (sqrt(d) with scale_embedding), Marian/Llama do not.
        scale = getattr(embedding, "embed_scale", 1.0)
        assert scale == (model.config.d_model**0.5 if family == "bart" else 1.0)
        torch.testing.assert_close(embedding(vocab_ids).norm(dim=-1), torch.full(vocab_ids.shape, scale))


@pytest.mark.parametrize("scale_embedding", [False, True])
@pytest.mark.parametrize("head_mode", ["baseline", "l2"])
def test_bart_embeddings_scale_inside_the_module_like_bart(head_mode, scale_embedding):
    """BartScaledWordEmbedding multiplies the lookup by sqrt(d) when scale_embedding; ours too, on ŵ_i in l2 mode."""
    model = tiny_model("bart", head_mode=head_mode, scale_embedding=scale_embedding)
    ids = model_inputs(model)["input_ids"]
    for embedding in embedding_modules(model).values():
        weight = embedding.weight.detach()
        if head_mode == "l2":
            weight = weight / weight.norm(dim=-1, keepdim=True)
        reference = BartScaledWordEmbedding(
            *weight.shape, padding_idx=0, embed_scale=32**0.5 if scale_embedding else 1.0
        )
        reference.weight.data.copy_(weight)
        with torch.no_grad():
            exact = {"rtol": 0, "atol": 0} if head_mode == "baseline" else {}
            torch.testing.assert_close(embedding(ids), reference(ids), **exact)


@pytest.mark.parametrize("head_mode", ["l2", "distance"])
@pytest.mark.parametrize(("family", "extra"), VARIANTS, ids=VARIANT_IDS)
def test_strict_save_load_roundtrip(family, extra, head_mode, tmp_path):
    model = tiny_model(family, head_mode=head_mode, logit_scale_kind="vector", **extra)
    model.lm_head.logit_scale.data.uniform_(1.0, 3.0)  # a trained-looking, non-initial scale must survive
    inputs = model_inputs(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()

    auto_class = AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else AutoModelForCausalLM
    loaded, info = auto_class.from_pretrained(tmp_path, output_loading_info=True)
    assert type(loaded) is type(model)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"], info
    assert_tying(loaded)
    assert loaded.config.head_mode == head_mode
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(**inputs).logits, expected, rtol=0, atol=0)


@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_cached_incremental_decoding_equals_full_forward(family, head_mode):
    model = tiny_model(family, head_mode=head_mode)
    inputs = {"input_ids": model_inputs(model, batch_size=2, length=6)["input_ids"]}
    kwargs = dict(max_new_tokens=6, do_sample=False, output_logits=True, return_dict_in_generate=True)
    with torch.no_grad():
        cached = model.generate(**inputs, use_cache=True, **kwargs)
        uncached = model.generate(**inputs, use_cache=False, **kwargs)
        assert torch.equal(cached.sequences, uncached.sequences)
        # Re-score the generated sequence with a single full forward pass.
        if model.config.is_encoder_decoder:
            full = model(input_ids=inputs["input_ids"], decoder_input_ids=cached.sequences[:, :-1]).logits
            step_logits = full
        else:
            prompt_len = inputs["input_ids"].shape[1]
            full = model(input_ids=cached.sequences[:, :-1]).logits
            step_logits = full[:, prompt_len - 1 :]
    for step, scores in enumerate(cached.logits):
        torch.testing.assert_close(scores, step_logits[:, step], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_cache_goes_by_the_installed_transformers_name(family):
    """transformers 5.24 renamed ``past_key_values`` to ``cache``: the forward returns the cache under the installed
    version's name, and cached generation raises no deprecation warning (ours named both and warned at each call)."""
    model = tiny_model(family)
    inputs = model_inputs(model, batch_size=2, length=6)
    with torch.no_grad():
        out = model(**inputs, use_cache=True)
        assert getattr(out, CACHE_FIELD) is not None
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            model.generate(input_ids=inputs["input_ids"], max_new_tokens=3, do_sample=False, use_cache=True)


def generated_lengths(model, prompts, sequences, end_ids) -> list[int]:
    """Tokens generated per row, up to and including the first end token."""
    new = sequences[:, 1:] if model.config.is_encoder_decoder else sequences[:, prompts.shape[1] :]
    lengths = []
    for row in new.tolist():
        ends = [i for i, token in enumerate(row) if token in end_ids]
        lengths.append(ends[0] + 1 if ends else len(row))
    return lengths


@pytest.mark.parametrize("family", FAMILIES)
def test_beam_search_with_length_penalty(family):
    model = tiny_model(family, head_mode="cosine")
    source = model_inputs(model, batch_size=3)["input_ids"]
    with torch.no_grad():
        out = model.generate(source, num_beams=4, length_penalty=0.6, max_new_tokens=5, num_return_sequences=2)
    assert out.shape[0] == 6

    # A case where the length penalty decides: each row's most likely first token (specials excluded) ends a
    # sequence, so beam search holds a finished 1-token hypothesis from the first step and long running ones.
    # Beam scores are sum(log p) / length**length_penalty: -5 must pick the short one, +5 a long one.
    with torch.no_grad():
        first = model.generate(source, max_new_tokens=1, do_sample=False, output_logits=True,
                               return_dict_in_generate=True).logits[0]
    first[:, :4] = -torch.inf
    end_ids = sorted(set(first.argmax(-1).tolist()))
    kwargs = dict(num_beams=4, max_new_tokens=6, do_sample=False, eos_token_id=end_ids)
    with torch.no_grad():
        short = model.generate(source, length_penalty=-5.0, **kwargs)
        long = model.generate(source, length_penalty=5.0, **kwargs)
    assert generated_lengths(model, source, short, end_ids) == [1, 1, 1]
    assert generated_lengths(model, source, long, end_ids) == [6, 6, 6]
    # run_translation.py sets generation_config.length_penalty; generate() without the argument honours it.
    for penalty, expected in ((-5.0, short), (5.0, long)):
        model.generation_config.length_penalty = penalty
        with torch.no_grad():
            assert torch.equal(model.generate(source, **kwargs), expected)


@pytest.mark.parametrize(("family", "extra"), VARIANTS, ids=VARIANT_IDS)
def test_resize_token_embeddings_keeps_tie_and_mode(family, extra):
    model = tiny_model(family, head_mode="cosine", logit_scale_kind="vector", **extra)
    old_vocab = model.config.vocab_size
    model.resize_token_embeddings(old_vocab + 5, mean_resizing=False)
    assert model.config.vocab_size == old_vocab + 5
    assert_tying(model)
    assert model.lm_head.head_mode == "cosine"
    if model.config.is_encoder_decoder and model.config.tie_topology != "three_way":
        # Marian's rule: the encoder vocabulary grew; the decoder has its own resize method.
        model.resize_decoder_token_embeddings(model.config.decoder_vocab_size + 3)
        assert_tying(model)
    out_vocab = model.config.decoder_vocab_size if model.config.is_encoder_decoder else model.config.vocab_size
    assert model.lm_head.weight.shape[0] == out_vocab == model.lm_head.logit_scale.shape[0]
    inputs = model_inputs(model)
    with torch.no_grad():
        logits = model(**inputs).logits
        hidden = decoder_hidden_states(model, inputs)
    assert logits.shape[-1] == out_vocab
    expected = reference_scores(model.lm_head.weight, hidden, "cosine") * model.lm_head.logit_scale.double()
    torch.testing.assert_close(logits.double(), expected, rtol=1e-4, atol=1e-4)  # new rows included


@pytest.mark.parametrize("family", ["seq2seq", "bart"])
def test_decoder_resize_is_refused_when_three_way_tied(family):
    """Marian's rule, for both encoder-decoder families: one shared vocabulary is resized with
    resize_token_embeddings (decoder and output layer follow), never through the decoder alone."""
    model = tiny_model(family, tie_topology="three_way")
    with pytest.raises(ValueError, match="use `resize_token_embeddings` instead"):
        model.resize_decoder_token_embeddings(model.config.vocab_size + 3)
    model.resize_token_embeddings(model.config.vocab_size + 3)
    assert model.config.decoder_vocab_size == model.config.vocab_size == model.lm_head.weight.shape[0]
    assert_tying(model)


@pytest.mark.parametrize("family", FAMILIES)
def test_tie_survives_a_training_step(family):
    model = tiny_model(family, head_mode="cosine").train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    inputs = model_inputs(model)
    before = model.lm_head.weight.detach().clone()
    labels = inputs["decoder_input_ids"] if model.config.is_encoder_decoder else inputs["input_ids"]
    model(input_ids=inputs["input_ids"], labels=labels).loss.backward()
    optimizer.step()
    assert_tying(model)
    assert not torch.equal(before, model.lm_head.weight)
    model.eval()
    with torch.no_grad():  # the cached normalization reflects the updated W
        hidden = decoder_hidden_states(model, inputs)
        expected = reference_scores(model.lm_head.weight, hidden, "cosine")
        torch.testing.assert_close(model(**inputs).logits.double(), expected, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("family", FAMILIES)
def test_label_smoothing_and_ignored_labels_in_the_loss(family):
    model = tiny_model(family, head_mode="square", label_smoothing=0.1)
    inputs = model_inputs(model)
    labels = (inputs.pop("decoder_input_ids") if model.config.is_encoder_decoder else inputs["input_ids"]).clone()
    labels[:, -1] = -100
    with torch.no_grad():
        out = model(**inputs, labels=labels)
    logits = out.logits
    if not model.config.is_encoder_decoder:  # causal: position t predicts token t+1
        logits, labels = logits[:, :-1], labels[:, 1:]
    expected = torch.nn.functional.cross_entropy(
        logits.flatten(0, 1), labels.flatten(), ignore_index=-100, label_smoothing=0.1
    )
    torch.testing.assert_close(out.loss, expected)


def test_set_output_embeddings_accepts_a_plain_linear_and_keeps_the_mode():
    model = tiny_model("causal", head_mode="distance", tie_word_embeddings=False)
    replacement = torch.nn.Linear(32, model.config.vocab_size, bias=False)
    model.set_output_embeddings(replacement)
    assert isinstance(model.lm_head, TiedNormHead) and model.lm_head.head_mode == "distance"
    assert model.lm_head.weight is replacement.weight


# --- Auto classes and remote code ----------------------------------------------------------------------------


def test_auto_classes_are_registered():
    seq2seq = tiny_seq2seq_config(head_mode="l2")
    bart = tiny_bart_config(head_mode="distance")
    causal = tiny_causal_config(head_mode="square")
    assert type(AutoConfig.for_model("tiednorm_seq2seq")) is hf_tiednorm.TiedNormSeq2SeqConfig
    assert type(AutoModelForSeq2SeqLM.from_config(seq2seq)) is hf_tiednorm.TiedNormForConditionalGeneration
    assert type(AutoModel.from_config(seq2seq)) is hf_tiednorm.TiedNormSeq2SeqModel
    assert type(AutoConfig.for_model("tiednorm_bart")) is hf_tiednorm.TiedNormBartConfig
    assert type(AutoModelForSeq2SeqLM.from_config(bart)) is hf_tiednorm.TiedNormBartForConditionalGeneration
    assert type(AutoModel.from_config(bart)) is hf_tiednorm.TiedNormBartModel
    assert type(AutoModelForCausalLM.from_config(causal)) is hf_tiednorm.TiedNormForCausalLM
    assert type(AutoModel.from_config(causal)) is hf_tiednorm.TiedNormCausalModel


@pytest.mark.parametrize("logit_scale", ["scalar", "vector"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_new_model_with_a_learned_logit_scale_starts_as_the_scale_free_one(family, logit_scale):
    # g₀ = 1 by default: the scale learns the sharpness the head needs from the scale-free model (a start at √d made
    # the step-0 logits √d× too sharp, issue 25).
    plain = tiny_model(family, head_mode="cosine")
    scaled = tiny_model(family, head_mode="cosine", logit_scale_kind=logit_scale)
    inputs = model_inputs(plain)
    with torch.no_grad():
        torch.testing.assert_close(scaled(**inputs).logits, plain(**inputs).logits, rtol=0, atol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_remote_code_loads_where_the_package_is_not_importable(family, tmp_path):
    model = tiny_model(family, head_mode="cosine", logit_scale_kind="scalar")
    inputs = model_inputs(model)
    with torch.no_grad():
        expected = model(**inputs).logits
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    auto_map = json.loads((folder / "config.json").read_text())["auto_map"]
    lm_auto = "AutoModelForSeq2SeqLM" if model.config.is_encoder_decoder else "AutoModelForCausalLM"
    assert {"AutoConfig", "AutoModel", lm_auto} <= set(auto_map)
    torch.save({"inputs": inputs, "expected": expected}, tmp_path / "reference.pt")

    out = run_without_package(
        f"""
import torch
from transformers import AutoModel, {lm_auto}
ref = torch.load({str(tmp_path / "reference.pt")!r})
model = {lm_auto}.from_pretrained({str(folder)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
with torch.no_grad():
    assert torch.equal(model(**ref["inputs"]).logits, ref["expected"])
bare = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)
print("OK", type(model).__name__, type(bare).__name__)
""",
        cwd=tmp_path,
    )
    assert out.startswith("OK")


# --- Config validation ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: tiny_seq2seq_config(head_mode="unit"), r"'head_mode':\s+ValueError: head_mode must be one of"),
        (lambda: tiny_causal_config(head_mode="COSINE"), r"'head_mode':\s+ValueError: head_mode must be one of"),
        (lambda: tiny_seq2seq_config(logit_scale_kind="learned"), "Field 'logit_scale_kind' expected one of"),
        (lambda: tiny_causal_config(logit_scale_init=2.0), "logit_scale_kind='none'"),
        (
            lambda: tiny_causal_config(logit_scale_kind="fixed", logit_scale_init=-1.0),
            r"'logit_scale_init':\s+ValueError: Value must be > 0",
        ),
        (lambda: tiny_causal_config(norm_eps=0.0), r"'norm_eps':\s+ValueError: Value must be > 0"),
        (lambda: tiny_causal_config(label_smoothing=1.0), "label_smoothing"),
        (lambda: tiny_seq2seq_config(tie_topology="two_way"), "Field 'tie_topology' expected one of"),
        (lambda: tiny_seq2seq_config(tie_topology="untied", tie_word_embeddings=True), "contradicts"),
        (lambda: tiny_seq2seq_config(tie_topology="decoder", share_encoder_decoder_embeddings=True), "contradicts"),
        (lambda: tiny_seq2seq_config(tie_topology="three_way", decoder_vocab_size=70), "shared vocabulary"),
        # The BART family shares the topology validation.
        (lambda: tiny_bart_config(tie_topology="two_way"), "Field 'tie_topology' expected one of"),
        (lambda: tiny_bart_config(tie_topology="untied", tie_word_embeddings=True), "contradicts"),
        (lambda: tiny_bart_config(tie_topology="three_way", decoder_vocab_size=70), "shared vocabulary"),
        (lambda: tiny_bart_config(tie_topology="decoder", adaptive_cutoffs=[20]), "adaptive_cutoffs needs"),
        (lambda: tiny_bart_config(head_mode="unit"), r"'head_mode':\s+ValueError: head_mode must be one of"),
    ],
)
def test_bad_configs_raise_clear_errors(build, message):
    with pytest.raises(StrictDataclassError, match=message):
        build()


@pytest.mark.parametrize("build", [tiny_seq2seq_config, tiny_bart_config], ids=["seq2seq", "bart"])
def test_config_roundtrip_keeps_the_derived_tie_fields(build, tmp_path):
    config = build(tie_topology="decoder", decoder_vocab_size=40, head_mode="distance")
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert type(loaded) is type(config)
    assert (loaded.tie_topology, loaded.tie_word_embeddings, loaded.share_encoder_decoder_embeddings) == (
        "decoder",
        True,
        False,
    )
    assert loaded.decoder_vocab_size == 40 and loaded.head_mode == "distance"


@pytest.mark.parametrize("head_mode", HEAD_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_bfloat16_models_give_finite_logits(family, head_mode):
    model = tiny_model(family, head_mode=head_mode).to(torch.bfloat16)
    with torch.no_grad():
        logits = model(**model_inputs(model)).logits  # includes the all-zero padding row
    assert torch.isfinite(logits).all()
