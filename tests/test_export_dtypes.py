"""Issue 51, item 1: a bf16 (or fp16) checkpoint of every family and of the wrapper exports. The checked parent is
built as ``from_pretrained`` builds it from the written folder (buffers in the dtype their module gives them, RoPE's
``inv_freq`` in fp32: 7bdafef cast it to bf16, and a bf16 SmolLM2 cosine export was refused, blaming the head); the
tie follows the fp32 rule; a refusal names the tensor or buffer that differs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from testing_utils import tiny_model, tiny_tokenizer
from tiny_architectures import source_model
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, LlamaConfig, LlamaForCausalLM

from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _own(family):
    return tiny_model(family, head_mode="cosine", logit_scale_kind="vector")


def _wrapped(architecture):
    return normalize_tied_head(source_model(architecture), "cosine", generic=True, logit_scale_kind="scalar").eval()


SOURCES = {
    "seq2seq": lambda: _own("seq2seq"),
    "bart": lambda: _own("bart"),
    "causal": lambda: _own("causal"),  # Llama-style: RoPE
    "wrapped-llama": lambda: _wrapped("llama"),  # RoPE under the wrapper
    "wrapped-marian": lambda: _wrapped("marian"),  # sinusoidal positions, final_logits_bias
}


def _loaded(model, folder: Path, dtype: torch.dtype):
    """``model`` saved and loaded back in ``dtype``, as a bf16/fp16 fine-tune reaches the export."""
    with torch.no_grad():
        head = model.get_output_embeddings()
        head.logit_scale.mul_(1.25)  # a trained-looking scale: the output layer is untied
    model.save_pretrained(folder)
    auto = AutoModelForSeq2SeqLM if model.config.is_encoder_decoder else AutoModelForCausalLM
    return auto.from_pretrained(folder, dtype=dtype).eval()


# bf16 (the route docs/training.md recommends) for every source; fp16 for one RoPE model and one encoder-decoder.
CASES = [(name, "bf16") for name in SOURCES] + [("causal", "fp16"), ("wrapped-marian", "fp16")]


@torch.no_grad()
@pytest.mark.parametrize(("name", "dtype"), CASES)
def test_a_half_precision_checkpoint_exports_as_the_parent_from_pretrained_builds(name, dtype, tmp_path):
    source = _loaded(SOURCES[name](), tmp_path / "model", DTYPES[dtype])
    result = export_plain(source, tmp_path / "out", tokenizer=_tokenizer(tmp_path), write_card=False)
    assert result.max_abs_diff <= result.tolerance
    auto = AutoModelForSeq2SeqLM if source.config.is_encoder_decoder else AutoModelForCausalLM
    reloaded = auto.from_pretrained(tmp_path / "out").eval()
    # PlainExport.model is the parent a user loads: the same buffers, in the same dtypes, and the same logits.
    ours, theirs = dict(result.model.named_buffers()), dict(reloaded.named_buffers())
    assert {k: v.dtype for k, v in ours.items()} == {k: v.dtype for k, v in theirs.items()}  # 7bdafef: inv_freq bf16
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert {k: v.dtype for k, v in result.model.state_dict().items()} == {
        k: v.dtype for k, v in reloaded.state_dict().items()
    }
    inputs = {"input_ids": torch.randint(4, 60, (2, 9), generator=torch.Generator().manual_seed(3))}
    if source.config.is_encoder_decoder:
        inputs["decoder_input_ids"] = inputs["input_ids"][:, :6]
    assert torch.equal(result.model(**inputs).logits, reloaded(**inputs).logits)
    rotary = [name for name in ours if name.endswith("inv_freq")]
    assert all(ours[name].dtype == torch.float32 for name in rotary)
    assert not result.tied  # a trained scale of 1.25: untied in every dtype


def _tokenizer(tmp_path: Path) -> Path:
    folder = tmp_path / "tokenizer"
    if not folder.exists():
        tiny_tokenizer().save_pretrained(folder)
    return folder


def _lossless_llama(tmp_path: Path, saved_dtype: torch.dtype):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=True)  # fmt: skip
    LlamaForCausalLM(config).to(saved_dtype).save_pretrained(tmp_path / "llama")
    return convert_checkpoint(tmp_path / "llama", head_mode="cosine", lossless_start=True)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_a_half_precision_lossless_start_ties_as_in_fp32_docs_deploy(dtype, tmp_path):
    """docs/deploy.md: converted from a bf16/fp16 source, g_i = ‖w_i‖ is computed in fp32 from the half-precision
    rows and kept in fp32 (the head's learned terms), so the effective scale is 1 and the tie is kept, with the
    logits the model's, as in fp32; converted in fp32 and then cast (``.to(dtype)`` casts g too), g_i is rounded and
    the output layer is untied, with the model's logits."""
    converted = _lossless_llama(tmp_path, DTYPES[dtype])
    converted.save_pretrained(tmp_path / "converted")
    source = AutoModelForCausalLM.from_pretrained(tmp_path / "converted")
    assert source.dtype == DTYPES[dtype] and source.lm_head.logit_scale.dtype == torch.float32
    tied = export_plain(source)
    assert tied.tied and tied.max_abs_diff <= tied.tolerance
    assert tied.added_values <= 0  # no V×d matrix added (the folded logit scale is removed)
    cast = _lossless_llama(tmp_path / "fp32", torch.float32).to(DTYPES[dtype])
    untied = export_plain(cast)
    assert not untied.tied and untied.max_abs_diff <= untied.tolerance


def test_a_refusal_names_the_buffer_that_differs_not_the_head(tmp_path):
    # fp32, whose tolerance (1e-4 relative) a changed rotation shows above in these tiny random models.
    source = _loaded(_own("causal"), tmp_path / "model", torch.float32)
    rotary = source.model.rotary_emb
    with torch.no_grad():
        rotary.inv_freq.mul_(3.0)  # a buffer the parent, as from_pretrained builds it, does not hold
    with pytest.raises(ValueError, match=r"buffer model\.rotary_emb\.inv_freq \(values") as refusal:
        export_plain(source, tmp_path / "out")  # 7bdafef: "the baked output layer does not compute the model's scores"
    assert "baked output layer" not in str(refusal.value)
    assert not (tmp_path / "out").exists()
    rotary.inv_freq = rotary.inv_freq.to(torch.bfloat16)  # cast, as model.to(torch.bfloat16) casts it
    with pytest.raises(ValueError, match=r"inv_freq \(dtype: the model's is bfloat16, the export's, as from_pre"):
        export_plain(source)
