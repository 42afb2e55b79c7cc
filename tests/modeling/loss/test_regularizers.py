"""Projection regularization (Press & Wolf) and weight-norm regularization (Herold et al.): values, gradients,
loss composition, configuration errors and Trainer logging."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from huggingface_hub.errors import StrictDataclassError
from testing_utils import FAMILIES, model_inputs, tiny_config, tiny_model
from transformers import Trainer, TrainingArguments

import hf_tiednorm
from hf_tiednorm.modeling.families.outputs import TiedNormCausalLMOutput, TiedNormSeq2SeqLMOutput
from hf_tiednorm.modeling.loss.regularizers import LOSS_TERMS
from hf_tiednorm.modeling.loss.token import token_cross_entropy
from hf_tiednorm.training.trainers import LossTermsLoggingMixin, penalty_values


def _labels(model, inputs):
    return inputs["decoder_input_ids"] if model.config.is_encoder_decoder else inputs["input_ids"]


def _targets(model, labels):
    """The label positions the model's cross-entropy scores (causal models shift by one)."""
    return labels if model.config.is_encoder_decoder else F.pad(labels, (0, 1), value=-100)[:, 1:]


def _randomize_projection(model) -> torch.Tensor:
    with torch.no_grad():
        model.output_projection.weight.normal_(generator=torch.Generator().manual_seed(1))
    return model.output_projection.weight


@pytest.mark.parametrize("family", FAMILIES)
def test_projection_starts_as_identity_and_scores_through_p(family):
    model = tiny_model(family, projection_regularization=0.15, head_mode="baseline")
    assert torch.equal(model.output_projection.weight, torch.eye(32))
    inputs = model_inputs(model)
    with torch.no_grad():
        hidden = model.model(**inputs).last_hidden_state
        assert torch.allclose(model(**inputs).logits, model.lm_head(hidden), atol=1e-6)
        projection = _randomize_projection(model)
        expected = model.lm_head(hidden @ projection.T)  # W·(P·h)
        assert torch.allclose(model(**inputs).logits, expected, atol=1e-5)
        assert not torch.allclose(expected, model.lm_head(hidden), atol=1e-3)


