"""``TrainingArguments(label_smoothing_factor=...)`` with a plain ``transformers.Trainer``: the Trainer scores the
logits itself and must align them with the labels as the model's own loss does (shifted for a causal LM), for every
family of the package, the wrapper, and a causal LM loaded as remote code without the package."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from testing_utils import FAMILIES, TINY_VOCAB, run_without_package, tiny_model
from tiny_architectures import source_model
from transformers import Trainer, TrainingArguments

from hf_tiednorm.convert import normalize_tied_head

EPSILON = 0.1


def smoothed_reference(model, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The label-smoothed cross-entropy of ``model`` on ``inputs``, written out: a causal LM's position t scores
    labels[t+1]; an encoder-decoder's decoder position t scores labels[t]."""
    labels = inputs["labels"]
    with torch.no_grad():
        logits = model(**{k: v for k, v in inputs.items() if k != "labels"}).logits.float()
    if not model.config.is_encoder_decoder:
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), label_smoothing=EPSILON)


def trainer_loss(model, inputs: dict[str, torch.Tensor], output_dir) -> torch.Tensor:
    args = TrainingArguments(output_dir=str(output_dir), label_smoothing_factor=EPSILON, report_to=[], use_cpu=True)
    trainer = Trainer(model=model, args=args)
    with torch.no_grad():
        return trainer.compute_loss(model, dict(inputs))


def batch_for(model) -> dict[str, torch.Tensor]:
    """Random ids with some -100 label positions; decoder inputs built from the labels, as the collator does."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(4, TINY_VOCAB, (2, 9), generator=generator)
    if not model.config.is_encoder_decoder:
        labels = ids.clone()
        labels[1, 6:] = -100
        return {"input_ids": ids, "labels": labels}
    labels = torch.randint(4, TINY_VOCAB, (2, 7), generator=generator)
    labels[1, 5:] = -100
    return {
        "input_ids": ids,
        "labels": labels,
        "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels),
    }


@pytest.mark.parametrize("family", FAMILIES)
def test_trainer_label_smoothing_scores_the_families_as_their_loss_aligns(family, tmp_path):
    model = tiny_model(family)
    inputs = batch_for(model)
    expected = smoothed_reference(model, inputs)
    torch.testing.assert_close(trainer_loss(model, inputs, tmp_path), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["gpt2", "llama", "t5", "marian"])
def test_trainer_label_smoothing_scores_the_wrapper_as_its_loss_aligns(name, tmp_path):
    model = normalize_tied_head(source_model(name), "cosine", generic=True).eval()
    inputs = batch_for(model)
    expected = smoothed_reference(model, inputs)
    torch.testing.assert_close(trainer_loss(model, inputs, tmp_path), expected, rtol=1e-5, atol=1e-6)


def test_trainer_label_smoothing_shifts_for_remote_code_causal_lms(tmp_path):
    # Loaded with trust_remote_code where hf_tiednorm cannot be imported: the copied modeling code registers too.
    tiny_model("causal").save_pretrained(tmp_path / "own")
    normalize_tied_head(source_model("gpt2"), "cosine").save_pretrained(tmp_path / "wrapped")
    out = run_without_package(
        f"""
import torch, torch.nn.functional as F
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
args = TrainingArguments(output_dir={str(tmp_path / "out")!r}, label_smoothing_factor={EPSILON}, report_to=[],
                         use_cpu=True)
ids = torch.randint(4, {TINY_VOCAB}, (2, 9), generator=torch.Generator().manual_seed(0))
for name in ("own", "wrapped"):
    model = AutoModelForCausalLM.from_pretrained({str(tmp_path)!r} + "/" + name, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
    with torch.no_grad():
        loss = Trainer(model=model, args=args).compute_loss(model, {{"input_ids": ids, "labels": ids.clone()}})
        logits = model(input_ids=ids).logits[:, :-1]
    expected = F.cross_entropy(logits.reshape(-1, {TINY_VOCAB}), ids[:, 1:].reshape(-1), label_smoothing={EPSILON})
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=1e-6)
    print(name, "ok")
""",
        cwd=tmp_path,
    )
    assert out.split() == ["own", "ok", "wrapped", "ok"]


# Formerly test_trainer_smoothing_penalties.py ----------------------------------------------------------------------
# A plain ``transformers.Trainer`` with ``label_smoothing_factor`` scores the logits itself and never sees the model's
# regularizer penalties: a model with a penalty configured is refused at its first training step, naming the flag, the
# penalty and the config's own ``label_smoothing`` field (which keeps them); without a penalty it trains.


PENALTIES = {
    "weight_norm_regularization": {"weight_norm_regularization": 1e-3},
    "projection_regularization": {"projection_regularization": 0.15},
}


class Examples(torch.utils.data.Dataset):
    """Four random examples (ids, labels, decoder inputs for an encoder-decoder) for ``model``."""

    def __init__(self, model) -> None:
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(4, TINY_VOCAB, (4, 8), generator=generator)
        self.model = model

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i) -> dict[str, torch.Tensor]:
        if not self.model.config.is_encoder_decoder:
            return {"input_ids": self.ids[i], "labels": self.ids[i]}
        labels = self.ids[i].flip(0)  # decoder inputs built from the labels, as the seq2seq collator does
        decoder_ids = self.model.prepare_decoder_input_ids_from_labels(labels[None])[0]
        return {"input_ids": self.ids[i], "labels": labels, "decoder_input_ids": decoder_ids}


def train_one_step(model, tmp_path, **args):
    arguments = TrainingArguments(
        output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2, report_to=[], use_cpu=True,
        save_strategy="no", **args,
    )  # fmt: skip
    return Trainer(model=model, args=arguments, train_dataset=Examples(model)).train()


@pytest.mark.parametrize("penalty", list(PENALTIES))
@pytest.mark.parametrize("family", FAMILIES)
def test_label_smoothing_factor_with_a_penalty_is_refused_at_the_first_step(family, penalty, tmp_path):
    model = tiny_model(family, **PENALTIES[penalty]).train()
    with pytest.raises(ValueError, match=rf"label_smoothing_factor.*{penalty}=.*config.label_smoothing"):
        train_one_step(model, tmp_path, label_smoothing_factor=0.1)


@pytest.mark.parametrize("family", FAMILIES)
def test_without_a_penalty_or_with_the_configs_own_smoothing_it_trains(family, tmp_path):
    assert train_one_step(tiny_model(family).train(), tmp_path / "a", label_smoothing_factor=0.1).training_loss > 0
    model = tiny_model(family, label_smoothing=0.1, weight_norm_regularization=1e-3).train()
    assert train_one_step(model, tmp_path / "b").training_loss > 0
