"""A plain ``transformers.Trainer`` with ``label_smoothing_factor`` scores the logits itself and never sees the
model's regularizer penalties: a model with a penalty configured is refused at its first training step, naming the
flag, the penalty and the config's own ``label_smoothing`` field (which keeps them); without a penalty it trains."""

from __future__ import annotations

import pytest
import torch
from testing_utils import FAMILIES, TINY_VOCAB, tiny_model
from transformers import Trainer, TrainingArguments

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
