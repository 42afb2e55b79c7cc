"""The plain export (hf_tiednorm/conversion/export.py, issue 32): every family, the wrapper, every head mode, logit
scale, logit bias, tie topology and the lossless start become a checkpoint of the parent architecture that stock
transformers loads in a process where hf_tiednorm cannot be imported, with the source's logits (fp32, 1e-4) and its
greedy and beam generations; the models that no parent can hold are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from packaging import version
from testing_utils import FAMILIES, REPO_ROOT, model_inputs, run_without_package, tiny_model, tiny_tokenizer
from tiny_architectures import inputs_for, source_model
from transformers import LlamaConfig, LlamaForCausalLM

from hf_tiednorm import HEAD_MODES, LOGIT_SCALES
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head

TOLERANCE = 1e-4


@torch.no_grad()
def trained_looking(model):
    """Give the learned logit scale / bias values far from their initialization (1 and 0), so that a bake that
    dropped them would show."""
    head = model.get_output_embeddings()
    generator = torch.Generator().manual_seed(1)
    if head.logit_scale is not None:
        head.logit_scale.copy_(torch.rand(head.logit_scale.shape, generator=generator) * 1.5 + 0.5)
    if head.logit_bias is not None:
        head.logit_bias.copy_(torch.randn(head.logit_bias.shape, generator=generator))
    return model


def own(family, **fields):
    return lambda: trained_looking(tiny_model(family, **fields))


def wrapped(architecture, head_mode, **fields):
    # A lossless start keeps the g / b it was given (an untrained start: a distance model's bias sums to zero).
    finish = (lambda model: model) if fields.get("lossless_start") else trained_looking
    return lambda: finish(normalize_tied_head(source_model(architecture), head_mode, generic=True, **fields).eval())


CASES = {}
for family in FAMILIES:
    for head_mode in HEAD_MODES:
        for logit_scale in LOGIT_SCALES:
            if family == "causal" and head_mode == "distance":
                continue  # a bias Llama cannot hold: refused (test below), except from a lossless start (tmp_path)
            bias = family != "causal"
            CASES[f"{family}-{head_mode}-{logit_scale}"] = own(
                family, head_mode=head_mode, logit_scale_kind=logit_scale, logit_bias=bias
            )
    CASES[f"{family}-projection"] = own(
        family, head_mode="cosine", logit_scale_kind="scalar", projection_regularization=0.1
    )
for family in ("seq2seq", "bart"):
    for topology in ("decoder", "untied"):
        for head_mode in ("cosine", "l2"):
            CASES[f"{family}-{topology}-{head_mode}"] = own(
                family, head_mode=head_mode, tie_topology=topology, logit_scale_kind="vector", logit_bias=True
            )
# transformers 5.17 (the lowest declared, a lent GPU machine's) sized beam search by config.vocab_size, not by the
# logits, so beam search of a model with a separate decoder vocabulary fails there (fixed in 5.18; setup.cfg).
if version.parse(transformers.__version__) >= version.parse("5.18"):
    CASES["seq2seq-decoder-two-vocabularies"] = own("seq2seq", head_mode="square", tie_topology="decoder",
                                                    decoder_vocab_size=50)  # fmt: skip
CASES["causal-untied"] = own("causal", head_mode="cosine", tie_word_embeddings=False)
CASES["causal-zero-logit-bias"] = lambda: tiny_model("causal", head_mode="cosine", logit_bias=True)  # b = 0: exports
for architecture, head_mode, fields in (
    ("gpt2", "l2", {}), ("llama", "cosine", {"logit_scale_kind": "vector"}),
    ("qwen3", "square", {"logit_scale_kind": "scalar"}), ("gemma2", "cosine", {"logit_scale_kind": "fixed"}),
    ("t5", "l2", {}), ("t5", "cosine", {"logit_scale_kind": "vector"}),
    ("marian", "distance", {"logit_bias": True}), ("bart", "cosine", {"logit_bias": True}), ("mbart", "l2", {}),
    ("llama", "cosine", {"lossless_start": True}), ("llama", "distance", {"lossless_start": True}),
):  # fmt: skip
    name = f"wrapped-{architecture}-{head_mode}-{'-'.join(fields) or 'plain'}"
    CASES[name] = wrapped(architecture, head_mode, **fields)


def inputs_of(model) -> dict[str, torch.Tensor]:
    """Random ids for a forward pass of an own-family model or a wrapped tiny architecture."""
    return inputs_for(model) if model.config.model_type == "tiednorm_wrapped" else model_inputs(model)


GENERATION = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False, "pad_token_id": 0}
BEAMS = (1, 3)


@torch.no_grad()
def reference(model, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the export must reproduce: the source's logits on ``inputs`` and its greedy and beam generations."""
    out = {"logits": model(**inputs).logits.float()}
    for beams in BEAMS:
        out[f"generate_{beams}"] = model.generate(input_ids=inputs["input_ids"], num_beams=beams, **GENERATION)
    return out


