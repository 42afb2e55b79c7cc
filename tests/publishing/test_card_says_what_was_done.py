"""Cards say what was done to the weights, whatever saved the folder (issue 60): fine-tuned (by which trainer, on which
data, named in words where it has no Hub id) or converted; the plain export's card carries the training record of
the folder it came from; a chat model's usage snippet goes through its chat template.

Before: a model trained with TRL's SFTTrainer and saved as TRL's docs do (``save_strategy="no"``,
``trainer.save_model(out)``: no trainer_state.json) got "Based on ..." as if only converted; the export's card named no
training; the snippet fed raw text (``["A man"]``) to a chat model.
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from testing_utils import tiny_tokenizer
from tiny_architectures import source_model
from transformers import AutoModelForCausalLM

from hf_tiednorm.convert import convert_checkpoint
from hf_tiednorm.export import main as export_main
from hf_tiednorm.publishing.model_card import main as card_main

trl = pytest.importorskip("trl")
from hf_tiednorm.conversion.training_record import read_training_record, trainer_of  # noqa: E402

CHAT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"  # noqa: E501
WORDS = "200 support chats of a narrow task, 40 held out"


def body(folder: Path, section: str = "## Training") -> str:
    return (folder / "README.md").read_text().split(section)[1].split("\n## ")[0]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    """A converted tiny Llama with a chat template, as tiednorm-convert writes it."""
    root = tmp_path_factory.mktemp("card")
    source_model("llama").save_pretrained(root / "source")
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT
    tokenizer.save_pretrained(root / "source")
    convert_checkpoint(root / "source", root / "converted", head_mode="cosine", lossless_start=True, license="mit",
                       base_model="someone/tiny-base")  # fmt: skip
    return root / "converted"


@pytest.fixture(scope="module")
def sft(converted, tmp_path_factory) -> Path:
    """The converted model fine-tuned with TRL's SFTTrainer and saved as TRL's docs do: no checkpoint, no state."""
    from datasets import Dataset

    out = tmp_path_factory.mktemp("sft")
    model = AutoModelForCausalLM.from_pretrained(converted)
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = CHAT
    data = Dataset.from_dict({"messages": [[{"role": "user", "content": "a dog"},
                                            {"role": "assistant", "content": "runs ."}]] * 8})  # fmt: skip
    config = trl.SFTConfig(output_dir=str(out), max_steps=2, per_device_train_batch_size=4, report_to="none",
                           save_strategy="no", use_cpu=True, max_length=16)  # fmt: skip
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(str(out))
    assert not (out / "trainer_state.json").exists() and (out / "training_args.bin").is_file()
    return out


def test_a_trl_sft_save_model_folder_is_carded_as_fine_tuned_with_its_data(sft):
    card_main([str(sft), "--dataset", WORDS])
    training = body(sft)
    assert "Fine-tuned from `someone/tiny-base` with TRL's SFTTrainer." in training
    assert f"Trained on {WORDS} (no Hub id)." in training and "Based on" not in training
    data = ModelCard.load(sft / "README.md").data
    assert data.datasets is None  # words are no Hub id: the body names them, the front matter's datasets do not
    assert data.to_dict()["training_record"] == {"trainer": "TRL's SFTTrainer", "data": WORDS}

    card_main([str(sft)])  # a re-render keeps the data the card recorded
    assert f"Trained on {WORDS} (no Hub id)." in body(sft)
    card_main([str(sft), "--dataset", "someone/support-chats"])  # a Hub id goes into the front matter too
    assert ModelCard.load(sft / "README.md").data.datasets == ["someone/support-chats"]
    assert "Trained on `someone/support-chats`." in body(sft)
    card_main([str(sft), "--dataset", WORDS])


def test_the_exports_card_carries_the_training_record(sft, tmp_path):
    card_main([str(sft), "--dataset", WORDS])
    export_main([str(sft), str(tmp_path / "plain")])
    text = (tmp_path / "plain" / "README.md").read_text()
    assert f"Fine-tuned from `someone/tiny-base` with TRL's SFTTrainer. Trained on {WORDS} (no Hub id)." in text
    assert ModelCard.load(tmp_path / "plain" / "README.md").data.to_dict()["training_record"]["data"] == WORDS


def test_a_conversion_is_carded_as_converted_not_fine_tuned(converted):
    card_main([str(converted)])
    training = body(converted)
    assert "Based on `someone/tiny-base`. Converted to hf_tiednorm's normalized head, not fine-tuned since." in training
    assert "Trained on" not in training and "Fine-tuned" not in training


def test_a_chat_models_usage_snippet_uses_its_chat_template_and_runs(sft):
    card_main([str(sft), "--dataset", WORDS])
    snippet = re.search(r"```python\n(.*?)```", body(sft, "## How to use"), re.S).group(1)
    assert "apply_chat_template(messages, add_generation_prompt=True" in snippet and '["A man"]' not in snippet
    assert "trust_remote_code=True` in their config" in body(sft, "## How to use")  # TRL's reference model
    printed = []
    code = snippet.replace(f'"{sft.name}"', repr(str(sft))).replace("max_new_tokens=32", "max_new_tokens=3")
    exec(compile(code, "README.md", "exec"), {"print": printed.append})  # the card's own snippet, as a user runs it
    assert len(printed) == 1 and isinstance(printed[0], str)


@pytest.mark.parametrize(("config", "trainer"), [
    (lambda out: trl.DPOConfig(output_dir=out, use_cpu=True), "TRL's DPOTrainer"),
    (lambda out: trl.GRPOConfig(output_dir=out, use_cpu=True), "TRL's GRPOTrainer"),
    (lambda out: __import__("transformers").TrainingArguments(output_dir=out), "transformers' Trainer"),
    (lambda out: __import__("transformers").Seq2SeqTrainingArguments(output_dir=out), "transformers' Seq2SeqTrainer"),
])  # fmt: skip
def test_the_trainer_is_read_from_training_args_without_running_it(config, trainer, tmp_path):
    torch.save(config(str(tmp_path)), tmp_path / "training_args.bin")
    assert trainer_of(tmp_path / "training_args.bin") == trainer
    record = read_training_record(tmp_path)
    assert record.trainer == trainer and record.data is None


class _Planted:
    def __reduce__(self):
        return (Path.touch, (Path(__file__).parent / "never-made",))


def test_reading_the_trainer_runs_nothing_in_the_file(tmp_path):
    (tmp_path / "training_args.bin").write_bytes(pickle.dumps(_Planted(), protocol=2))
    trainer_of(tmp_path / "training_args.bin")
    assert not (Path(__file__).parent / "never-made").exists()
    (tmp_path / "training_args.bin").write_bytes(b"not a pickle")
    assert trainer_of(tmp_path / "training_args.bin") is None
