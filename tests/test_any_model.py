"""The normalized tied head on any tied transformers LM: one set of checks, parametrized over every architecture.

Each architecture is a tiny random model built in code (tests/tiny_architectures.py). Converted models must give
the source's logits and generations exactly in baseline mode, and in every other mode the logits of a reference
computed here from the weights: the head's input h is captured on the source model, scored by the mode's formula, and
passed through what the architecture does after its head (Gemma's soft-cap, BART's final_logits_bias).
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

import pytest
import torch
from testing_utils import TINY_VOCAB, run_without_package
from tiny_architectures import ARCHITECTURES, auto_class, inputs_for, source_model
from transformers import AutoModel, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import hf_tiednorm
from hf_tiednorm.convert import convert_checkpoint, main, normalize_tied_head
from hf_tiednorm.modeling.head.layer import TiedNormHead
from hf_tiednorm.modeling.head.modes import unit_rows

NORMALIZED_MODES = ("l2", "square", "distance", "cosine")


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


@pytest.fixture(scope="module")
def source_folders(tmp_path_factory) -> dict[str, Path]:
    """Every tiny source model saved once."""
    root = tmp_path_factory.mktemp("sources")
    for name in ARCHITECTURES:
        source_model(name).save_pretrained(root / name)
    return {name: root / name for name in ARCHITECTURES}


def head_input_and_weight(model, inputs) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden states (batch, length, d) ``model``'s output layer receives, and the shared matrix (V, d)."""
    captured = {}
    hook = model.get_output_embeddings().register_forward_hook(lambda _m, args, _out: captured.update(h=args[0]))
    with torch.no_grad():
        model(**inputs)
    hook.remove()
    return captured["h"].float(), model.get_input_embeddings().weight.detach().float()


def reference_logits(source, inputs, head_mode: str) -> torch.Tensor:
    """The logits a normalized head in ``head_mode`` must give on ``source``'s architecture, from the weights."""
    if head_mode == "l2":
        # Liu et al. eq. 19: unit rows looked up and scored; that is the model whose embedding rows are unit-norm.
        unit = copy.deepcopy(source)
        with torch.no_grad():
            weight = unit.get_input_embeddings().weight
            weight.copy_(unit_rows(weight, 1e-6))
            return unit(**inputs).logits
    h, weight = head_input_and_weight(source, inputs)
    scores = h @ weight.T  # (batch, length, V)
    norms = torch.linalg.vector_norm(weight, dim=-1).clamp_min(1e-6)  # the norm_eps lower bound (a padding row is zero)
    scores = {"square": scores / norms**2, "distance": scores - 0.5 * norms**2, "cosine": scores / norms}[head_mode]
    # After the head, as the architecture does: Gemma's soft-cap bounds the normalized score; BART adds its bias.
    cap = getattr(source.config, "final_logit_softcapping", None)
    if cap is not None:
        scores = cap * torch.tanh(scores / cap)
    if hasattr(source, "final_logits_bias"):
        scores = scores + source.final_logits_bias
    return scores


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_baseline_conversion_gives_the_source_logits_and_generations(name, source_folders, tmp_path):
    source_folder = source_folders[name]
    source = source_model(name)
    before = folder_digest(source_folder)
    main([str(source_folder), str(tmp_path / "converted"), "--generic"])  # the CLI, baseline mode by default
    assert folder_digest(source_folder) == before

    model = auto_class(source.config).from_pretrained(tmp_path / "converted").eval()
    assert type(model).__name__.startswith("TiedNormWrapped") and model.config.model_type == "tiednorm_wrapped"
    assert isinstance(model.get_output_embeddings(), TiedNormHead)
    assert model.get_output_embeddings().weight is model.get_input_embeddings().weight  # still tied
    inputs = inputs_for(model)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, source(**inputs).logits, rtol=0, atol=0)
        prompt = inputs["input_ids"]
        for options in ({"do_sample": False}, {"do_sample": False, "num_beams": 3}):
            generated = model.generate(prompt, max_new_tokens=5, **options)
            assert torch.equal(generated, source.generate(prompt, max_new_tokens=5, **options)), options


