"""Issue 13: bf16 autocast as the detected default of the training scripts (and --bf16 true on a CPU-only machine),
the HF MarianMTModel contender of run_translation.py --model_family marian, and embedding_init_std."""

from __future__ import annotations

import json
import logging
import math
import os

import pytest
import torch
from script_helpers import TINY_TRANSLATION_FLAGS, load_script, run_script, write_tiny_parallel
from transformers import AutoConfig, HfArgumentParser, MarianMTModel
from transformers.trainer_pt_utils import LabelSmoother

import hf_tiednorm
from hf_tiednorm.modeling.head.layer import TiedNormHead
from hf_tiednorm.modeling.loss.token import token_cross_entropy
from hf_tiednorm.training.precision import (
    CPU_BF16_ATTENTION,
    TiedNormSeq2SeqTrainingArguments,
    TiedNormTrainingArguments,
    choose_attention,
    cpu_bf16_flag,
    cpu_description,
    padding_multiple,
    register_cpu_bf16_attention,
    resolve_bf16,
    resolve_padding,
)

# TINY_TRANSLATION_FLAGS without its "--bf16 false": these tests choose the precision themselves.
TINY = TINY_TRANSLATION_FLAGS[:-2]
assert TINY_TRANSLATION_FLAGS[-2:] == ["--bf16", "false"]


@pytest.mark.parametrize(
    ("requested", "use_cpu", "accelerator", "flag", "expected", "why"),
    [
        (None, False, False, "avx512_bf16", True, "the CPU has avx512_bf16"),
        (None, False, False, "amx_bf16", True, "the CPU has amx_bf16"),
        (None, False, False, None, False, "bf16 would be emulated"),
        (None, False, True, "avx512_bf16", False, "an accelerator without native bf16: HF's default"),
        (None, True, True, "avx512_bf16", True, "the CPU has avx512_bf16"),  # --use_cpu on a GPU box trains on CPU
        (False, False, False, "avx512_bf16", False, "--bf16 false"),
        (True, False, False, None, True, "emulated and may be slower"),
        (True, False, True, None, True, "--bf16 true"),
    ],
)
def test_resolve_bf16(requested, use_cpu, accelerator, flag, expected, why):
    bf16, note = resolve_bf16(requested, use_cpu, accelerator, flag)
    assert bf16 is expected and why in note


@pytest.mark.parametrize(
    ("requested", "use_cpu", "expected", "why"),
    [
        (None, False, True, "the GPU (NVIDIA H200) has native bf16: bf16 autocast"),  # issue 38: the GPU default
        (False, False, False, "--bf16 false"),
        (None, True, True, "the CPU has avx512_bf16"),  # --use_cpu: the CPU decides
    ],
)
def test_resolve_bf16_on_a_gpu_with_native_bf16(requested, use_cpu, expected, why):
    bf16, note = resolve_bf16(requested, use_cpu, True, "avx512_bf16", "NVIDIA H200")
    assert bf16 is expected and why in note


@pytest.mark.parametrize(("requested", "on_accelerator", "expected"), [(None, True, 8), (None, False, 0), (0, True, 0),
                                                                       (16, False, 16)])
def test_resolve_padding_pads_to_a_multiple_of_8_on_an_accelerator(requested, on_accelerator, expected):
    """group_by_length batches without a padding multiple took ~209 shapes an epoch, 25 with 8 (issue 38)."""
    assert resolve_padding(requested, on_accelerator) == expected


def test_padding_multiple_reaches_the_collator_and_refuses_a_negative_one(tmp_path):
    args = TiedNormSeq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True, pad_to_multiple_of=8)
    assert padding_multiple(args) == 8 and "padded to a multiple of 8" in args.precision_note
    assert padding_multiple(TiedNormSeq2SeqTrainingArguments(output_dir=str(tmp_path), use_cpu=True)) is None
    with pytest.raises(ValueError, match="--pad_to_multiple_of must be >= 0"):
        TiedNormSeq2SeqTrainingArguments(output_dir=str(tmp_path), pad_to_multiple_of=-1)


