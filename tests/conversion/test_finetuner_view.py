"""What a fine-tuner of a pretrained LLM sees (issue 43): cards that state only what is known, learned head terms
that stay fp32 and train under bf16 weights, one conversion route, wrapped configs that refuse own-family fields by
name, and run_clm's ``--validation_file None``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from huggingface_hub import ModelCard
from peft import LoraConfig, PeftModel, get_peft_model
from script_helpers import load_script
from testing_utils import run_without_package, tiny_model, tiny_tokenizer
from tiny_architectures import CONFIGS, auto_class, inputs_for, source_model
from transformers import AutoConfig, AutoModelForCausalLM, HfArgumentParser

from hf_tiednorm import convert
from hf_tiednorm.conversion import export
from hf_tiednorm.conversion.source_provenance import gguf_provenance
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.modeling.families.configuration_wrapped import OWN_FAMILY_FIELDS
from hf_tiednorm.modeling.families.head_host import fp32_term_names
from hf_tiednorm.publishing import hub, model_card
from hf_tiednorm.publishing.card_metrics import parse_metrics
from hf_tiednorm.publishing.provenance import UNKNOWN_LICENSE


def test_validation_file_none_means_no_evaluation():
    script = load_script("run_clm")
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses(
        ["--validation_file", "None", "--test_file", "none"]
    )
    assert data.validation_file is None and data.test_file is None
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses([])
    assert data.validation_file.endswith("val.en.gz")


# --- item 2: the head's learned terms stay fp32 under a bf16 load, on both routes, and train -------------------------



HEAD_TERMS = {"head_mode": "cosine", "lossless_start": True, "logit_bias": True}


def _head_terms(model) -> dict[str, torch.Tensor]:
    head = model.get_output_embeddings()
    return {"logit_scale": head.logit_scale, "logit_bias": head.logit_bias}


@pytest.fixture(scope="module", params=["llama", "gpt2"])  # an own family and a wrapped architecture
def saved_source(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(f"{request.param}-source")
    source_model(request.param).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def converted(saved_source, tmp_path_factory):
    folder = tmp_path_factory.mktemp("converted") / "c"
    convert_checkpoint(saved_source, folder, **HEAD_TERMS)
    return folder


@pytest.mark.parametrize("route", ["cli", "in_memory", "in_memory_generic"])
def test_head_terms_stay_fp32_under_a_bf16_load_and_train(saved_source, converted, route, tmp_path):
    if route == "cli":
        model = AutoModelForCausalLM.from_pretrained(converted, dtype=torch.bfloat16)
    else:
        source = AutoModelForCausalLM.from_pretrained(saved_source, dtype=torch.bfloat16)
        model = normalize_tied_head(source, generic=route == "in_memory_generic", **HEAD_TERMS)
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert {name: t.dtype for name, t in _head_terms(model).items()} == dict.fromkeys(_head_terms(model), torch.float32)
    # One optimizer step at a small learning rate moves them (in bf16 it rounds away: 8 mantissa bits).
    before = {name: t.detach().clone() for name, t in _head_terms(model).items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    inputs = inputs_for(model)
    model.train()
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    optimizer.step()
    for name, tensor in _head_terms(model).items():
        assert not torch.equal(tensor.detach(), before[name]), f"{name} did not move in one step ({route})"
    # Saved and reloaded in bf16, they are fp32 again.
    model.save_pretrained(tmp_path / "saved")
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "saved", dtype=torch.bfloat16)
    for name, tensor in _head_terms(reloaded).items():
        assert tensor.dtype == torch.float32, name
        assert torch.equal(tensor, _head_terms(model)[name].detach()), name


@pytest.mark.slow  # a fresh process without hf_tiednorm imports torch and transformers again (~6 s)
def test_head_terms_stay_fp32_in_remote_code(converted, tmp_path):
    out = run_without_package(
        f"""
import torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained({str(converted)!r}, dtype=torch.bfloat16, trust_remote_code=True)
head = model.get_output_embeddings()
print(type(model).__module__.startswith("transformers_modules"), head.weight.dtype, head.logit_scale.dtype,
      head.logit_bias.dtype)
