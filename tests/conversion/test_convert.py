"""Converting tied Marian / BART / Llama checkpoints onto our own families: exact logits in baseline mode, exact weights
in every mode. The generic conversion of any architecture is tested in test_any_model.py."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch
from testing_utils import bind_mounted, model_inputs, run_without_package, tiny_tokenizer
from tiny_architectures import ENCODER_DECODER, SPECIAL, auto_class, inputs_for
from tiny_architectures import source_model as tiny_source_model
from transformers import (
    BartConfig,
    BartForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
    ViTConfig,
)

import hf_tiednorm
from hf_tiednorm.convert import convert_checkpoint, main, normalize_tied_head

CAUSAL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, **SPECIAL)


def save_source(folder: Path, model_class, config) -> tuple[Path, torch.nn.Module]:
    torch.manual_seed(0)
    model = model_class(config).eval()
    model.save_pretrained(folder)
    return folder, model


@pytest.fixture(scope="module")
def marian(tmp_path_factory):
    return save_source(tmp_path_factory.mktemp("marian"), MarianMTModel, MarianConfig(**ENCODER_DECODER))


@pytest.fixture(scope="module")
def bart(tmp_path_factory):
    # scale_embedding=True (BART's default is False) so that the in-module sqrt(d) scaling must be reproduced too.
    config = BartConfig(scale_embedding=True, **ENCODER_DECODER)
    return save_source(tmp_path_factory.mktemp("bart"), BartForConditionalGeneration, config)


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return save_source(
        tmp_path_factory.mktemp("llama"), LlamaForCausalLM, LlamaConfig(tie_word_embeddings=True, **CAUSAL)
    )


def folder_digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


TARGETS = {
    "marian": hf_tiednorm.TiedNormForConditionalGeneration,
    "bart": hf_tiednorm.TiedNormBartForConditionalGeneration,
    "llama": hf_tiednorm.TiedNormForCausalLM,
}


@pytest.mark.parametrize("source_name", list(TARGETS))
def test_baseline_conversion_reproduces_the_source_logits(source_name, request, tmp_path):
    source, source_model = request.getfixturevalue(source_name)
    before = folder_digest(source)
    main([str(source), str(tmp_path / "converted")])  # the CLI, baseline mode by default
    assert folder_digest(source) == before

    model = TARGETS[source_name].from_pretrained(tmp_path / "converted").eval()
    assert type(model) is TARGETS[source_name] and model.config.head_mode == "baseline"
    assert model.lm_head.weight is model.get_input_embeddings().weight  # still tied
    if model.config.is_encoder_decoder:  # both sources share one vocabulary: three-way tying
        assert model.config.tie_topology == "three_way"
        assert model.model.encoder.embed_tokens.weight is model.model.decoder.embed_tokens.weight
    inputs = model_inputs(model)
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, source_model(**inputs).logits, rtol=0, atol=0)
        prompt = inputs["input_ids"]
        generated = model.generate(prompt, max_new_tokens=5, do_sample=False)
        assert torch.equal(generated, source_model.generate(prompt, max_new_tokens=5, do_sample=False))


def test_a_marian_whose_position_table_differs_is_refused_by_name(marian):
    """Our Marian computes its sinusoidal position tables (buffers, issue 55), transformers' holds them as frozen
    parameters: a source whose table is not the computed one is refused, not silently replaced."""
    import copy

    changed = copy.deepcopy(marian[1])
    with torch.no_grad():
        changed.model.encoder.embed_positions.weight[3] += 0.5
    with pytest.raises(ValueError, match=r"model\.encoder\.embed_positions\.weight is not the table "
                                         r"TiedNormForConditionalGeneration computes"):
        normalize_tied_head(changed, "baseline")


@pytest.mark.parametrize("head_mode", ["cosine", "distance"])
def test_other_modes_keep_every_weight(marian, bart, llama, head_mode):
    for source, source_model in (marian, bart, llama):
        model = convert_checkpoint(source, head_mode=head_mode, logit_scale_kind="scalar")
        assert model.config.head_mode == head_mode and model.lm_head.head_mode == head_mode
        converted = dict(model.named_buffers()) | model.state_dict()  # Marian's position tables: computed buffers
        for name, weight in source_model.state_dict().items():
            if name != "final_logits_bias":
                torch.testing.assert_close(converted[name], weight, rtol=0, atol=0, msg=name)
        assert model.lm_head.logit_scale is not None  # the one new parameter


def test_marian_decoder_tying_maps_to_decoder_topology(tmp_path):
    source, source_model = save_source(
        tmp_path / "marian_two_vocabs",
        MarianMTModel,
        MarianConfig(share_encoder_decoder_embeddings=False, **ENCODER_DECODER | {"decoder_vocab_size": 50}),
    )
    model = convert_checkpoint(source)
    assert model.config.tie_topology == "decoder" and model.config.decoder_vocab_size == 50
    # The generic wrapper ties the head to the decoder embedding too, and keeps the source's logits.
    wrapped = convert_checkpoint(source, generic=True)
    head = wrapped.get_output_embeddings()
    assert head.weight is wrapped.get_decoder().embed_tokens.weight and head.weight.shape[0] == 50
    inputs = {"input_ids": torch.randint(4, 61, (2, 6)), "decoder_input_ids": torch.randint(4, 50, (2, 4))}
    with torch.no_grad():
        torch.testing.assert_close(wrapped(**inputs).logits, source_model(**inputs).logits, rtol=0, atol=0)


def test_unsupported_sources_are_refused_clearly(marian, tmp_path):
    ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4).save_pretrained(tmp_path / "vit")
    with pytest.raises(ValueError, match="AutoModelForCausalLM has no model for model_type 'vit'. Supported: any"):
        convert_checkpoint(tmp_path / "vit")
    untied, _ = save_source(tmp_path / "untied", LlamaForCausalLM, LlamaConfig(tie_word_embeddings=False, **CAUSAL))
    with pytest.raises(ValueError, match="untied output embeddings"):
        convert_checkpoint(untied)
    BartConfig(tie_word_embeddings=False, **ENCODER_DECODER).save_pretrained(tmp_path / "untied_bart")
    with pytest.raises(ValueError, match="the bart checkpoint has untied output embeddings"):
        convert_checkpoint(tmp_path / "untied_bart")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        convert_checkpoint(tmp_path)
    with pytest.raises(ValueError, match="head_mode must be one of"):
        convert_checkpoint(marian[0], head_mode="unit")


def test_nonzero_final_logits_bias_and_bad_output_dirs_are_refused(marian, bart, tmp_path):
    source, model = marian
    with pytest.raises(ValueError, match="outside the source checkpoint"):
        convert_checkpoint(source, source / "converted")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        convert_checkpoint(source, tmp_path / "busy")
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"

    for source_class, source_model in ((MarianMTModel, model), (BartForConditionalGeneration, bart[1])):
        biased = source_class(source_model.config)
        biased.load_state_dict(source_model.state_dict())
        biased.final_logits_bias.fill_(0.5)
        biased.save_pretrained(tmp_path / source_class.__name__)
        with pytest.raises(ValueError, match="non-zero final_logits_bias"):
            convert_checkpoint(tmp_path / source_class.__name__, tmp_path / "out")
        assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("damage", ["not json", "wrong structure"])
def test_a_failed_conversion_leaves_no_output_folder(llama, tmp_path, damage):
    """Issue 48 (10): a source with a corrupt tokenizer.json crashed with a bare JSONDecodeError and left 28 files in
    the output folder (a rerun then refused it as not empty); every conversion now stages beside the output folder."""
    source = tmp_path / "source"
    shutil.copytree(llama[0], source)
    tiny_tokenizer().save_pretrained(source)
    text = '{"version": "1.0", "model": 3' if damage == "not json" else '{"version": "1.0", "model": {"type": "X"}}'
    (source / "tokenizer.json").write_text(text)
    error = r"tokenizer\.json is not valid JSON" if damage == "not json" else r"the tokenizer of .* does not load"
    for output_dir in (tmp_path / "new", tmp_path / "empty"):
        if output_dir.name == "empty":
            output_dir.mkdir()
        with pytest.raises(ValueError, match=error):
            convert_checkpoint(source, output_dir, head_mode="cosine")
        assert not output_dir.exists() or not any(output_dir.iterdir())
    assert sorted(path.name for path in tmp_path.iterdir()) == ["empty", "source"]  # no staging folder left


@pytest.mark.parametrize("simulate", [False, True], ids=["mount", "simulated"])
def test_an_output_dir_inside_a_bind_mount_of_the_source_is_refused(llama, tmp_path, monkeypatch, simulate):
    """Issue 48, the class of case 8: the converter compared spellings, so an output folder inside a bind mount of
    the source was written into the source folder."""
    source = tmp_path / "source"
    shutil.copytree(llama[0], source)
    before = folder_digest(source)
    with bind_mounted(source, tmp_path / "mnt", monkeypatch, simulate=simulate):
        with pytest.raises(ValueError, match="must lie outside the source checkpoint"):
            convert_checkpoint(source, tmp_path / "mnt" / "converted", head_mode="cosine")
    assert folder_digest(source) == before


# Formerly test_convert_auto_map.py ---------------------------------------------------------------------------------
# ``tiednorm-convert`` of a source whose config carries its own ``auto_map`` under a built-in ``model_type``: the
# converted config.json has the converted model's own top-level ``auto_map`` (nothing of the source's, also not in
# ``text_config``) and loads with ``trust_remote_code=True`` in a process where hf_tiednorm cannot be imported.


FOREIGN = {
    "AutoConfig": "someone/repo--configuration_x.XConfig",
    "AutoModelForCausalLM": "someone/repo--modeling_x.XForCausalLM",
    "AutoModelForSeq2SeqLM": "someone/repo--modeling_x.XForSeq2SeqLM",
}
# source architecture -> whether it is converted with --generic (the wrapper) or to our own family
SOURCES = {"gpt2": True, "t5": True, "llama": False}


def test_converted_folders_keep_their_own_auto_map_and_load_without_the_package(tmp_path):
    expected = {}
    for name, generic in SOURCES.items():
        source = tiny_source_model(name)
        source.save_pretrained(tmp_path / f"{name}-source")
        config_file = tmp_path / f"{name}-source" / "config.json"
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"auto_map": FOREIGN}))
        main(
            [str(tmp_path / f"{name}-source"), str(tmp_path / name), "--head-mode", "cosine"]
            + (["--generic"] if generic else [])
        )
        saved = json.loads((tmp_path / name / "config.json").read_text())
        auto_map = saved["auto_map"]
        assert auto_class(source.config).__name__ in auto_map and "AutoConfig" in auto_map, auto_map
        assert all(
            "--" not in value and value.split(".")[0].startswith(("modeling_tiednorm", "configuration_tiednorm"))
            for value in auto_map.values()
        ), auto_map
        assert "auto_map" not in (saved.get("text_config") or {})
        model = auto_class(source.config).from_pretrained(tmp_path / name).eval()
        inputs = inputs_for(model)
        with torch.no_grad():
            expected[name] = {
                "logits": model(**inputs).logits.tolist(),
                "auto": auto_class(source.config).__name__,
                "inputs": {k: v.tolist() for k, v in inputs.items()},
            }
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    out = run_without_package(
        f"""