@pytest.mark.parametrize("head_mode", NORMALIZED_MODES)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_each_mode_equals_the_reference_computed_from_the_weights(name, head_mode):
    source = source_model(name)
    inputs = inputs_for(source)
    expected = reference_logits(source, inputs, head_mode)
    model = normalize_tied_head(source_model(name), head_mode, generic=True).eval()
    assert model.config.head_mode == head_mode
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits.float(), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("logit_scale", "init", "g"),
    [("fixed", 2.0, 2.0), ("fixed", None, 32**0.5), ("scalar", None, 1.0), ("vector", 3.0, 3.0)],
)
def test_the_logit_scale_multiplies_the_score_inside_the_soft_cap(logit_scale, init, g):
    # Gemma 2: logits = cap·tanh(g·s/cap); g = logit_scale_init, by default sqrt(d) (d = 32) for "fixed" and 1 at the
    # start of a learned scale.
    source = source_model("gemma2")
    inputs = inputs_for(source)
    h, weight = head_input_and_weight(source, inputs)
    cap = source.config.final_logit_softcapping
    norms = torch.linalg.vector_norm(weight, dim=-1).clamp_min(1e-6)
    expected = cap * torch.tanh(g * (h @ weight.T) / norms / cap)
    model = normalize_tied_head(
        source, "cosine", logit_scale_kind=logit_scale, logit_scale_init=init, generic=True
    ).eval()
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_kv_cache_equals_full_forward_and_resize_keeps_the_head(name):
    model = normalize_tied_head(source_model(name), "cosine", logit_scale_kind="vector", generic=True).eval()
    inputs = inputs_for(model)
    prompt = inputs["input_ids"]
    with torch.no_grad():
        cached = model.generate(
            prompt, max_new_tokens=4, do_sample=False, output_logits=True, return_dict_in_generate=True
        )
        uncached = model.generate(prompt, max_new_tokens=4, do_sample=False, use_cache=False)
        assert torch.equal(cached.sequences, uncached)
        # The logits of the last generated step, recomputed by one full forward pass over the whole sequence.
        sequence = cached.sequences
        if model.config.is_encoder_decoder:
            full = model(input_ids=prompt, decoder_input_ids=sequence[:, :-1]).logits[:, -1]
        else:
            full = model(input_ids=sequence[:, :-1]).logits[:, -1]
        torch.testing.assert_close(cached.logits[-1], full, rtol=1e-5, atol=1e-5)

    embeddings = model.resize_token_embeddings(TINY_VOCAB + 3)
    head = model.get_output_embeddings()
    assert isinstance(head, TiedNormHead) and head.head_mode == "cosine"
    assert head.weight is embeddings.weight and embeddings.weight.shape[0] == TINY_VOCAB + 3
    assert head.logit_scale.shape == (TINY_VOCAB + 3,) and model.config.vocab_size == TINY_VOCAB + 3
    with torch.no_grad():
        assert model(**inputs).logits.shape[-1] == TINY_VOCAB + 3


def test_l2_lookups_are_unit_rows_times_the_architecture_scale():
    # Gemma multiplies its lookups by sqrt(d) inside the embedding module; l2 must normalize before that scale.
    model = normalize_tied_head(source_model("gemma2"), "l2")
    embedding = model.get_input_embeddings()
    ids = torch.arange(5)
    with torch.no_grad():
        torch.testing.assert_close(embedding(ids), unit_rows(embedding.weight[ids], 1e-6) * 32**0.5)


