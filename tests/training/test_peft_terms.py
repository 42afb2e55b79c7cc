"""The head's learned terms (logit scale g, logit bias b) train beside a PEFT adapter, saved with it and restored by
``PeftModel.from_pretrained`` (hf_tiednorm/training/peft_terms.py, issue 60).

Before: under ``get_peft_model`` g and b are frozen; unfrozen by hand they trained, and ``save_pretrained`` dropped
them with no warning (a fresh base + the adapter scored 3.5 off on the tiny causal model here, 0.55 on SmolLM2).
Cases: the own causal family and wrapped Qwen3 and T5 (an encoder-decoder), LoRA, IA3 and LoHa (methods that
inject layers) and prompt tuning (one that does not).
"""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from testing_utils import run_without_package
from tiny_architectures import auto_class, inputs_for, source_model

import hf_tiednorm
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.head.layer import TiedNormHead

peft = pytest.importorskip("peft")
from hf_tiednorm.training.peft_terms import HeadTermsTraining, train_head_terms  # noqa: E402

TINY = dict(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2)  # fmt: skip
HEAD = dict(logit_scale_kind="vector", logit_bias=True)
ATTENTION = {"own": ["q_proj", "v_proj"], "qwen3": ["q_proj", "v_proj"], "t5": ["q", "v"]}
METHODS = {
    "lora": lambda targets: peft.LoraConfig(target_modules=targets, init_lora_weights=False),
    "ia3": lambda targets: peft.IA3Config(target_modules=targets, feedforward_modules=[]),
    "loha": lambda targets: peft.LoHaConfig(target_modules=targets, init_weights=False),
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Each base model (cosine, vector g, logit bias) saved once."""
    saved = {}
    for kind in ATTENTION:
        folder = tmp_path_factory.mktemp(kind)
        if kind == "own":
            torch.manual_seed(0)
            config = hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine", **HEAD)
            model = hf_tiednorm.TiedNormForCausalLM(config)
        else:
            model = normalize_tied_head(source_model(kind), "cosine", generic=True, **HEAD)
        model.save_pretrained(folder)
        saved[kind] = folder
    return saved


def load(folders, kind: str):
    if kind == "own":
        return hf_tiednorm.TiedNormForCausalLM.from_pretrained(folders[kind]).eval()
    return auto_class(source_model(kind).config).from_pretrained(folders[kind]).eval()


def logits(model, inputs) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).logits


def inputs_of(model) -> dict:
    if model.config.is_encoder_decoder:
        return inputs_for(model)
    return {"input_ids": torch.randint(3, 61, (2, 7), generator=torch.Generator().manual_seed(0))}


def train_steps(model, inputs, steps: int = 2) -> None:
    """A few SGD steps on every trainable parameter, as a training run would (the terms move)."""
    model.train()
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    labels = inputs.get("decoder_input_ids", inputs["input_ids"])  # an encoder-decoder: the decoder ids
    for _ in range(steps):
        model(**inputs, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()


def saved_keys(folder) -> list[str]:
    with safe_open(folder / "adapter_model.safetensors", "pt") as weights:
        return sorted(weights.keys())


# Every method on the own family, LoRA on the wrapper (a decoder and an encoder-decoder).
CASES = [("own", method) for method in METHODS] + [(kind, "lora") for kind in ATTENTION if kind != "own"]


@pytest.mark.parametrize(("kind", "method"), CASES)
def test_trained_terms_are_saved_with_the_adapter_and_restored_exactly(kind, method, folders, tmp_path):
    base = load(folders, kind)
    inputs = inputs_of(base)
    model = peft.get_peft_model(base, METHODS[method](ATTENTION[kind]))
    head = model.get_output_embeddings()
    assert not head.logit_scale.requires_grad and not head.logit_bias.requires_grad  # what PEFT does by default
    trained = train_head_terms(model)
    assert [name.rsplit(".", 1)[-1] for name in trained] == ["logit_scale", "logit_bias"]
    start = head.logit_scale.detach().clone()
    train_steps(model, inputs)
    assert not torch.equal(head.logit_scale, start)  # g trained
    assert isinstance(head, TiedNormHead) and head.weight is model.get_input_embeddings().weight  # still tied
    expected = logits(model, inputs)
    model.save_pretrained(tmp_path / "adapter")

    keys = saved_keys(tmp_path / "adapter")
    assert set(trained) <= set(keys)  # under the base model's own names
    assert not any(key.endswith(".weight") and "lm_head" in key for key in keys)  # never the V x d matrix
    reloaded = peft.PeftModel.from_pretrained(load(folders, kind), tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded, inputs), expected, rtol=0, atol=0)


def test_prompt_tuning_saves_and_restores_the_terms_too(folders, tmp_path):
    base = load(folders, "own")
    inputs = inputs_of(base)
    model = peft.get_peft_model(base, peft.PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=3))
    train_head_terms(model)
    train_steps(model, inputs)
    expected = logits(model, inputs)
    model.save_pretrained(tmp_path / "adapter")
    reloaded = peft.PeftModel.from_pretrained(load(folders, "own"), tmp_path / "adapter")
    torch.testing.assert_close(logits(reloaded, inputs), expected, rtol=0, atol=0)


def test_the_base_model_keeps_its_terms_merge_keeps_the_trained_ones(folders, tmp_path):
    base = load(folders, "own")
    inputs = inputs_of(base)
    before = logits(base, inputs)
    model = peft.get_peft_model(base, METHODS["lora"](ATTENTION["own"]))
    model.add_adapter("other", peft.LoraConfig(target_modules=ATTENTION["own"]))  # zero-initialized: the base
    train_head_terms(model)
    train_steps(model, inputs)
    trained = logits(model, inputs)
    with model.disable_adapter():  # e.g. TRL's reference with ref_model=None under PEFT
        torch.testing.assert_close(logits(model, inputs), before, rtol=0, atol=0)
    model.set_adapter("other")  # another adapter scores with the terms the base model had
    torch.testing.assert_close(logits(model, inputs), before, rtol=0, atol=0)
    assert not model.get_output_embeddings().logit_scale.requires_grad
    model.set_adapter("default")
    assert model.get_output_embeddings().logit_scale.requires_grad
    torch.testing.assert_close(logits(model, inputs), trained, rtol=0, atol=0)

    merged = model.merge_and_unload()
    head = merged.get_output_embeddings()
    assert type(head) is TiedNormHead and not list(head.buffers())  # a plain head again, trained terms kept
    torch.testing.assert_close(logits(merged, inputs), trained, rtol=0, atol=2e-6)
    merged.save_pretrained(tmp_path / "merged")
    torch.testing.assert_close(logits(load({"own": tmp_path / "merged"}, "own"), inputs), logits(merged, inputs),
                               rtol=0, atol=0)


def test_deleting_the_adapter_gives_the_base_terms_back(folders):
    base = load(folders, "own")
    inputs = inputs_of(base)
    before = logits(base, inputs)
    model = peft.get_peft_model(base, METHODS["lora"](ATTENTION["own"]))
    model.add_adapter("other", peft.LoraConfig(target_modules=ATTENTION["own"]))
    train_head_terms(model)
    train_steps(model, inputs)
    model.set_adapter("other")
    model.delete_adapter("default")
    assert type(model.get_output_embeddings()) is TiedNormHead
    torch.testing.assert_close(logits(model, inputs), before, rtol=0, atol=0)


def test_only_the_terms_asked_for_train(folders, tmp_path):
    model = peft.get_peft_model(load(folders, "own"), METHODS["lora"](ATTENTION["own"]))
    assert train_head_terms(model, terms=["logit_bias"]) == ["base_model.model.lm_head.logit_bias"]
    head = model.get_output_embeddings()
    assert head.logit_bias.requires_grad and not head.logit_scale.requires_grad
    model.save_pretrained(tmp_path / "adapter")
    keys = saved_keys(tmp_path / "adapter")
    assert "base_model.model.lm_head.logit_bias" in keys and "base_model.model.lm_head.logit_scale" not in keys


def test_a_trainer_checkpoint_holds_the_terms_and_resumes_them(folders, tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = peft.get_peft_model(load(folders, "own"), METHODS["lora"](ATTENTION["own"]))
    train_head_terms(model)
    ids = torch.randint(3, 61, (8, 7), generator=torch.Generator().manual_seed(1))
    data = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = dict(output_dir=str(tmp_path / "run"), per_device_train_batch_size=4, learning_rate=0.1, use_cpu=True,
                save_strategy="steps", save_steps=2, report_to="none", logging_steps=1)  # fmt: skip
    Trainer(model=model, args=TrainingArguments(max_steps=2, **args), train_dataset=data).train()
    g = model.get_output_embeddings().logit_scale.detach().clone()
    assert "base_model.model.lm_head.logit_scale" in saved_keys(tmp_path / "run" / "checkpoint-2")

    resumed = peft.get_peft_model(load(folders, "own"), METHODS["lora"](ATTENTION["own"]))
    train_head_terms(resumed)
    trainer = Trainer(model=resumed, args=TrainingArguments(max_steps=2, **args), train_dataset=data)
    trainer.train(resume_from_checkpoint=str(tmp_path / "run" / "checkpoint-2"))  # nothing left to train
    torch.testing.assert_close(resumed.get_output_embeddings().logit_scale, g, rtol=0, atol=0)


@pytest.mark.parametrize("when", ["before the first call", "after the first call"])
def test_terms_trained_by_hand_under_peft_are_refused_by_name(when, folders):
    """Before: they trained and were dropped at save_pretrained without a word."""
    model = peft.get_peft_model(load(folders, "own"), METHODS["lora"](ATTENTION["own"]))
    inputs = inputs_of(model)
    if when == "after the first call":
        logits(model, inputs)
    model.get_output_embeddings().logit_scale.requires_grad_(True)
    with pytest.raises(ValueError, match=r"lm_head\.logit_scale requires grad .* train_head_terms\(model\)"):
        model(**inputs)
    model.get_output_embeddings().logit_scale.requires_grad_(False)
    logits(model, inputs)  # frozen again: served
    train_head_terms(model)
    model(**inputs, labels=inputs["input_ids"]).loss.backward()  # trained the supported way: served


def test_train_head_terms_refuses_what_it_cannot_do(folders):
    with pytest.raises(ValueError, match="get_peft_model"):
        train_head_terms(load(folders, "own"))
    torch.manual_seed(0)
    plain = hf_tiednorm.TiedNormForCausalLM(hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine"))
    with pytest.raises(ValueError, match="no learned term"):
        train_head_terms(peft.get_peft_model(plain, METHODS["lora"](ATTENTION["own"])))
    model = peft.get_peft_model(load(folders, "own"), METHODS["lora"](ATTENTION["own"]))
    with pytest.raises(ValueError, match=r"no learned term \['logit_temperature'\]"):
        train_head_terms(model, terms=["logit_temperature"])
    train_head_terms(model)
    assert isinstance(model.get_output_embeddings(), HeadTermsTraining)
    with pytest.raises(ValueError, match="already"):
        train_head_terms(model)


def test_the_adapter_loads_where_hf_tiednorm_is_not_installed(folders, tmp_path):
    model = peft.get_peft_model(load(folders, "qwen3"), METHODS["lora"](ATTENTION["qwen3"]))
    inputs = inputs_of(model)
    train_head_terms(model)
    train_steps(model, inputs)
    model.save_pretrained(tmp_path / "adapter")
    torch.save({"inputs": inputs, "logits": logits(model, inputs)}, tmp_path / "expected.pt")
    out = run_without_package(f"""
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM
expected = torch.load("expected.pt")
base = AutoModelForCausalLM.from_pretrained({str(folders["qwen3"])!r}, trust_remote_code=True).eval()
model = PeftModel.from_pretrained(base, "adapter")
with torch.no_grad():
    print((model(**expected["inputs"]).logits - expected["logits"]).abs().max().item())
""", tmp_path)
    assert float(out.strip().splitlines()[-1]) == 0.0


def test_dpo_scores_its_reference_with_the_base_terms(folders, tmp_path):
    """TRL's DPOTrainer given the PeftModel adds a frozen reference adapter: the head's trained terms belong to the
    policy's adapter only, so the reference is the starting model (margin 0 at step 1), and the terms train."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset
    from testing_utils import tiny_tokenizer

    model = peft.get_peft_model(load(folders, "own"), peft.LoraConfig(target_modules=ATTENTION["own"]))
    train_head_terms(model)
    head = model.get_output_embeddings()
    start = head.logit_scale.detach().clone()
    data = Dataset.from_dict({"prompt": ["a dog", "a woman"] * 4, "chosen": [" runs .", " reads ."] * 4,
                              "rejected": [" book .", " grass ."] * 4})  # fmt: skip
    config = trl.DPOConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=0.1,
                           report_to="none", save_strategy="no", use_cpu=True, logging_steps=1)  # fmt: skip
    trainer = trl.DPOTrainer(model=model, args=config, train_dataset=data, processing_class=tiny_tokenizer())
    assert "ref" in model.peft_config and head._adapters == {"default"}
    trainer.train()
    assert trainer.state.log_history[0]["rewards/margins"] == 0.0
    assert trainer.state.log_history[1]["rewards/margins"] != 0.0
    assert not torch.equal(head.logit_scale, start)
    model.set_adapter("ref")  # the reference: the starting terms
    assert torch.equal(head.logit_scale, start)
