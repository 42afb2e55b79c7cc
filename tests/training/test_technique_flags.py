"""The technique flags of scripts/run_clm.py and scripts/run_translation.py (issue 4): projection and weight-norm
regularization, weight-norm initialization, the chunked loss, adaptive input/softmax with a frequency-ordered
tokenizer, fine-tuning rules, and the errors bad values give."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml
from datasets import Dataset
from huggingface_hub.errors import StrictDataclassError
from safetensors.torch import load_file
from script_helpers import TINY_TRANSLATION_FLAGS, read_lines, run_script
from testing_utils import interrupted_run
from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_tiednorm
from hf_tiednorm.modeling.loss.regularizers import projection_penalty, weight_norm_penalty
from hf_tiednorm.training.data import group_texts, token_counts
from hf_tiednorm.training.weight_norm_init import weight_norm_targets

N_TRAIN = 300
# A tiny causal LM: a few seconds per run on one CPU thread. Architecture flags apply to new models only.
TINY_CLM_ARCHITECTURE = [
    "--vocab_size", "300", "--hidden_size", "32", "--intermediate_size", "64", "--num_hidden_layers", "1",
    "--num_attention_heads", "2",
]
TINY_CLM_RUN = [
    "--max_train_samples", str(N_TRAIN), "--max_eval_samples", "60", "--block_size", "32",
    "--per_device_train_batch_size", "8", "--report_to", "none", "--num_threads", "1",
    "--dataloader_pin_memory", "false", "--logging_steps", "1", "--seed", "0", "--bf16", "false",
]
REGULARIZED = [
    "--projection_regularization", "0.15", "--weight_norm_regularization", "1e-3", "--weight_norm_target", "1.5",
    "--weight_norm_init_sigma", "0.5", "--loss_chunk_size", "64",
]
ALL_TERMS = {"cross_entropy", "projection_penalty", "weight_norm_penalty"}


def clm_flags(multi30k, output_dir, *extra) -> list:
    return [
        "--train_file", multi30k / "train.en.gz", "--validation_file", multi30k / "val.en.gz",
        "--test_file", multi30k / "test_2016_flickr.en.gz", "--output_dir", output_dir, *TINY_CLM_RUN, *extra,
    ]


def train_logs(output_dir) -> list[dict]:
    state = json.loads((output_dir / "trainer_state.json").read_text())
    return [entry for entry in state["log_history"] if "loss" in entry]


def assert_terms_sum_to_loss(logs: list[dict], terms: set[str]) -> None:
    assert logs
    for entry in logs:
        assert terms <= entry.keys(), entry
        assert entry["loss"] == pytest.approx(sum(entry[name] for name in terms), rel=1e-3)


def run_module_script(name: str, flags: list) -> None:
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script(name, flags, monkeypatch)
    finally:
        monkeypatch.undo()


@pytest.fixture(scope="module")
def regularized_clm(multi30k_dir, tmp_path_factory):
    """run_clm with projection + weight-norm regularization, weight-norm init and the chunked loss: 4 steps."""
    output_dir = tmp_path_factory.mktemp("clm_regularized")
    run_module_script("run_clm", clm_flags(
        multi30k_dir, output_dir, *TINY_CLM_ARCHITECTURE, *REGULARIZED, "--do_train", "--do_eval",
        "--max_steps", "4", "--save_steps", "2",
    ))
    return output_dir


@pytest.fixture(scope="module")
def adaptive_clm(multi30k_dir, tmp_path_factory):
    """run_clm with adaptive input/softmax (bands [0, 40), [40, 120), [120, 300)): 3 steps."""
    output_dir = tmp_path_factory.mktemp("clm_adaptive")
    run_module_script("run_clm", clm_flags(
        multi30k_dir, output_dir, *TINY_CLM_ARCHITECTURE, "--adaptive_cutoffs", "40", "120", "--adaptive_div_value",
        "2", "--do_train", "--do_eval", "--max_steps", "3", "--save_strategy", "no",
    ))
    return output_dir


def test_clm_logs_each_loss_term(regularized_clm):
    logs = train_logs(regularized_clm)
    assert [entry["step"] for entry in logs] == [1, 2, 3, 4]
    assert_terms_sum_to_loss(logs, ALL_TERMS)
    # P starts as the identity: λ·‖I‖_F = 0.15·sqrt(32) at the first step, moved little by a few small steps.
    assert logs[0]["projection_penalty"] == pytest.approx(0.15 * math.sqrt(32), rel=0.05)


def test_clm_saves_technique_config_and_initial_norms(regularized_clm):
    config = hf_tiednorm.TiedNormCausalConfig.from_pretrained(regularized_clm)
    assert config.projection_regularization == 0.15
    assert (config.weight_norm_regularization, config.weight_norm_target) == (1e-3, 1.5)
    assert (config.weight_norm_init_sigma, config.loss_chunk_size) == (0.5, 64)
    # Two steps after the initialization, the row norms of frequent tokens still follow sigma*log(count).
    counts = torch.load(regularized_clm / "token_counts.pt")
    model = hf_tiednorm.TiedNormForCausalLM.from_pretrained(regularized_clm / "checkpoint-2")
    norms = model.lm_head.weight.detach().norm(dim=-1)
    targets = weight_norm_targets(counts, 0.5)
    frequent = counts > 20
    assert torch.corrcoef(torch.stack([norms[frequent], targets[frequent]]))[0, 1] > 0.9


def test_clm_perplexity_excludes_penalties(regularized_clm):
    """eval_loss = mean cross-entropy + penalties of the final weights; perplexity is exp(cross-entropy)."""
    results = json.loads((regularized_clm / "all_results.json").read_text())
    model = hf_tiednorm.TiedNormForCausalLM.from_pretrained(regularized_clm)
    with torch.no_grad():
        penalties = projection_penalty(model.output_projection.weight, 0.15) + weight_norm_penalty(
            [model.lm_head.weight], 1e-3, 1.5
        )
    for prefix in ("eval", "test"):
        difference = results[f"{prefix}_loss"] - results[f"{prefix}_cross_entropy"]
        assert difference == pytest.approx(penalties.item(), rel=1e-4)
        assert results[f"{prefix}_perplexity"] == pytest.approx(math.exp(results[f"{prefix}_cross_entropy"]))


def test_clm_resume_keeps_terms_consistent(regularized_clm, multi30k_dir, tmp_path, monkeypatch):
    """The first log after resuming averages the terms over the steps since the resume, not since step 0."""
    resumed = interrupted_run(regularized_clm, "checkpoint-2", tmp_path / "resumed")
    run_script("run_clm", clm_flags(
        multi30k_dir, resumed, *TINY_CLM_ARCHITECTURE, *REGULARIZED, "--do_train", "--max_steps", "4",
        "--save_strategy", "no", "--resume_from_checkpoint", "last",
    ), monkeypatch)
    logs = [entry for entry in train_logs(resumed) if entry["step"] > 2]
    assert [entry["step"] for entry in logs] == [3, 4]
    assert_terms_sum_to_loss(logs, ALL_TERMS)


def test_clm_finetune_may_change_loss_weights(regularized_clm, multi30k_dir, tmp_path, monkeypatch):
    output_dir = tmp_path / "finetuned"
    run_script("run_clm", clm_flags(
        multi30k_dir, output_dir, "--model_name_or_path", regularized_clm, "--do_train", "--max_steps", "2",
        "--save_strategy", "no", "--projection_regularization", "0.3", "--weight_norm_regularization", "0",
    ), monkeypatch)
    config = hf_tiednorm.TiedNormCausalConfig.from_pretrained(output_dir)
    assert (config.projection_regularization, config.weight_norm_regularization) == (0.3, 0.0)
    logs = train_logs(output_dir)
    assert all("weight_norm_penalty" not in entry for entry in logs)
    assert_terms_sum_to_loss(logs, {"cross_entropy", "projection_penalty"})


def test_clm_adaptive_trains_saves_and_reports_perplexity(adaptive_clm):
    config = hf_tiednorm.TiedNormCausalConfig.from_pretrained(adaptive_clm)
    assert (config.adaptive_cutoffs, config.adaptive_div_value, config.vocab_size) == ([40, 120], 2.0, 300)
    results = json.loads((adaptive_clm / "all_results.json").read_text())
    for prefix in ("eval", "test"):
        assert results[f"{prefix}_perplexity"] == pytest.approx(math.exp(results[f"{prefix}_loss"]))
        assert 1 < results[f"{prefix}_perplexity"] < 10 * 300
    model = AutoModelForCausalLM.from_pretrained(adaptive_clm)
    assert isinstance(model.lm_head, hf_tiednorm.modeling.head.adaptive.AdaptiveSoftmaxHead)
    assert_terms_sum_to_loss(train_logs(adaptive_clm), {"cross_entropy"})


def test_clm_adaptive_tokenizer_is_frequency_ordered(adaptive_clm, multi30k_dir):
    tokenizer = AutoTokenizer.from_pretrained(adaptive_clm)
    specials = [tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id]
    assert specials == [0, 1, 2, 3]
    lines = Dataset.from_dict({"text": read_lines(multi30k_dir / "train.en.gz", N_TRAIN)})
    counts = token_counts(group_texts(lines, tokenizer, 32), len(tokenizer), ("input_ids",))
    assert torch.equal(counts, torch.load(adaptive_clm / "token_counts.pt"))
    rest = counts[4:]
    assert torch.all(rest[:-1] >= rest[1:]), "ids after the special tokens must follow decreasing training counts"
    assert rest[0] > rest[-1]


def test_clm_adaptive_renumbers_a_given_tokenizer(regularized_clm, multi30k_dir, tmp_path, monkeypatch):
    """--tokenizer_name with --adaptive_cutoffs (from a YAML list): the model gets a renumbered copy of it."""
    output_dir = tmp_path / "given"
    config_file = tmp_path / "adaptive.yaml"
    config_file.write_text(yaml.safe_dump({"adaptive_cutoffs": [40, 120], "tokenizer_name": str(regularized_clm)}))
    run_script("run_clm", [config_file, *clm_flags(
        multi30k_dir, output_dir, *TINY_CLM_ARCHITECTURE, "--do_train", "--max_steps", "1", "--save_strategy", "no",
    )], monkeypatch)
    given, saved = AutoTokenizer.from_pretrained(regularized_clm), AutoTokenizer.from_pretrained(output_dir)
    assert given.get_vocab().keys() == saved.get_vocab().keys() and given.get_vocab() != saved.get_vocab()
    assert [saved.convert_tokens_to_ids(token) for token in given.all_special_tokens] == given.all_special_ids
    counts = torch.load(output_dir / "token_counts.pt")
    assert torch.all(counts[4:-1] >= counts[5:])
    assert hf_tiednorm.TiedNormCausalConfig.from_pretrained(output_dir).adaptive_cutoffs == [40, 120]


def test_translation_with_technique_flags(multi30k_dir, tmp_path, monkeypatch):
    """Adaptive three-way embedding + projection and weight-norm regularization on the encoder-decoder."""
    output_dir = tmp_path / "de_en"
    run_script("run_translation", [
        "--train_file", multi30k_dir / "train.{lang}.gz", "--validation_file", multi30k_dir / "val.{lang}.gz",
        "--test_file", multi30k_dir / "test_2016_flickr.{lang}.gz", "--output_dir", output_dir,
        "--max_train_samples", "200", "--max_eval_samples", "8", "--max_predict_samples", "8",
        *TINY_TRANSLATION_FLAGS, "--adaptive_cutoffs", "50", "150", "--adaptive_tie_projections", "false",
        "--projection_regularization", "0.15", "--weight_norm_regularization", "1e-3", "--weight_norm_init_sigma",
        "0.5", "--do_train", "--do_eval", "--do_predict", "--predict_with_generate", "--max_steps", "3",
        "--per_device_train_batch_size", "16", "--logging_steps", "1", "--save_strategy", "no",
    ], monkeypatch)
    config = hf_tiednorm.TiedNormSeq2SeqConfig.from_pretrained(output_dir)
    assert (config.adaptive_cutoffs, config.adaptive_tie_projections) == ([50, 150], False)
    assert (config.projection_regularization, config.weight_norm_regularization) == (0.15, 1e-3)
    assert config.weight_norm_init_sigma == 0.5
    assert_terms_sum_to_loss(train_logs(output_dir), ALL_TERMS)
    counts = torch.load(output_dir / "token_counts.pt")  # both sides, in the renumbered ids
    assert torch.all(counts[4:-1] >= counts[5:])
    results = json.loads((output_dir / "all_results.json").read_text())
    assert "test_bleu" in results and results["eval_cross_entropy"] < results["eval_loss"]
    assert results["eval_perplexity"] == pytest.approx(math.exp(results["eval_cross_entropy"]))


@pytest.mark.parametrize("script", ["run_clm", "run_translation"])
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--adaptive_cutoffs", "40", "400"], r"strictly increasing ints in \[1, vocab_size - 1\] = \[1, 299\]"),
        (["--adaptive_cutoffs", "120", "40"], "adaptive_cutoffs must be strictly increasing"),
        (["--adaptive_cutoffs", "40", "--loss_chunk_size", "64"], "does not apply to the adaptive softmax"),
        (["--head_mode", "l2", "--weight_norm_init_sigma", "1"], "head_mode='l2'"),
        (["--head_mode", "l2", "--weight_norm_regularization", "1e-3"], "head_mode='l2'"),
        (["--projection_regularization", "-1"], r"'projection_regularization':\s+ValueError: Value must be >= 0"),
        (["--loss_chunk_size", "0"], r"'loss_chunk_size':\s+ValueError: Value must be a positive integer"),
    ],
)
def test_bad_technique_flags(script, flags, message, tmp_path, monkeypatch):
    # a field's range by the configuration, a mode's math where the model is built (issue 56)
    with pytest.raises((StrictDataclassError, ValueError), match=message):
        run_script(script, ["--output_dir", tmp_path, "--vocab_size", "300", "--report_to", "none", "--do_train",
                            *flags], monkeypatch)


@pytest.mark.parametrize("script", ["run_clm", "run_translation"])
@pytest.mark.parametrize(
    ("values", "bad"), [(["40", "x"], "x"), (["40,"], "40,"), (["40,120"], "40,120")],  # the last: the old form
)
def test_malformed_cutoffs_name_the_flag(script, values, bad, tmp_path, monkeypatch, capsys):
    """--adaptive_cutoffs takes token ids (nargs); anything else is refused before any work, naming the flag."""
    with pytest.raises(SystemExit):
        run_script(script, ["--output_dir", tmp_path, "--report_to", "none", "--adaptive_cutoffs", *values],
                   monkeypatch)
    assert f"argument --adaptive_cutoffs/--adaptive-cutoffs: invalid int value: '{bad}'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--adaptive_cutoffs", "40"], "--adaptive_cutoffs cannot change a saved model"),
        (["--adaptive_tie_projections", "false"], "--adaptive_tie_projections cannot change a saved model"),
        (["--projection_regularization", "0.15"], "adds a projection P, which the saved model"),
        (["--weight_norm_init_sigma", "1"], "--weight_norm_init_sigma initializes a new model"),
    ],
)
def test_finetune_rejects_architecture_technique_flags(adaptive_clm, flags, message, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match=message):
        run_script("run_clm", ["--output_dir", tmp_path, "--model_name_or_path", adaptive_clm, *flags], monkeypatch)


def test_finetune_rechecks_changed_fields(adaptive_clm, multi30k_dir, tmp_path, monkeypatch):
    """A loss field that conflicts with the saved architecture fails with the config's own error."""
    with pytest.raises(StrictDataclassError, match="does not apply to the adaptive softmax"):
        run_script("run_clm", clm_flags(
            multi30k_dir, tmp_path, "--model_name_or_path", adaptive_clm, "--do_train", "--loss_chunk_size", "64",
        ), monkeypatch)