def check_remote_reload(names: list[str], source_folders: dict[str, Path], tmp_path: Path) -> None:
    """Convert ``names`` (cosine; l2 for Gemma 3 and M2M100, whose unit lookups are remote code too) and check, in one
    process where hf_tiednorm cannot be imported, that each reloads with identical logits and generations."""
    expected = {}
    for name in names:
        mode = "l2" if name in ("gemma3_text", "m2m_100") else "cosine"
        model = convert_checkpoint(
            source_folders[name], tmp_path / name, head_mode=mode, logit_scale_kind="scalar", generic=True
        )
        inputs = inputs_for(model)
        with torch.no_grad():
            expected[name] = {
                "logits": model(**inputs).logits.tolist(),
                "generated": model.generate(inputs["input_ids"], max_new_tokens=4, do_sample=False).tolist(),
                "auto": auto_class(model.config).__name__,
                "inputs": {k: v.tolist() for k, v in inputs.items()},
            }
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    out = run_without_package(
        f"""
import json, torch, transformers
expected = json.load(open({str(tmp_path / "expected.json")!r}))
for name, case in expected.items():
    model = getattr(transformers, case["auto"]).from_pretrained({str(tmp_path)!r} + "/" + name, trust_remote_code=True)
    inputs = {{k: torch.tensor(v) for k, v in case["inputs"].items()}}
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, torch.tensor(case["logits"]), rtol=0, atol=0)
        generated = model.generate(inputs["input_ids"], max_new_tokens=4, do_sample=False)
    assert generated.tolist() == case["generated"], name
    assert type(model).__name__.startswith("TiedNormWrapped"), type(model)
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__  # the remote code
    print(name, "ok")
""",
        cwd=tmp_path,
    )
    assert out.split() == [word for name in names for word in (name, "ok")]


def test_remote_code_reload_without_the_package(source_folders, tmp_path):
    # The remote code is the same three files for every architecture: one decoder, one scaled-embedding decoder in
    # l2 mode, and two encoder-decoders (T5's rescale, M2M100's three scaled embedding modules in l2 mode).
    check_remote_reload(["gpt2", "gemma3_text", "t5", "m2m_100"], source_folders, tmp_path)


@pytest.mark.slow  # every architecture: 13 conversions and remote loads (15 s on one free core, 45 s on shared ones)
def test_remote_code_reload_without_the_package_every_architecture(source_folders, tmp_path):
    check_remote_reload(ARCHITECTURES, source_folders, tmp_path)


def test_untied_checkpoints_and_other_inputs_are_refused(tmp_path):
    small = dict(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4, vocab_size=TINY_VOCAB
    )
    LlamaForCausalLM(LlamaConfig(tie_word_embeddings=False, **small)).save_pretrained(tmp_path / "untied")
    with pytest.raises(ValueError, match="untied output embeddings"):
        convert_checkpoint(tmp_path / "untied", generic=True)

    # Issue 14: a checkpoint whose config claims tie_word_embeddings=True but stores a different lm_head.
    config = json.loads((tmp_path / "untied" / "config.json").read_text())
    (tmp_path / "untied" / "config.json").write_text(json.dumps(config | {"tie_word_embeddings": True}))
    for generic in (False, True):  # our own Llama family and the wrapper
        with pytest.raises(ValueError, match="output matrix differs from its input embedding"):
            convert_checkpoint(tmp_path / "untied", tmp_path / "out", generic=generic)
        assert not (tmp_path / "out").exists()

    gpt2 = GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=TINY_VOCAB)
    with pytest.raises(ValueError, match="no plain linear output layer"):
        normalize_tied_head(AutoModel.from_config(gpt2), "cosine")  # no LM head
    converted = normalize_tied_head(GPT2LMHeadModel(gpt2), "cosine")
    with pytest.raises(ValueError, match="hf_tiednorm model already"):
        normalize_tied_head(converted, "l2")
    with pytest.raises(ValueError, match=r"\['label_smoothing'\] are fields of hf_tiednorm's own model families"):
        hf_tiednorm.TiedNormWrappedConfig(text_config=gpt2, label_smoothing=0.1)  # would be ignored silently
    with pytest.raises(ValueError, match="cannot wrap a t5 model; use AutoModelForSeq2SeqLM"):
        AutoModelForCausalLM.from_config(hf_tiednorm.TiedNormWrappedConfig(text_config=source_model("t5").config))


def test_l2_refuses_an_embedding_that_bypasses_nn_embedding_forward():
    class DirectLookup(torch.nn.Embedding):
        def forward(self, input_ids):
            return torch.nn.functional.embedding(input_ids, self.weight) * 2.0

    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=TINY_VOCAB))
    model.transformer.wte.__class__ = DirectLookup
    with pytest.raises(ValueError, match="does not look up through nn.Embedding.forward"):
        normalize_tied_head(model, "l2")
    normalize_tied_head(model, "cosine")  # the other modes leave the lookups alone