@pytest.mark.parametrize("head_mode", hf_tiednorm.HEAD_MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_projection_penalty_value_and_loss_composition(family, head_mode):
    strength = 0.15
    model = tiny_model(family, projection_regularization=strength, head_mode=head_mode)
    projection = _randomize_projection(model)
    inputs = model_inputs(model)
    labels = _labels(model, inputs)
    out = model(**inputs, labels=labels)
    reference = strength * math.sqrt(sum(float(x) ** 2 for x in projection.detach().flatten()))
    assert out.projection_penalty.item() == pytest.approx(reference, rel=1e-5)
    cross_entropy = token_cross_entropy(out.logits, _targets(model, labels))
    assert out.cross_entropy.item() == pytest.approx(cross_entropy.item(), rel=1e-6)
    assert out.loss.item() == pytest.approx(cross_entropy.item() + reference, rel=1e-5)
    assert out.weight_norm_penalty is None


@pytest.mark.parametrize("family", FAMILIES)
def test_projection_penalty_gradient_reaches_only_p(family):
    strength = 0.15
    model = tiny_model(family, projection_regularization=strength).train()
    projection = _randomize_projection(model)
    inputs = model_inputs(model)
    model(**inputs, labels=_labels(model, inputs)).projection_penalty.backward()
    expected = strength * projection / torch.linalg.matrix_norm(projection)  # d(λ‖P‖_F)/dP
    assert torch.allclose(projection.grad, expected, atol=1e-6)
    others = [n for n, p in model.named_parameters() if p.grad is not None and p is not projection]
    assert others == []


def test_zero_strength_keeps_projection_without_penalty():
    model = tiny_model("causal", projection_regularization=0.0)
    inputs = model_inputs(model)
    out = model(**inputs, labels=inputs["input_ids"])
    assert model.output_projection is not None and out.projection_penalty is None
    assert out.loss.item() == out.cross_entropy.item()


def _reference_weight_norm_penalty(weights, rho, nu) -> float:
    return rho * sum((math.sqrt(sum(float(x) ** 2 for x in row)) - nu) ** 2 for w in weights for row in w.detach())


@pytest.mark.parametrize(
    "family,overrides",
    [
        *[(family, {}) for family in FAMILIES],
        ("seq2seq", {"tie_topology": "decoder"}),
        ("bart", {"tie_topology": "decoder"}),
        *[(family, {"adaptive_cutoffs": [20, 40], "head_mode": "cosine"}) for family in FAMILIES],
    ],
)
def test_weight_norm_penalty_value(family, overrides):
    rho, nu = 1e-3, 2.0
    model = tiny_model(family, weight_norm_regularization=rho, weight_norm_target=nu, **overrides)
    inputs = model_inputs(model)
    labels = _labels(model, inputs)
    out = model(**inputs, labels=labels)
    weights = model.output_embedding_weights()
    assert sum(w.shape[0] for w in weights) == model.config.vocab_size
    assert out.weight_norm_penalty.item() == pytest.approx(_reference_weight_norm_penalty(weights, rho, nu), rel=1e-5)
    assert out.loss.item() == pytest.approx(out.cross_entropy.item() + out.weight_norm_penalty.item(), rel=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_weight_norm_penalty_gradient_reaches_the_tied_embedding(family):
    rho, nu = 1e-3, 2.0
    model = tiny_model(family, weight_norm_regularization=rho, weight_norm_target=nu).train()
    inputs = model_inputs(model)
    model(**inputs, labels=_labels(model, inputs)).weight_norm_penalty.backward()
    weight = model.get_input_embeddings().weight
    assert weight is model.lm_head.weight  # the penalty acts on the shared matrix
    norms = weight.detach().norm(dim=-1, keepdim=True)
    nonzero = norms.squeeze(-1) > 0
    expected = 2 * rho * (norms - nu) * weight.detach() / norms.clamp_min(1e-12)
    assert torch.allclose(weight.grad[nonzero], expected[nonzero], atol=1e-7)
    assert torch.isfinite(weight.grad).all()  # the zero padding row included
    others = [n for n, p in model.named_parameters() if p.grad is not None and p is not weight]
    assert others == []


def test_penalties_are_shared_across_accumulated_micro_batches():
    model = tiny_model("causal", projection_regularization=0.15, weight_norm_regularization=1e-3)
    inputs = model_inputs(model)
    full = model(**inputs, labels=inputs["input_ids"])
    tokens = inputs["input_ids"][:, 1:].numel()  # targets of this micro-batch
    half = model(**inputs, labels=inputs["input_ids"], num_items_in_batch=2 * tokens)
    for name in ("cross_entropy", "projection_penalty", "weight_norm_penalty"):
        assert half[name].item() == pytest.approx(full[name].item() / 2, rel=1e-5)


@pytest.mark.parametrize(
    "overrides,message",
    [
        ({"projection_regularization": -0.1}, "projection_regularization"),
        ({"weight_norm_regularization": -1e-3}, "weight_norm_regularization"),
        ({"weight_norm_target": 0.0}, "weight_norm_target"),
        ({"weight_norm_init_sigma": -1.0}, "weight_norm_init_sigma"),
    ],
)
@pytest.mark.parametrize("family", FAMILIES)
def test_invalid_regularizer_fields_raise(family, overrides, message):
    with pytest.raises(StrictDataclassError, match=message.replace("(", r"\(")):
        tiny_config(family, **overrides)


@pytest.mark.parametrize("overrides", [{"weight_norm_regularization": 1e-3}, {"weight_norm_init_sigma": 1.0}])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_weight_norm_technique_the_mode_rules_out_is_refused_where_the_model_is_built(family, overrides):
    """The configuration checks names and ranges only (issue 56: no torch, no head math); the model refuses a row-norm
    technique under a mode that removes the row norms, naming the mode."""
    tiny_config(family, head_mode="l2", **overrides)  # a valid configuration
    with pytest.raises(ValueError, match="head_mode='l2' removes"):
        tiny_model(family, head_mode="l2", **overrides)


class _LoggingTrainer(LossTermsLoggingMixin, Trainer):
    pass


class _Blocks(torch.utils.data.Dataset):
    def __init__(self, vocab_size: int, n: int = 16, length: int = 12):
        self.ids = torch.randint(4, vocab_size, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


@pytest.mark.parametrize(
    "overrides,accumulation",
    [
        ({"projection_regularization": 0.15, "weight_norm_regularization": 1e-3}, 1),
        ({"projection_regularization": 0.15, "weight_norm_regularization": 1e-3}, 2),
        ({"adaptive_cutoffs": [20, 40], "weight_norm_regularization": 1e-3, "logit_scale_kind": "scalar"}, 1),
    ],
)
def test_trainer_logs_each_loss_term(tmp_path, overrides, accumulation):
    model = tiny_model("causal", **overrides).train()
    args = TrainingArguments(
        output_dir=str(tmp_path), per_device_train_batch_size=4, gradient_accumulation_steps=accumulation,
        max_steps=3, logging_steps=1, learning_rate=1e-3, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True,
    )
    trainer = _LoggingTrainer(model=model, args=args, train_dataset=_Blocks(model.config.vocab_size))
    trainer.train()
    history = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert len(history) == 3
    expected_terms = {"cross_entropy", "weight_norm_penalty"} | (
        {"projection_penalty"} if "projection_regularization" in overrides else set()
    )
    for entry in history:
        assert expected_terms <= entry.keys()
        assert entry["loss"] == pytest.approx(sum(entry[name] for name in expected_terms), rel=1e-4)
        assert entry["weight_norm_penalty"] > 0


@pytest.mark.parametrize("output_class", [TiedNormCausalLMOutput, TiedNormSeq2SeqLMOutput])
def test_loss_term_names_exist_once(output_class):
    """The output dataclasses carry the LOSS_TERMS fields last, so that tuple outputs still start with (loss, logits)
    as the parents' do, and inference drops them all."""
    names = [field.name for field in dataclasses.fields(output_class)]
    assert names[:2] == ["loss", "logits"] and names[-len(LOSS_TERMS):] == list(LOSS_TERMS)
    assert len(names) == len(set(names)) == len(dataclasses.fields(output_class.__mro__[2])) + len(LOSS_TERMS)
    for family in FAMILIES:
        assert set(LOSS_TERMS) <= set(tiny_config(family).keys_to_ignore_at_inference)


@pytest.mark.parametrize("family", FAMILIES)
def test_penalty_terms_alone_match_the_loss(family):
    """The model's penalty_terms() are the penalties compose_loss adds (no accumulation), and the evaluation helper
    reads them without a cross-entropy; a model without penalties gives none."""
    model = tiny_model(family, projection_regularization=0.15, weight_norm_regularization=1e-3)
    _randomize_projection(model)
    cross_entropy = torch.tensor(1.5)
    loss, terms = model.compose_loss(cross_entropy, torch.zeros(2, 3, dtype=torch.long))
    alone = model.penalty_terms()
    assert set(alone) == {"projection_penalty", "weight_norm_penalty"}
    for name, value in alone.items():
        torch.testing.assert_close(value, terms[name])
    torch.testing.assert_close(loss, cross_entropy + sum(alone.values()))
    assert penalty_values(model) == pytest.approx({name: value.detach().item() for name, value in alone.items()})
    assert penalty_values(tiny_model(family)) == {}


def test_logging_state_exists_from_construction(tmp_path):
    model = tiny_model("causal", weight_norm_regularization=1e-3)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True)
    trainer = _LoggingTrainer(model=model, args=args)
    assert trainer._loss_term_sums == {} and trainer._loss_terms_last_step == 0
    trainer.log({"loss": 1.0})  # a log before any step adds no terms
    assert "cross_entropy" not in trainer.state.log_history[-1]


@pytest.mark.parametrize("chunk_size", [None, 4])
@pytest.mark.parametrize("family", FAMILIES)
def test_the_loss_counts_the_target_tokens_once_per_step(family, chunk_size, monkeypatch):
    """One count of the target tokens per forward (issue 23): the cross-entropy divides by it and, under gradient
    accumulation, the penalties take this micro-batch's share of it; the plain and the chunked path alike."""
    import hf_tiednorm.modeling.loss.model_loss

    model = tiny_model(family, projection_regularization=0.15, loss_chunk_size=chunk_size).train()
    inputs = model_inputs(model)
    labels = _labels(model, inputs)
    counts = []

    def counting(*args, **kwargs):
        counts.append(hf_tiednorm.modeling.loss.token.token_count(*args, **kwargs))
        return counts[-1]

    monkeypatch.setattr(hf_tiednorm.modeling.loss.model_loss, "token_count", counting)
    targets = (_targets(model, labels) != -100).sum()
    out = model(**inputs, labels=labels, num_items_in_batch=2 * targets)
    assert [int(count) for count in counts] == [2 * targets]
    torch.testing.assert_close(out.projection_penalty, 0.5 * hf_tiednorm.modeling.loss.regularizers.projection_penalty(
        model.output_projection.weight, 0.15))
    assert torch.allclose(out.loss, out.cross_entropy + out.projection_penalty)