@pytest.mark.parametrize("family", ["seq2seq", "bart", "causal"])
def test_embedding_init_std_sets_row_norms_and_round_trips(family, tmp_path):
    """embedding_init_std = d^-1/2 (fairseq's init, which the paper trained square mode with): row norms ≈ 1 instead
    of 0.02·√d, the padding row zero, the output matrix tied to it; the field survives save/load, and the loaded
    model keeps the saved weights (the init does not run over them)."""
    config_class, model_class = {
        "seq2seq": (hf_tiednorm.TiedNormSeq2SeqConfig, hf_tiednorm.TiedNormForConditionalGeneration),
        "bart": (hf_tiednorm.TiedNormBartConfig, hf_tiednorm.TiedNormBartForConditionalGeneration),
        "causal": (hf_tiednorm.TiedNormCausalConfig, hf_tiednorm.TiedNormForCausalLM),
    }[family]
    d = 64
    sizes = {"hidden_size": d} if family == "causal" else {"d_model": d}
    torch.manual_seed(0)
    model = model_class(config_class(vocab_size=400, head_mode="square", embedding_init_std=d**-0.5, **sizes))
    weight = model.get_input_embeddings().weight
    norms = torch.linalg.vector_norm(weight, dim=-1)
    assert norms[model.config.pad_token_id] == 0
    assert norms[1:].mean().item() == pytest.approx(1.0, abs=0.03)
    assert model.get_output_embeddings().weight is weight
    default = model_class(config_class(vocab_size=400, head_mode="square", **sizes)).get_input_embeddings().weight
    assert torch.linalg.vector_norm(default, dim=-1)[1:].mean().item() == pytest.approx(0.02 * d**0.5, rel=0.05)
    model.save_pretrained(tmp_path)
    reloaded = model_class.from_pretrained(tmp_path)
    assert reloaded.config.embedding_init_std == d**-0.5
    torch.testing.assert_close(reloaded.get_input_embeddings().weight, weight, rtol=0, atol=0)