import json, torch, transformers
expected = json.load(open({str(tmp_path / "expected.json")!r}))
for name, case in expected.items():
    model = getattr(transformers, case["auto"]).from_pretrained({str(tmp_path)!r} + "/" + name, trust_remote_code=True)
    assert type(model).__name__.startswith("TiedNorm") and type(model).__module__.startswith("transformers_modules.")
    inputs = {{k: torch.tensor(v) for k, v in case["inputs"].items()}}
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, torch.tensor(case["logits"]), rtol=0, atol=0)
    print(name, "ok")
""",
        cwd=tmp_path,
    )
    assert out.split() == [word for name in SOURCES for word in (name, "ok")]


# --- the plain baseline (tiednorm-convert --plain, issue 60) -------------------------------------------------------


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_the_plain_baseline_is_the_baseline_conversion_as_a_stock_fp32_model(name, tmp_path):
    """Before, a practitioner rebuilt a stock parent model by hand to compare against (``--head-mode baseline``
    gives a TiedNorm model; a GGUF-loaded one is refused by the Trainer): one command now gives it."""
    source = tiny_source_model(name).to(torch.bfloat16)
    source.save_pretrained(tmp_path / "source")
    tiny_tokenizer().save_pretrained(tmp_path / "source")
    main([str(tmp_path / "source"), str(tmp_path / "plain"), "--plain", "--license", "apache-2.0"])
    main([str(tmp_path / "source"), str(tmp_path / "baseline"), "--head-mode", "baseline"])

    saved = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert "auto_map" not in saved and "quantization_config" not in saved and saved["dtype"] == "float32"
    assert saved["provenance"]["license"] == "apache-2.0"  # every card of its fine-tunes names it
    assert not list((tmp_path / "plain").glob("*.py"))  # no remote code
    plain = auto_class(source.config).from_pretrained(tmp_path / "plain").eval()  # stock, no trust_remote_code
    assert type(plain) is type(source) and plain.dtype == torch.float32
    assert plain.get_output_embeddings().weight is plain.get_input_embeddings().weight
    baseline = auto_class(source.config).from_pretrained(tmp_path / "baseline", dtype=torch.float32).eval()
    inputs = inputs_for(plain)
    with torch.no_grad():
        torch.testing.assert_close(plain(**inputs).logits, baseline(**inputs).logits, rtol=0, atol=0)
    assert (tmp_path / "plain" / "tokenizer.json").is_file()


@pytest.mark.parametrize("flags", [["--head-mode", "cosine"], ["--lossless-start"], ["--generic"],
                                   ["--logit-bias"]])  # fmt: skip
def test_the_plain_baseline_takes_no_head_flags(flags, llama, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main([str(llama[0]), str(tmp_path / "plain"), "--plain", *flags])
    assert "--plain writes the source as it is" in capsys.readouterr().err
    assert not (tmp_path / "plain").exists()