""",
        cwd=tmp_path,
    )
    assert out.split()[-4:] == ["True", "torch.bfloat16", "torch.float32", "torch.float32"]


# --- item 4: one default conversion route --------------------------------------------------------------------------




@pytest.mark.parametrize("name", ["llama", "gpt2", "marian"])
def test_both_routes_give_one_model_by_default(name, tmp_path):
    folder = tmp_path / "source"
    source = source_model(name)
    if hasattr(source, "final_logits_bias"):  # zero, as in released models (the own family has no such bias)
        source.final_logits_bias.zero_()
    source.save_pretrained(folder)
    auto = auto_class(CONFIGS[name])
    from_cli = convert_checkpoint(folder, head_mode="cosine")
    in_memory = normalize_tied_head(auto.from_pretrained(folder), "cosine")
    assert type(in_memory) is type(from_cli)
    assert list(in_memory.state_dict()) == list(from_cli.state_dict())
    assert in_memory.name_or_path == from_cli.name_or_path == str(folder)  # not blanked: PEFT records it
    if name != "gpt2":  # a family of our own is the default on both routes, the wrapper only with generic=True
        assert "Wrapped" not in type(in_memory).__name__
        assert "Wrapped" in type(normalize_tied_head(auto.from_pretrained(folder), "cosine", generic=True)).__name__


def test_a_lora_adapter_trained_on_one_route_loads_onto_the_other(tmp_path):
    folder = tmp_path / "source"
    source_model("llama").save_pretrained(folder)
    convert_checkpoint(folder, tmp_path / "converted", head_mode="cosine", lossless_start=True)
    # Trained on the in-memory route ...
    torch.manual_seed(0)
    model = normalize_tied_head(AutoModelForCausalLM.from_pretrained(folder), "cosine", lossless_start=True)
    peft_model = get_peft_model(model, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0))
    optimizer = torch.optim.AdamW([p for p in peft_model.parameters() if p.requires_grad], lr=1e-2)
    inputs = inputs_for(model)
    for _ in range(3):
        peft_model(**inputs, labels=inputs["input_ids"]).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    peft_model.eval()
    with torch.no_grad():
        trained = peft_model(**inputs).logits
    peft_model.save_pretrained(tmp_path / "adapter")
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"] == str(
        folder
    )
    # ... loads onto the CLI's conversion, every key in place, with the same logits.
    base = AutoModelForCausalLM.from_pretrained(tmp_path / "converted").eval()
    with torch.no_grad():
        untuned = base(**inputs).logits
    loaded = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        assert torch.allclose(loaded(**inputs).logits, trained, atol=1e-5)
    assert not torch.allclose(untuned, trained, atol=1e-3)  # the adapter did change the model


# --- item 1: cards claim no license nobody stated; a conversion records its source for every later card ----------




def _llama_source(folder, readme: str | None = None):
    source_model("llama").save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    if readme is not None:
        (folder / "README.md").write_text(readme)
    return folder


def test_a_source_of_unknown_license_gets_no_license_claim(tmp_path):
    convert.main([str(_llama_source(tmp_path / "tiny-llama")), str(tmp_path / "c"), "--head-mode", "cosine",
                  "--lossless-start"])
    staged = hub.push_to_hub(tmp_path / "c", "u/c", dry_run_dir=tmp_path / "s")
    card = ModelCard.load(staged / "README.md")
    assert card.data.license == "unknown" and card.data.base_model is None
    assert "License: unknown" in card.text and "apache" not in card.text.lower()


def test_a_conversion_records_its_source_for_every_later_card(tmp_path):
    cache = tmp_path / "hub" / "models--google--tiny-gemmaish" / "snapshots" / "abc"
    cache.mkdir(parents=True)
    _llama_source(cache, "---\nlicense: gemma\n---\n# tiny\n")
    convert.main([str(cache), str(tmp_path / "c"), "--head-mode", "cosine", "--lossless-start"])
    recorded = AutoModelForCausalLM.from_pretrained(tmp_path / "c").config.provenance
    assert (recorded["base_model"], recorded["license"]) == ("google/tiny-gemmaish", "gemma")
    # a fine-tune (the Trainer saves the loaded config) of the local conversion, then its card
    tuned = tmp_path / "tuned"
    AutoModelForCausalLM.from_pretrained(tmp_path / "c").save_pretrained(tuned)
    tiny_tokenizer().save_pretrained(tuned)
    card = model_card.render_model_card(tuned, base_model=str(tmp_path / "c"))
    assert (card.data.license, card.data.base_model) == ("gemma", "google/tiny-gemmaish")
    # re-rendered with --metrics (no base model given), pushed, exported plain: the same license and base model
    (tmp_path / "m.json").write_text('{"eval_perplexity": 12.5}')
    model_card.main([str(tuned), "--metrics", str(tmp_path / "m.json"), "--dataset", "d/x"])
    cards = {"re-rendered": ModelCard.load(tuned / "README.md")}
    cards["pushed"] = ModelCard.load(hub.push_to_hub(tuned, "u/t", dry_run_dir=tmp_path / "s1") / "README.md")
    cards["plain"] = ModelCard.load(
        hub.push_to_hub(tuned, "u/t", dry_run_dir=tmp_path / "s2", plain=True) / "README.md"
    )
    for what, card in cards.items():
        assert (card.data.license, card.data.base_model) == ("gemma", "google/tiny-gemmaish"), what
    assert "Based on `google/tiny-gemmaish`" in cards["re-rendered"].text
    # the kept card, with the license stated at push time: front matter and body
    stated = ModelCard.load(hub.push_to_hub(tuned, "u/t", dry_run_dir=tmp_path / "s3", license="mit") / "README.md")
    assert stated.data.license == "mit" and "License: `mit`." in stated.text and "`gemma`" not in stated.text
    export.export_plain(tuned, tmp_path / "exported")
    assert ModelCard.load(tmp_path / "exported" / "README.md").data.license == "gemma"


def test_license_and_base_model_flags_state_them(tmp_path):
    source = _llama_source(tmp_path / "src")
    args = [str(source), str(tmp_path / "c"), "--head-mode", "cosine"]
    with pytest.raises(ValueError, match="--base-model '/abs/llama' is not a Hub model id"):
        convert.main([*args, "--base-model", "/abs/llama"])
    convert.main([*args, "--license", "llama3.2", "--base-model", "meta-llama/Llama-3.2-1B"])
    staged = hub.push_to_hub(tmp_path / "c", "u/c", dry_run_dir=tmp_path / "s")
    card = ModelCard.load(staged / "README.md")
    assert (card.data.license, card.data.base_model) == ("llama3.2", "meta-llama/Llama-3.2-1B")
    hub.main([str(tmp_path / "c"), "u/c", "--dry-run", str(tmp_path / "s2"), "--license", "other"])
    assert ModelCard.load(tmp_path / "s2" / "README.md").data.license == "other"
    # in memory: the same fields
    model = normalize_tied_head(AutoModelForCausalLM.from_pretrained(source), "cosine", license="mit")
    assert model.config.provenance == {"base_model": None, "license": "mit", "name": None}


def test_a_gguf_files_license_and_name_are_read(tmp_path):
    gguf = pytest.importorskip("gguf")
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_name("Smollm2 135M")
    writer.add_license("apache-2.0")
    writer.add_string("general.base_model.0.repo_url", "https://huggingface.co/HuggingFaceTB/SmolLM2-135M")
    writer.add_tensor("t", torch.zeros(4).numpy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    # the file's base_model.0 is its parent, not the model it holds (issue 58: it was recorded as the base model)
    assert gguf_provenance(tmp_path / "m.gguf") == {
        "base_model": None, "license": "apache-2.0", "name": "Smollm2 135M", "gguf_file": "m.gguf",
        "parent_models": ["HuggingFaceTB/SmolLM2-135M"],
    }


# --- item 3: a wrapped config refuses every own-family field by name, however it arrives ---------------------------




@pytest.fixture(scope="module")
def wrapped_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("wrapped")
    normalize_tied_head(source_model("gpt2"), "cosine").save_pretrained(folder)
    return folder


@pytest.mark.parametrize("name", ["label_smoothing", "loss_chunk_size"])
def test_a_wrapped_config_refuses_own_family_fields_by_name(wrapped_folder, name, tmp_path):
    value = {"label_smoothing": 0.1, "loss_chunk_size": 16}[name]
    config = AutoConfig.from_pretrained(wrapped_folder)
    with pytest.raises(ValueError, match=rf"\['{name}'\] are fields of hf_tiednorm's own model families \(set as"):
        setattr(config, name, value)
    with pytest.raises(ValueError, match=rf"\['{name}'\] are fields .* \(from_pretrained keyword arguments\)"):
        AutoModelForCausalLM.from_pretrained(wrapped_folder, **{name: value})
    saved = json.loads((wrapped_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**saved, name: value}))
    with pytest.raises(ValueError, match=rf"\['{name}'\] are fields .* \(given to TiedNormWrappedConfig or read"):
        AutoConfig.from_pretrained(tmp_path)


def test_every_own_family_field_is_refused_as_an_attribute(wrapped_folder):
    config = AutoConfig.from_pretrained(wrapped_folder)
    for name in OWN_FAMILY_FIELDS:
        with pytest.raises(ValueError, match=name):
            setattr(config, name, None)
    config.use_cache = False  # the wrapped architecture's own fields are still set where its model reads them
    assert config.text_config.use_cache is False


# --- item 6: cards state only what happened ------------------------------------------------------------------------




def test_only_metrics_are_listed_as_metrics():
    results, _ = parse_metrics({
        "train_loss": 3.2, "train_loss_first_step": 1, "train_loss_last_step": 20, "train_runtime": 12.0,
        "train_samples_per_second": 3.0, "train_steps_per_second": 1.0, "total_flos": 1e9, "epoch": 1.0,
        "eval_loss": 3.0, "eval_perplexity": 20.1, "eval_runtime": 1.0, "eval_samples": 33, "train_blocks": 80,
    })  # fmt: skip
    assert results == [(None, "train_loss (mean of steps 1–20)", 3.2), ("validation", "loss", 3.0),
                       ("validation", "perplexity", 20.1)]


def test_a_subset_score_says_so(tmp_path):
    tiny_model("causal").save_pretrained(tmp_path)
    card = model_card.render_model_card(tmp_path, metrics={"eval_perplexity": 20.1, "test_perplexity": 21.0},
                                        dataset="d/x", eval_subsets={"validation": (200, 1014), "test": (5, 5)})
    assert [r.dataset_split for r in card.data.eval_results] == ["validation[:200]", "test"]  # all 5 of 5: whole
    assert "Scored on a subset only: the first 200 of 1,014 rows of the validation split" in card.text
    assert "perplexity (validation[:200])" in card.text and "perplexity (test) | 21" in card.text


def test_the_plain_card_keeps_pipeline_tag_datasets_and_metrics(tmp_path):
    tiny_model("causal").save_pretrained(tmp_path / "run")
    tiny_tokenizer().save_pretrained(tmp_path / "run")
    model_card.write_model_card(tmp_path / "run", metrics={"test_perplexity": 21.0}, dataset="d/x", languages=["en"],
                                license="mit")
    for staged in (export.export_plain(tmp_path / "run", tmp_path / "plain") and tmp_path / "plain",
                   hub.push_to_hub(tmp_path / "run", "u/p", dry_run_dir=tmp_path / "s", plain=True)):
        data = ModelCard.load(staged / "README.md").data
        assert (data.pipeline_tag, data.datasets, data.language, data.license) == ("text-generation", ["d/x"],
                                                                                   ["en"], "mit")
        assert [(r.dataset_split, r.metric_type, r.metric_value) for r in data.eval_results] == [
            ("test", "perplexity", 21.0)]


# --- the docs say all of this ----------------------------------------------------------------------------------------



DOCS = Path(__file__).resolve().parents[2] / "docs"


def _flat(page: str) -> str:
    return " ".join((DOCS / page).read_text().split())


def test_the_docs_say_what_the_code_does():
    converting, training, publishing = _flat("converting.md"), _flat("training.md"), _flat("publishing.md")
    # item 7: a lossless start's resized tokens take g = ‖w_new‖ (tests/modeling/head/test_lossless_resize.py), not
    # g = 1
    assert "start by the same map from their initial rows: g_i = ‖w_new‖ (cosine)" in converting
    assert "get g = `logit_scale_init` (1 by default) and b = 0" not in converting
    # item 2: the fp32 head terms, by the mechanism the code uses
    assert fp32_term_names() == ["logit_scale", "logit_bias"]  # the registry's terms that stay fp32
    model = tiny_model("causal", logit_scale_kind="vector", logit_bias=True)
    assert {"logit_scale", "logit_bias"} <= set(model._keep_in_fp32_modules_strict)  # what from_pretrained reads
    assert "`_keep_in_fp32_modules_strict`" in training and "keeps them fp32" in converting
    # item 4: one default; items 1, 6, 8
    assert "give the same model for every source both accept, by default" in converting
    assert "The defaults differ" not in converting
    assert f"`license: {UNKNOWN_LICENSE}`" in publishing
    assert "apache-2.0` for a model trained from scratch" not in publishing
    assert "`--license` / `--base-model`" in converting and "`--license` / `--base-model`" in publishing
    assert "named `validation[:200]`" in publishing and "`validation[:200]`" in training
    assert "`--validation_file None`" in training