def test_cpu_bf16_flag_reads_the_flags_line(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("model name\t: X\nflags\t\t: fpu avx512f avx512_bf16 sse\n\nflags\t\t: fpu avx512_bf16\n")
    assert cpu_bf16_flag(cpuinfo) == "avx512_bf16"
    cpuinfo.write_text("flags\t\t: fpu avx512f avx512_vnni\n")  # AVX-512 without bf16: emulated
    assert cpu_bf16_flag(cpuinfo) is None
    assert cpu_bf16_flag(tmp_path / "missing") is None


def test_cpu_description_names_the_processor_and_every_bf16_flag(tmp_path):
    """Grid rows and benchmark JSONs record which processor ran them: machines of one kind differ."""
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R)\nflags\t\t: fpu amx_bf16 avx512_bf16\n")
    assert cpu_description(cpuinfo) == f"CPU (Intel(R) Xeon(R), avx512_bf16+amx_bf16, {os.cpu_count()} cores)"
    cpuinfo.write_text("model name\t: AMD EPYC\nflags\t\t: fpu avx512f\n")
    assert cpu_description(cpuinfo).startswith("CPU (AMD EPYC, no native bf16, ")


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the CPU-only path")
@pytest.mark.parametrize("arguments", [TiedNormTrainingArguments, TiedNormSeq2SeqTrainingArguments])
def test_bf16_true_works_without_a_gpu_and_without_use_cpu(arguments, tmp_path):
    """transformers refuses --bf16 true without a bf16 GPU unless --use_cpu: "Your setup doesn't support bf16/gpu"."""
    parser = HfArgumentParser(arguments)
    (forced,) = parser.parse_args_into_dataclasses(args=["--output_dir", str(tmp_path), "--bf16", "true"])
    assert (forced.bf16, forced.mixed_precision, forced.use_cpu) == (True, "bf16", False)
    (off,) = parser.parse_args_into_dataclasses(args=["--output_dir", str(tmp_path), "--bf16", "false"])
    assert (off.bf16, off.mixed_precision, off.precision_note) == (False, "no", "--bf16 false")
    (default,) = parser.parse_args_into_dataclasses(args=["--output_dir", str(tmp_path)])
    assert default.bf16 is (cpu_bf16_flag() is not None)


def _spy_head(monkeypatch) -> list[tuple[bool, torch.dtype]]:
    """Records (CPU autocast on, logits dtype) of every training forward of the head."""
    seen = []
    forward = TiedNormHead.forward

    def spy(self, hidden_states):
        logits = forward(self, hidden_states)
        if self.training:
            seen.append((torch.is_autocast_enabled("cpu"), logits.dtype))
        return logits

    monkeypatch.setattr(TiedNormHead, "forward", spy)
    return seen


@pytest.mark.skipif(torch.accelerator.is_available(), reason="checks the CPU-only path")
@pytest.mark.parametrize(
    ("flags", "autocast", "logged"),
    [(["--bf16", "true"], True, "--bf16 true"), (["--bf16", "false"], False, "--bf16 false"), ([], None, None)],
)
def test_translation_precision_default_and_opt_out(flags, autocast, logged, tmp_path, monkeypatch, caplog):
    """--bf16 true trains under CPU autocast, --bf16 false without, and without the flag the script picks by the
    CPU's flags; the log says what and why. The logits (hence the loss) are fp32 either way."""
    if autocast is None:  # the default: by this CPU's flags
        autocast = cpu_bf16_flag() is not None
        logged = "native bf16 matmuls): bf16 autocast" if autocast else "bf16 would be emulated"
    seen = _spy_head(monkeypatch)
    caplog.set_level(logging.INFO)
    run_script("run_translation", [
        *write_tiny_parallel(tmp_path, n_train=32), "--output_dir", tmp_path / "out", *TINY, "--do_train",
        "--max_steps", "2", "--per_device_train_batch_size", "8", "--logging_steps", "1", "--save_strategy", "no",
        *flags,
    ], monkeypatch)
    assert seen and set(seen) == {(autocast, torch.float32)}
    notes = [r.getMessage() for r in caplog.records if r.getMessage().startswith("precision: ")]
    assert len(notes) == 1 and logged in notes[0]
    attention = [r.getMessage() for r in caplog.records if r.getMessage().startswith("attention: ")]
    assert attention == [f"attention: {CPU_BF16_ATTENTION} (bf16 on CPU, where SDPA's fused bf16 kernel is slower "
                         "than eager)" if autocast else "attention: sdpa (the model's)"]
    assert CPU_BF16_ATTENTION not in (tmp_path / "out" / "config.json").read_text()  # saved models keep HF's default
    losses = [e["loss"] for e in json.loads((tmp_path / "out" / "trainer_state.json").read_text())["log_history"]
              if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(loss) for loss in losses)