def test_embedding_init_std_untied_output_and_errors():
    model = hf_tiednorm.TiedNormForConditionalGeneration(hf_tiednorm.TiedNormSeq2SeqConfig(
        vocab_size=300, d_model=64, tie_topology="untied", embedding_init_std=0.125))
    for weight in (model.model.encoder.embed_tokens.weight, model.model.decoder.embed_tokens.weight,
                   model.lm_head.weight):
        assert torch.linalg.vector_norm(weight, dim=-1)[1:].mean().item() == pytest.approx(1.0, abs=0.05)
    with pytest.raises(StrictDataclassError, match=r"'embedding_init_std':\s+ValueError: Value must be > 0"):
        hf_tiednorm.TiedNormSeq2SeqConfig(embedding_init_std=0.0)
    with pytest.raises(StrictDataclassError, match="leave one of embedding_init_std / adaptive_cutoffs unset"):
        hf_tiednorm.TiedNormCausalConfig(embedding_init_std=0.06, adaptive_cutoffs=[2000])


def test_embedding_init_std_flag_reaches_the_trained_config(multi30k_dir, tmp_path, monkeypatch):
    output_dir = tmp_path / "square"
    run_script("run_translation", [
        "--train_file", multi30k_dir / "train.{lang}.gz", "--validation_file", multi30k_dir / "val.{lang}.gz",
        "--test_file", multi30k_dir / "test_2016_flickr.{lang}.gz", "--output_dir", output_dir,
        "--max_train_samples", "100", *TINY_TRANSLATION_FLAGS, "--head_mode", "square", "--embedding_init_std",
        str(32**-0.5), "--do_train", "--max_steps", "1", "--per_device_train_batch_size", "8", "--save_strategy",
        "no",
    ], monkeypatch)
    config = hf_tiednorm.TiedNormSeq2SeqConfig.from_pretrained(output_dir)
    assert (config.head_mode, config.embedding_init_std) == ("square", 32**-0.5)
    weight = load_file(output_dir / "model.safetensors")["model.shared.weight"]
    assert torch.linalg.vector_norm(weight, dim=-1)[1:].mean().item() == pytest.approx(1.0, abs=0.1)  # one step on
