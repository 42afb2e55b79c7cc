"""The lossless start of a conversion (``lossless_start=True``, CLI ``--lossless-start``, issue 27): the head is
normalized, yet the converted model computes its source's logits, on every architecture and every mode but l2 (which
is refused with the reason); and a GGUF-loaded model's stale quantization state is dropped by the conversion."""

from __future__ import annotations

import pytest
import torch
from testing_utils import TINY_VOCAB
from tiny_architectures import ARCHITECTURES, auto_class, inputs_for, source_model
from transformers import GgufConfig
from transformers.quantizers.quantizer_gguf import GgufHfQuantizer

from hf_tiednorm.convert import convert_checkpoint, main, normalize_tied_head

LOSSLESS_MODES = ("baseline", "cosine", "square", "distance")
# What the lossless start sets, per mode: (logit_scale, logit_bias).
EXPECTED_OPTIONS = {
    "baseline": ("none", False),
    "cosine": ("vector", False),
    "square": ("vector", False),
    "distance": ("none", True),
}


def source_logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


@pytest.mark.parametrize("head_mode", LOSSLESS_MODES)
@pytest.mark.parametrize("name", ARCHITECTURES)
def test_in_memory_lossless_start_gives_the_source_logits(name, head_mode):
    source = source_model(name)
    inputs = inputs_for(source)
    expected = source_logits(source, inputs)
    model = normalize_tied_head(source, head_mode, lossless_start=True, generic=True).eval()
    assert model.get_output_embeddings().head_mode == head_mode  # the head is normalized...
    assert (model.config.logit_scale_kind, model.config.logit_bias) == EXPECTED_OPTIONS[head_mode]
    torch.testing.assert_close(source_logits(model, inputs), expected, rtol=1e-5, atol=1e-5)  # ...at the same logits
    # and a training batch (more tokens than d: the scale is folded into W's rows) as well
    long = {"input_ids": torch.randint(4, TINY_VOCAB, (4, 16))}
    if source.config.is_encoder_decoder:
        long["decoder_input_ids"] = torch.randint(4, TINY_VOCAB, (4, 12))
    torch.testing.assert_close(
        source_logits(model, long), source_logits(source_model(name), long), rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("head_mode", LOSSLESS_MODES)
@pytest.mark.parametrize("name", ["marian", "bart", "llama"])
def test_own_family_lossless_start_from_the_cli_saves_and_reloads(name, head_mode, tmp_path):
    source = source_model(name)
    if hasattr(source, "final_logits_bias"):  # our own families have none (a non-zero one is refused)
        source.final_logits_bias.zero_()
    source.save_pretrained(tmp_path / "source")
    inputs = inputs_for(source)
    main([str(tmp_path / "source"), str(tmp_path / "converted"), "--head-mode", head_mode, "--lossless-start"])
    model = auto_class(source.config).from_pretrained(tmp_path / "converted").eval()
    assert type(model).__name__.startswith("TiedNorm") and model.config.head_mode == head_mode
    torch.testing.assert_close(source_logits(model, inputs), source_logits(source, inputs), rtol=1e-5, atol=1e-5)


def test_a_plain_normalized_conversion_does_not_give_the_source_logits():
    # The contrast that makes the option worth having (and the tests above able to fail).
    source = source_model("llama")
    inputs = inputs_for(source)
    model = normalize_tied_head(source_model("llama"), "cosine").eval()
    assert not torch.allclose(source_logits(model, inputs), source_logits(source, inputs), atol=1e-3)


def test_dead_rows_follow_the_head_rule():
    # A zero row scores 0 in the normalized head, as it does in the source: still exact.
    source = source_model("qwen2")
    with torch.no_grad():
        source.get_input_embeddings().weight[7].zero_()
    inputs = inputs_for(source)
    expected = source_logits(source, inputs)
    model = normalize_tied_head(source, "cosine", lossless_start=True).eval()
    logits = source_logits(model, inputs)
    assert torch.equal(logits[..., 7], torch.zeros_like(logits[..., 7]))
    torch.testing.assert_close(logits, expected, rtol=1e-5, atol=1e-5)


def test_l2_and_contradicting_logit_scales_are_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="impossible for head_mode 'l2'.*input"):
        normalize_tied_head(source_model("gpt2"), "l2", lossless_start=True)
    with pytest.raises(ValueError, match="per-token logit scale.*logit_scale_kind='scalar'"):
        normalize_tied_head(source_model("gpt2"), "cosine", logit_scale_kind="scalar", lossless_start=True)
    with pytest.raises(ValueError, match="needs no logit scale"):
        normalize_tied_head(source_model("gpt2"), "distance", logit_scale_kind="vector", lossless_start=True)
    source_model("llama").save_pretrained(tmp_path / "source")
    with pytest.raises(ValueError, match="impossible for head_mode 'l2'"):  # before anything is written
        convert_checkpoint(tmp_path / "source", tmp_path / "out", head_mode="l2", lossless_start=True)
    assert not (tmp_path / "out").exists()


def test_a_learned_bias_on_top_keeps_the_start_lossless():
    source = source_model("gpt2")
    inputs = inputs_for(source)
    model = normalize_tied_head(source_model("gpt2"), "cosine", logit_bias=True, lossless_start=True).eval()
    assert model.config.logit_scale_kind == "vector" and model.config.logit_bias is True
    torch.testing.assert_close(source_logits(model, inputs), source_logits(source, inputs), rtol=1e-5, atol=1e-5)


def gguf_loaded(name: str):
    """A tiny model in the state transformers leaves a GGUF-loaded one: dequantized weights, but a gguf
    quantization_config on its config and an hf_quantizer on the model."""
    model = source_model(name)
    config = GgufConfig()
    model.config.quantization_config = config
    model.hf_quantizer = GgufHfQuantizer(config)
    model.is_quantized = True
    return model


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_a_gguf_loaded_model_converts_without_quantization_state(name, tmp_path):
    model = normalize_tied_head(gguf_loaded(name), "cosine", lossless_start=True, generic=True)
    assert not hasattr(model.config, "quantization_config")
    assert not hasattr(model.config.text_config, "quantization_config")
    assert getattr(model.model, "hf_quantizer", None) is None
    model.save_pretrained(tmp_path / "converted")
    saved = (tmp_path / "converted" / "config.json").read_text()
    assert "quantization_config" not in saved and "gguf" not in saved


def test_still_quantized_models_are_refused():
    model = source_model("gpt2")
    model.config.quantization_config = {"quant_method": "bitsandbytes", "load_in_4bit": True}
    with pytest.raises(ValueError, match=r"quantized \(bitsandbytes\).*load it unquantized"):
        normalize_tied_head(model, "cosine")


def test_a_missing_gguf_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="model.Q4_1.gguf does not exist"):
        main([str(tmp_path / "model.Q4_1.gguf"), str(tmp_path / "out")])
    with pytest.raises(FileNotFoundError, match="other.gguf does not exist"):
        main([str(tmp_path), str(tmp_path / "out"), "--gguf-file", "other.gguf"])