# Run once, where hf_tiednorm cannot be imported: every export folder is loaded by stock transformers and gives its
# logits and generations on the inputs saved beside it (the same computation as ``reference``).
ISOLATED = f"""
import json, torch
from pathlib import Path
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM
torch.set_num_threads(1)
GENERATION = {GENERATION!r}
for folder in sorted(path.parent for path in Path.cwd().glob("*/inputs.json")):
    config = AutoConfig.from_pretrained(folder, trust_remote_code=False)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(folder, trust_remote_code=False).eval()
    inputs = {{k: torch.tensor(v) for k, v in json.loads((folder / "inputs.json").read_text()).items()}}
    with torch.no_grad():
        out = {{"logits": model(**inputs).logits.float()}}
        for beams in {BEAMS!r}:
            out[f"generate_{{beams}}"] = model.generate(input_ids=inputs["input_ids"], num_beams=beams, **GENERATION)
    torch.save(out, folder / "isolated.pt")
print("done")
"""


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """case -> export folder (holding ``reference.pt``, the source's outputs, and ``isolated.pt``, the export's
    outputs reloaded where hf_tiednorm cannot be imported), or the exception the export raised.

    Every case is built and exported in this process; one subprocess then loads all the exports. One torch thread
    in both: the models are tiny, and two threads per op on a busy machine made the generations ~4× slower."""
    root = tmp_path_factory.mktemp("exports")
    folders = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        build_and_export(root, folders)
    finally:
        torch.set_num_threads(threads)
    assert run_without_package(ISOLATED, cwd=root, timeout=600).strip().endswith("done")
    return folders


def build_and_export(root: Path, folders: dict) -> None:
    """Build every case, export it into ``root``/case and save its inputs and reference outputs beside it."""
    for name, build in CASES.items():
        source = build()
        try:
            export_plain(source, root / name, check=False)
        except Exception as error:  # reported by this case's test, not by every case's
            folders[name] = error
            continue
        folders[name] = root / name
        inputs = inputs_of(source)
        (root / name / "inputs.json").write_text(json.dumps({k: v.tolist() for k, v in inputs.items()}))
        torch.save(reference(source, inputs), root / name / "reference.pt")


@pytest.mark.parametrize("case", sorted(CASES))
def test_export_reloads_without_hf_tiednorm_with_the_same_logits_and_generations(case, exported):
    folder = exported[case]
    if isinstance(folder, Exception):
        raise folder
    assert not list(folder.glob("*.py")), "the export must carry no code"
    config = json.loads((folder / "config.json").read_text())
    assert "auto_map" not in config and not config["model_type"].startswith("tiednorm"), config["model_type"]
    expected, isolated = torch.load(folder / "reference.pt"), torch.load(folder / "isolated.pt")
    assert (isolated["logits"] - expected["logits"]).abs().max().item() <= TOLERANCE
    for beams in BEAMS:
        torch.testing.assert_close(isolated[f"generate_{beams}"], expected[f"generate_{beams}"])


def test_l2_bakes_the_unit_lookups_and_keeps_the_tie_where_the_rows_equal_them():
    source = tiny_model("causal", head_mode="l2")
    result = export_plain(source)
    embedding = result.model.get_input_embeddings().weight
    assert result.tied and result.model.lm_head.weight is embedding and result.added_values == 0
    torch.testing.assert_close(embedding.norm(dim=-1)[1:], torch.ones(embedding.shape[0] - 1))  # padding row: 0
    vector = export_plain(trained_looking(tiny_model("causal", head_mode="l2", logit_scale_kind="vector")))
    assert not vector.tied and vector.added_values == embedding.numel() - embedding.shape[0]  # + V×d − the g vector


def test_cli_writes_the_export_with_tokenizer_generation_config_and_card(tmp_path):
    source = trained_looking(tiny_model("seq2seq", head_mode="cosine", logit_scale_kind="vector", logit_bias=True))
    source.save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    command = [sys.executable, "-m", "hf_tiednorm.export", str(tmp_path / "model"), str(tmp_path / "out")]
    out = subprocess.run(command, capture_output=True, text=True, cwd=REPO_ROOT, check=True).stdout
    assert "MarianMTModel" in out and "untied" in out and "stored values" in out and "final_logits_bias" in out
    names = {path.name for path in (tmp_path / "out").iterdir()}
    assert {"config.json", "generation_config.json", "tokenizer.json", "README.md", "model.safetensors"} <= names
    card = (tmp_path / "out" / "README.md").read_text()
    assert "exported plain" in card and "MarianMTModel" in card and "trust_remote_code" not in card
    assert "size increase" in card and "stored values" in card


def lossless_llama(tmp_path: Path, head_mode: str):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=True)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    return convert_checkpoint(tmp_path / "llama", tmp_path / f"{head_mode}", head_mode=head_mode, lossless_start=True)


def test_a_lossless_distance_start_has_a_zero_bias_and_exports_to_llama(tmp_path):
    source = lossless_llama(tmp_path, "distance")
    assert source.config.model_type == "tiednorm_causal" and source.config.logit_bias
    result = export_plain(tmp_path / "distance", tmp_path / "out")
    assert result.parent == "LlamaForCausalLM" and result.bias_slot is None and result.max_abs_diff <= TOLERANCE