def test_marian_contender_trains_through_the_same_pipeline(tmp_path, monkeypatch):
    """--model_family marian: transformers' MarianMTModel, three-way tied, our dims, label smoothing by the Trainer,
    and the recipe's embedding_init_std on its shared matrix (row norms ≈ 1 at std = d^-1/2)."""
    out = tmp_path / "marian"
    run_script("run_translation", [
        *write_tiny_parallel(tmp_path), "--output_dir", out, *TINY, "--model_family", "marian",
        "--label_smoothing", "0.1", "--embedding_init_std", str(32**-0.5), "--do_train", "--do_predict",
        "--predict_with_generate", "--max_steps", "3",
        "--per_device_train_batch_size", "8", "--logging_steps", "1", "--save_strategy", "no",
    ], monkeypatch)
    config = AutoConfig.from_pretrained(out)
    assert config.model_type == "marian" and config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert (config.d_model, config.encoder_layers, config.encoder_ffn_dim, config.max_position_embeddings) == (
        32, 1, 64, 256)
    assert (config.scale_embedding, config.decoder_start_token_id, config.pad_token_id) == (True, 1, 0)
    model = MarianMTModel.from_pretrained(out)
    assert model.lm_head.weight is model.model.shared.weight is model.model.encoder.embed_tokens.weight
    norms = torch.linalg.vector_norm(model.model.shared.weight, dim=-1)
    assert norms[0] < 0.05 and norms[1:].mean().item() == pytest.approx(1.0, abs=0.1)  # 3 small steps from init
    assert torch.load(out / "training_args.bin", weights_only=False).label_smoothing_factor == 0.1
    results = json.loads((out / "all_results.json").read_text())
    assert 0 <= results["test_bleu"] <= 100 and math.isfinite(results["train_loss"])
    assert (out / "embedding_norms.png").is_file()


@pytest.mark.parametrize("flags", [["--head_mode", "cosine"], ["--tie_topology", "decoder"],
                                   ["--loss_chunk_size", "64"], ["--model_family", "fairseq"]])
def test_marian_contender_refuses_our_flags(flags, tmp_path, monkeypatch):
    family = [] if "--model_family" in flags else ["--model_family", "marian"]
    with pytest.raises(ValueError, match="--model_family"):
        run_script("run_translation", ["--output_dir", tmp_path, "--report_to", "none", *family, *flags], monkeypatch)


