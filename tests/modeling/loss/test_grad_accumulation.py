"""The transformers gradient-accumulation contract, with a real ``transformers.Trainer``: one optimizer step over the
same 8 examples gives the same update and the same logged loss whether they come as batch×accumulation 8×1, 4×2
or 2×4, for every family of the package and for the wrapper around every architecture of tiny_architectures.py.

Plain SGD (no momentum, no clipping) makes the update proportional to the gradient, so a gradient multiplied by the
accumulation steps (Adam's first step would hide it) shows as a different step. The examples have targets of
different lengths (-100 padded), so a mean of per-micro-batch means would differ from the token mean too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from testing_utils import FAMILIES, TINY_VOCAB, tiny_model
from tiny_architectures import ARCHITECTURES, CONFIGS, auto_class
from transformers import Trainer, TrainingArguments

from hf_tiednorm.convert import normalize_tied_head

# Every config field of the tiny architectures that sets a dropout probability.
DROPOUT_FIELDS = (
    "dropout",
    "attention_dropout",
    "activation_dropout",
    "dropout_rate",
    "resid_pdrop",
    "embd_pdrop",
    "attn_pdrop",
    "hidden_dropout",
    "summary_first_dropout",
)
SHAPES = ((8, 1), (4, 2), (2, 4))


def wrapped_model(name: str):
    """The wrapper (cosine head, learned scalar g) around a tiny ``name`` model without dropout."""
    config = copy.deepcopy(CONFIGS[name])
    for field in DROPOUT_FIELDS:
        if isinstance(getattr(config, field, None), float):
            setattr(config, field, 0.0)
    torch.manual_seed(0)
    source = auto_class(config).from_config(config)
    return normalize_tied_head(source, "cosine", logit_scale_kind="scalar", generic=True)


def examples(encoder_decoder: bool) -> list[dict[str, torch.Tensor]]:
    """8 examples of fixed shapes whose targets count 2..9 tokens (the rest -100)."""
    generator = torch.Generator().manual_seed(0)
    rows = []
    for i in range(8):
        input_ids = torch.randint(4, TINY_VOCAB, (10,), generator=generator)
        labels = torch.randint(4, TINY_VOCAB, (10,), generator=generator) if encoder_decoder else input_ids.clone()
        labels[2 + i :] = -100
        rows.append({"input_ids": input_ids, "attention_mask": torch.ones(10, dtype=torch.long), "labels": labels})
    return rows


def one_step(model, batch_size: int, accumulation: int, output_dir) -> tuple[dict[str, torch.Tensor], float]:
    """The parameters after one SGD step of ``Trainer`` over the 8 examples, and the logged training loss."""
    model = copy.deepcopy(model)
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=batch_size,
        gradient_accumulation_steps=accumulation,
        max_steps=1,
        learning_rate=1.0,
        optim="sgd",
        lr_scheduler_type="constant",
        max_grad_norm=0.0,
        weight_decay=0.0,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=examples(model.config.is_encoder_decoder))
    loss = trainer.train().training_loss
    return {name: p.detach().clone() for name, p in model.named_parameters()}, loss


def check_contract(model, tmp_path) -> None:
    """One step at 8×1, 4×2 and 2×4: the same parameters (the update moved them) and the same logged loss, which
    is the model's own loss on the whole batch."""
    batch = {
        key: torch.stack([row[key] for row in examples(model.config.is_encoder_decoder)])
        for key in ("input_ids", "attention_mask", "labels")
    }
    model.train()
    with torch.no_grad():
        full_loss = model(**batch).loss.item()
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    results = {shape: one_step(model, *shape, tmp_path / f"{shape[0]}x{shape[1]}") for shape in SHAPES}
    reference, reference_loss = results[(8, 1)]
    assert any(not torch.equal(reference[name], before[name]) for name in before), "the step changed nothing"
    assert reference_loss == pytest.approx(full_loss, rel=1e-5)
    for shape, (params, loss) in results.items():
        assert loss == pytest.approx(reference_loss, rel=1e-5), f"logged loss at {shape[0]}x{shape[1]}"
        for name, value in params.items():
            torch.testing.assert_close(
                value, reference[name], rtol=1e-4, atol=1e-6, msg=lambda m, n=name, s=shape: f"{n} at {s}: {m}"
            )


@pytest.mark.parametrize("family", FAMILIES)
def test_own_families_keep_the_accumulation_contract(family, tmp_path):
    check_contract(tiny_model(family, logit_scale_kind="scalar"), tmp_path)


# Every encoder-decoder (their transformers losses ignore num_items_in_batch) and one decoder by default; the other
# decoders (their losses honour it) under -m slow: ~20 s each on a shared CPU.
DEFAULT = [name for name in ARCHITECTURES if CONFIGS[name].is_encoder_decoder or name == "gpt2"]


# Each is a short Trainer run (3-5 s): a decoder-only and an encoder-decoder by default, the rest with -m slow.
@pytest.mark.parametrize("name", [n if n in ("gpt2", "t5") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in DEFAULT])
def test_wrapped_architectures_keep_the_accumulation_contract(name, tmp_path):
    check_contract(wrapped_model(name), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("name", [name for name in ARCHITECTURES if name not in DEFAULT])
def test_every_other_wrapped_architecture_keeps_the_accumulation_contract(name, tmp_path):
    check_contract(wrapped_model(name), tmp_path)