@pytest.mark.parametrize("head_mode", ["cosine", "square", "distance", "baseline"])
def test_round_trip_back_to_the_normalized_head_gives_the_same_logits(head_mode, tmp_path):
    source = lossless_llama(tmp_path, head_mode)
    export_plain(source, tmp_path / "plain")
    back = convert_checkpoint(tmp_path / "plain", tmp_path / "back", head_mode=head_mode, lossless_start=True)
    assert back.config.head_mode == head_mode
    inputs = model_inputs(source)
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs).logits, source(**inputs).logits, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("head_mode", ["cosine", "square"])
def test_an_untied_export_of_a_trained_logit_scale_converts_back_with_equal_logits(head_mode, tmp_path):
    source = lossless_llama(tmp_path, head_mode)
    with torch.no_grad():  # trained: g_i no longer the lossless ‖w_i‖ / ‖w_i‖², so the export is untied
        source.lm_head.logit_scale.mul_(torch.rand(61, generator=torch.Generator().manual_seed(2)) + 0.5)
    result = export_plain(source, tmp_path / "plain")
    assert not result.tied and not json.loads((tmp_path / "plain" / "config.json").read_text())["tie_word_embeddings"]
    back = convert_checkpoint(tmp_path / "plain", tmp_path / "back", head_mode=head_mode, lossless_start=True)
    assert back.config.head_mode == head_mode and back.lm_head.weight is back.get_input_embeddings().weight
    inputs = model_inputs(source)
    with torch.no_grad():
        torch.testing.assert_close(back(**inputs).logits, source(**inputs).logits, rtol=0, atol=TOLERANCE)


def test_an_untied_source_converts_only_with_parallel_rows_and_a_logit_scale_start(tmp_path):
    source = lossless_llama(tmp_path, "cosine")
    with torch.no_grad():
        source.lm_head.logit_scale.mul_(torch.rand(61, generator=torch.Generator().manual_seed(2)) + 0.5)
    export_plain(source, tmp_path / "plain")
    for head_mode, start in (("distance", True), ("cosine", False)):  # no logit scale to take c_i: refused as before
        with pytest.raises(ValueError, match="untied output embeddings"):
            convert_checkpoint(tmp_path / "plain", head_mode=head_mode, lossless_start=start)
    plain = LlamaForCausalLM.from_pretrained(tmp_path / "plain")
    with torch.no_grad():
        plain.lm_head.weight[7] += 0.01 * torch.randn(plain.lm_head.weight.shape[1])  # row 7 leaves its line
    plain.save_pretrained(tmp_path / "bent")
    with pytest.raises(ValueError, match="output row 7 is not a positive multiple of its input row 7"):
        convert_checkpoint(tmp_path / "bent", head_mode="cosine", lossless_start=True)


REFUSALS = {
    "llama-distance": (own("causal", head_mode="distance"), ["LlamaForCausalLM", "head_mode 'distance'", "Marian"]),
    "llama-logit-bias": (
        own("causal", head_mode="cosine", logit_bias=True), ["logit_bias=True", "final_logits_bias"]
    ),
    "gpt2-distance": (wrapped("gpt2", "distance"), ["GPT2LMHeadModel", "head_mode 'distance'"]),
    "adaptive": (lambda: tiny_model("seq2seq", adaptive_cutoffs=[20, 40]), ["adaptive_cutoffs", "no parent"]),
    "bart-two-vocabularies": (
        lambda: tiny_model("bart", tie_topology="decoder", decoder_vocab_size=50),
        ["decoder_vocab_size", "BartForConditionalGeneration"],
    ),
    "plain-model": (lambda: source_model("marian"), ["not an hf_tiednorm model"]),
}


@pytest.mark.parametrize("name", sorted(REFUSALS))
def test_models_no_parent_can_hold_are_refused_by_name(name):
    build, phrases = REFUSALS[name]
    with pytest.raises(ValueError) as error:
        export_plain(build())
    assert all(phrase in str(error.value) for phrase in phrases), str(error.value)


def test_a_non_empty_output_folder_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    with pytest.raises(FileExistsError, match="not empty"):
        export_plain(tiny_model("causal"), tmp_path / "out")


def test_push_plain_stages_the_export_with_its_card_naming_the_repo(tmp_path):
    from hf_tiednorm.publishing.hub import push_to_hub

    tiny_model("causal", head_mode="cosine").save_pretrained(tmp_path / "model")
    tiny_tokenizer().save_pretrained(tmp_path / "model")
    folder = push_to_hub(tmp_path / "model", "tester/plain-cosine", dry_run_dir=tmp_path / "up", plain=True)
    assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    assert not list(folder.glob("*.py")) and (folder / "tokenizer.json").is_file()
    card = (folder / "README.md").read_text()
    assert 'from_pretrained("tester/plain-cosine")' in card and "trust_remote_code" not in card
    with pytest.raises(ValueError, match="dataset"):
        push_to_hub(tmp_path / "model", "tester/x", dry_run_dir=tmp_path / "up2", plain=True, dataset="d")