def test_baseline_mode_scores_and_loss_equal_hf_marian_with_the_same_weights():
    """The implementation gap: with Marian's weights copied in, our baseline mode gives HF Marian's logits, and our
    label-smoothed loss equals the Trainer's LabelSmoother on Marian's logits (HF's label smoothing path)."""
    config = hf_tiednorm.TiedNormSeq2SeqConfig(
        vocab_size=50, d_model=16, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=32, decoder_ffn_dim=32,
        encoder_attention_heads=2, decoder_attention_heads=2, head_mode="baseline", label_smoothing=0.1,
    )
    torch.manual_seed(0)
    theirs = MarianMTModel(load_script("run_translation").marian_config(config)).eval()
    ours = hf_tiednorm.TiedNormForConditionalGeneration(config).eval()
    missing, unexpected = ours.load_state_dict(theirs.state_dict(), strict=False)
    # final_logits_bias: a zero buffer in HF Marian; its sinusoidal position tables: frozen parameters there, buffers
    # computed when built here (equal to transformers' tables: tests/modeling/test_big_model_inference.py)
    positions = {"model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    assert set(unexpected) == {"final_logits_bias", *positions} and not missing
    inputs = torch.randint(3, 50, (3, 7))
    labels = torch.randint(3, 50, (3, 5))
    labels[0, 3:] = -100
    mine = ours(input_ids=inputs, labels=labels)
    hf = theirs(input_ids=inputs, decoder_input_ids=ours.prepare_decoder_input_ids_from_labels(labels))
    torch.testing.assert_close(mine.logits, hf.logits, rtol=1e-5, atol=1e-5)
    smoothed = LabelSmoother(epsilon=0.1)({"logits": hf.logits}, labels)
    torch.testing.assert_close(mine.loss, smoothed, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(token_cross_entropy(hf.logits, labels, 0.1), smoothed, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("family", ["seq2seq", "marian", "causal_gqa"])
def test_cpu_bf16_attention_equals_sdpa(family):
    """The eager attention with an fp32 softmax that bf16 on CPU trains with gives SDPA's outputs (fp32, padding,
    causal and cross attention, grouped-query heads), and its softmax is fp32 under bf16 autocast."""
    torch.manual_seed(0)
    if family == "causal_gqa":
        model = hf_tiednorm.TiedNormForCausalLM(hf_tiednorm.TiedNormCausalConfig(
            vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2))
    else:
        config = hf_tiednorm.TiedNormSeq2SeqConfig(
            vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=64, decoder_ffn_dim=64,
            encoder_attention_heads=4, decoder_attention_heads=4, dropout=0.0)
        marian = load_script("run_translation").marian_config(config)
        model = MarianMTModel(marian) if family == "marian" else hf_tiednorm.TiedNormForConditionalGeneration(config)
    model.eval()
    ids = torch.randint(3, 60, (3, 9))
    mask = torch.ones_like(ids)
    mask[0, 6:] = 0  # padding
    inputs = {"input_ids": ids, "attention_mask": mask, "use_cache": False}  # as in training (a cache keeps fp32)
    if family != "causal_gqa":
        inputs["decoder_input_ids"] = torch.randint(3, 60, (3, 7))
    with torch.no_grad():
        reference = model(**inputs).logits
        register_cpu_bf16_attention()  # what choose_attention does before it sets it
        model.set_attn_implementation(CPU_BF16_ATTENTION)
        torch.testing.assert_close(model(**inputs).logits, reference, rtol=1e-4, atol=1e-5)
    probabilities = []
    layer = model.model.layers[0].self_attn if family == "causal_gqa" else model.model.encoder.layers[0].self_attn
    layer.register_forward_hook(lambda module, args, kwargs, output: probabilities.append(output[1]), with_kwargs=True)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        model(**inputs)
    assert probabilities[0].dtype == torch.bfloat16  # cast back after the fp32 softmax, rows still sum to 1
    torch.testing.assert_close(probabilities[0].float().sum(-1), torch.ones(probabilities[0].shape[:-1]),
                               rtol=0, atol=1e-2)


def test_choose_attention_only_for_bf16_on_cpu(tmp_path):
    model = hf_tiednorm.TiedNormForConditionalGeneration(hf_tiednorm.TiedNormSeq2SeqConfig(
        vocab_size=60, d_model=32, encoder_layers=1, decoder_layers=1))
    (fp32,) = HfArgumentParser(TiedNormSeq2SeqTrainingArguments).parse_args_into_dataclasses(
        args=["--output_dir", str(tmp_path), "--bf16", "false"])
    assert choose_attention(model, fp32) == "attention: sdpa (the model's)"
    assert model.config._attn_implementation == "sdpa"
    (bf16,) = HfArgumentParser(TiedNormSeq2SeqTrainingArguments).parse_args_into_dataclasses(
        args=["--output_dir", str(tmp_path), "--bf16", "true", "--use_cpu", "true"])
    choose_attention(model, bf16)
    assert model.config._attn_implementation == model.model.encoder.config._attn_implementation == CPU_BF16_ATTENTION
    other = MarianMTModel(load_script("run_translation").marian_config(model.config))
    other.config.model_type = "gemma2"  # stands for any type whose eager attention ours does not reproduce
    assert choose_attention(other, bf16) == "attention: sdpa (the model's)"


def test_benchmark_arguments_refuse_unknown_runs():
    """experiments/benchmark_trainer_loop.py (its numbers come from running it, never from tests)."""
    arguments = load_script("benchmark_trainer_loop").BenchmarkArguments
    assert arguments().model_list() == ["ours-baseline", "ours-baseline-chunked", "ours-cosine", "marian"]
    with pytest.raises(ValueError, match="unknown --models/--precisions"):
        arguments(models="ours-baseline,fairseq")
    with pytest.raises(ValueError, match="unknown --models/--precisions"):
        arguments(precisions="fp16")
    with pytest.raises(ValueError, match="--skip_steps must be in"):
        arguments(steps=5, skip_steps=5)
