"""A head mode, a head term and a family, each defined in this file alone with the package's public names, taken
end to end (issue 50): trained by ``run_clm.py`` (the family) and ``run_translation.py`` (a built-in
encoder-decoder family), both called in this process so that the registrations here reach the run; saved and
reloaded; loaded as remote code; converted from a plain tied GPT-2 and exported back to it.

Remote code, what this package decides: a saved model's code is the two generated files, which define the package's
families, modes and terms. A mode or term registered at runtime is not in them, so the folder's code refuses it by
name (load with the package, where it is registered). A family registered from outside the package travels as any
custom transformers model does: ``save_pretrained`` copies the module that defines its classes (here, this file)
and ``auto_map`` names it; that module imports hf_tiednorm, so it loads where the package is installed (with equal
logits) and is refused naming hf_tiednorm where it is not."""

from __future__ import annotations

import json

import pytest
import torch
from huggingface_hub.dataclasses import strict
from huggingface_hub.errors import StrictDataclassError
from script_helpers import load_script, tiny_translation_flags, write_tiny_parallel
from testing_utils import run_without_package
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationMixin, GPT2Config, GPT2LMHeadModel
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from transformers.models.gpt2.modeling_gpt2 import GPT2Model, GPT2PreTrainedModel

from hf_tiednorm import (
    FAMILIES,
    HEAD_TERMS,
    ExtraHeadTerm,
    HeadMode,
    HeadSettings,
    ModelFamily,
    TiedNormCausalLMMixin,
    TiedNormForCausalLM,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    register_family,
    register_head_mode,
    register_head_term,
    unregister_family,
    unregister_head_mode,
)
from hf_tiednorm.convert import main as tiednorm_convert
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.export import export_plain

MODE, TERM, FAMILY = "toy_root", "toy_temperature", "toy_ext"
GPT2 = dict(vocab_size=300, n_embd=32, n_layer=1, n_head=2, n_positions=64, bos_token_id=1, eos_token_id=2)


class RootNorm(HeadMode):
    """The toy mode: s_i = w_i·h / ‖w_i‖^½; a dead row scores 0. Its lossless start is the generic g = 1/scale."""

    name, equation, paper, summary = MODE, "s_i = w_i·h / ‖w_i‖^½", "a test's own mode", "w_i·h/‖w_i‖^½"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        squared = weight.float().pow(2).sum(-1)
        inverse_root = squared.clamp_min(eps * eps).pow(-0.25)
        return torch.where(squared > eps * eps, inverse_root, torch.zeros_like(squared)), None


def fold_temperature(tau, scale, bias):
    """The toy term: a learned τ_i dividing the scores, s_i / τ_i = (W·h)_i · (scale_i / τ_i) + bias_i / τ_i."""
    return (1 / tau if scale is None else scale / tau), (None if bias is None else bias / tau)


@strict
class ToyConfig(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, GPT2Config):
    model_type = "tiednorm_toy_ext"
    input_embedding_path = "transformer.wte"


class ToyForCausalLM(TiedNormCausalLMMixin, GPT2PreTrainedModel, GenerationMixin):
    """The toy family: GPT-2's body, the normalized tied head."""

    config_class = ToyConfig

    def __init__(self, config):
        super().__init__(config)
        self.transformer = GPT2Model(config)
        self.add_tied_norm_head(config.n_embd)
        self.post_init()


@pytest.fixture(scope="module")
def toys():
    register_head_mode(RootNorm())
    register_head_term(
        ExtraHeadTerm(
            TERM,
            "a learned per-token temperature τ_i dividing the scores",
            1.0,
            fold_temperature,
            "a learned τ_i per token, dividing the scores (1 at first)",
        )
    )
    row = register_family(ModelFamily(lm_class=ToyForCausalLM, source_class=GPT2LMHeadModel, name=FAMILY,
                                      cpu_bf16_eager_attention=False))  # fmt: skip
    yield row
    unregister_family(FAMILY)
    unregister_head_mode(MODE)
    del HEAD_TERMS[TERM]


def expected_logits(model, ids) -> torch.Tensor:
    """The toy mode and term written out (float64) from the model's last hidden states and tied matrix."""
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids).last_hidden_state.double()
        if getattr(model, "output_projection", None) is not None:
            hidden = model.output_projection(hidden.float()).double()
        head = model.get_output_embeddings()
        weight = head.weight.double()
        norms = weight.norm(dim=-1)
        root = torch.where(norms > 1e-6, norms, torch.inf).sqrt()  # a dead row (the zero padding row) scores 0
        return hidden @ (weight / root[:, None]).T / getattr(head, TERM).double()


def run_main(script: str, flags: list) -> None:
    """scripts/<script>.py's main(argv), called in this process: the registrations above reach the run."""
    threads = torch.get_num_threads()
    try:
        load_script(script).main([str(flag) for flag in flags])
    finally:
        torch.set_num_threads(threads)  # --num_threads sets it for the whole process


def set_temperatures(model) -> None:
    with torch.no_grad():
        getattr(model.get_output_embeddings(), TERM).uniform_(0.5, 2.0)


@pytest.fixture(scope="module")
def clm_run(toys, tmp_path_factory):
    """run_clm.py's main(), in this process: a new model of the toy family, with the toy mode and term."""
    data = tmp_path_factory.mktemp("text")
    write_tiny_parallel(data)
    out = tmp_path_factory.mktemp("clm") / "run"
    flags = [
        "--train_file", data / "train.en", "--validation_file", data / "val.en", "--test_file", data / "test.en",
        "--output_dir", out, "--model_family", FAMILY, "--head_mode", MODE, "--extra_terms", TERM,
        "--vocab_size", "300", "--hidden_size", "32", "--num_hidden_layers", "1", "--num_attention_heads", "2",
        "--block_size", "16", "--per_device_train_batch_size", "4", "--max_steps", "2", "--do_train", "--do_eval",
        "--learning_rate", "1e-2", "--report_to", "none", "--num_threads", "1", "--dataloader_pin_memory", "false",
        "--bf16", "false", "--seed", "0",
    ]  # fmt: skip
    run_main("run_clm", flags)
    return out


def test_run_clm_trains_the_toy_family_with_the_toy_mode_and_term(clm_run, tmp_path):
    config = json.loads((clm_run / "config.json").read_text())
    assert (config["model_type"], config["head_mode"], config["extra_terms"]) == ("tiednorm_toy_ext", MODE, [TERM])
    model = AutoModelForCausalLM.from_pretrained(clm_run).eval()
    assert type(model) is ToyForCausalLM and isinstance(model.get_output_embeddings().mode, RootNorm)
    assert not torch.all(getattr(model.lm_head, TERM) == 1)  # the term trained (it starts at 1)
    ids = torch.randint(4, model.config.vocab_size, (2, 9))  # the run's tokenizer: fewer than 300 tokens
    torch.testing.assert_close(model(input_ids=ids).logits.double(), expected_logits(model, ids), rtol=1e-4, atol=1e-4)

    model.save_pretrained(tmp_path / "again")  # save + load through the package, strict: the same logits
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)


def test_the_toy_family_travels_as_its_own_module_and_loads_as_remote_code(toys, clm_run, tmp_path):
    auto_map = json.loads((clm_run / "config.json").read_text())["auto_map"]
    assert auto_map == {"AutoConfig": f"{__name__}.ToyConfig", "AutoModelForCausalLM": f"{__name__}.ToyForCausalLM"}
    assert (clm_run / f"{__name__}.py").is_file()  # auto_map names only code the folder carries
    assert not (clm_run / "modeling_tiednorm.py").exists()  # the package's generated files define no toy family
    model = AutoModelForCausalLM.from_pretrained(clm_run).eval()
    ids = torch.randint(4, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
    # Registered here, the family's class wins over the folder's code (transformers prefers explicit local code).
    assert type(AutoModelForCausalLM.from_pretrained(clm_run, trust_remote_code=True)) is ToyForCausalLM
    unregister_family(FAMILY)  # a process that did not register it: the folder's copy of this module is run
    try:
        remote = AutoModelForCausalLM.from_pretrained(clm_run, trust_remote_code=True).eval()
    finally:
        register_family(toys)
    assert type(remote) is not ToyForCausalLM and type(remote).__name__ == "ToyForCausalLM"  # the folder's copy
    with torch.no_grad():
        torch.testing.assert_close(remote(input_ids=ids).logits, expected, rtol=0, atol=0)

    out = run_without_package(f"""
from transformers import AutoModelForCausalLM
try:
    AutoModelForCausalLM.from_pretrained({str(clm_run)!r}, trust_remote_code=True)
except ImportError as error:
    print("REFUSED", error)
else:
    print("LOADED")
""", cwd=tmp_path)  # fmt: skip
    assert "REFUSED" in out and "hf_tiednorm" in out, out  # "requires ... hf_tiednorm ... pip install"


def test_a_built_in_familys_remote_code_refuses_the_toy_mode_and_term_by_name(toys, tmp_path):
    for name, overrides in ((MODE, {"head_mode": MODE}), (TERM, {"extra_terms": [TERM]})):
        config = FAMILIES["causal"].config_class(vocab_size=64, hidden_size=32, intermediate_size=64,
                                                 num_hidden_layers=1, num_attention_heads=2, **overrides)  # fmt: skip
        folder = tmp_path / name
        TiedNormForCausalLM(config).save_pretrained(folder)
        reference = json.loads((folder / "config.json").read_text())["auto_map"]["AutoModelForCausalLM"]
        assert reference == "modeling_tiednorm.TiedNormForCausalLM" and (folder / "modeling_tiednorm.py").is_file()
        assert type(AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)) is TiedNormForCausalLM
        # What trust_remote_code runs where the package's classes are not registered: the folder's generated code,
        # which defines the package's modes and terms only. It refuses the toy ones by name, saying what to do.
        remote_class = get_class_from_dynamic_module(reference, folder)
        with pytest.raises((ValueError, StrictDataclassError), match=name) as refusal:
            remote_class.from_pretrained(folder)
        assert "registered" in str(refusal.value)


def test_run_translation_trains_a_built_in_family_with_the_toy_mode_and_term(toys, data_flags, tmp_path):
    out = tmp_path / "mt"
    flags = tiny_translation_flags(data_flags, out, "--head_mode", MODE, "--extra_terms", TERM, "--do_train",
                                   "--max_steps", "2", "--learning_rate", "1e-2")  # fmt: skip
    run_main("run_translation", flags)
    model = AutoModelForSeq2SeqLM.from_pretrained(out).eval()
    head = model.get_output_embeddings()
    assert isinstance(head.mode, RootNorm) and not torch.all(getattr(head, TERM) == 1)
    model.save_pretrained(tmp_path / "again")
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "again").eval()
    ids = torch.randint(4, model.config.vocab_size, (2, 7))
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=ids, decoder_input_ids=ids).logits,
                                   model(input_ids=ids, decoder_input_ids=ids).logits, rtol=0, atol=0)  # fmt: skip


def test_a_plain_gpt2_converts_to_the_toy_family_and_exports_back(toys, tmp_path):
    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(**GPT2)).eval().save_pretrained(tmp_path / "gpt2")
    source = GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2").eval()
    ids = torch.randint(4, 300, (2, 9))
    with torch.no_grad():
        plain = source(input_ids=ids).logits
    flag = f"--{TERM.replace('_', '-')}"  # the term's converter flag
    tiednorm_convert([str(tmp_path / "gpt2"), str(tmp_path / "cli"), "--head-mode", MODE, flag, "--lossless-start"])
    converted = AutoModelForCausalLM.from_pretrained(tmp_path / "cli").eval()
    assert type(converted) is ToyForCausalLM  # 1:1 onto the toy family (its source_class), not the wrapper
    assert (converted.config.head_mode, list(converted.config.extra_terms)) == (MODE, [TERM])
    with torch.no_grad():
        torch.testing.assert_close(converted(input_ids=ids).logits, plain, rtol=1e-4, atol=1e-4)  # lossless start

    settings = HeadSettings(head_mode=MODE, extra_terms=(TERM,))
    api = normalize_tied_head(GPT2LMHeadModel.from_pretrained(tmp_path / "gpt2"), settings=settings,
                              lossless_start=True).eval()  # fmt: skip
    assert type(api) is ToyForCausalLM
    set_temperatures(api)  # the term away from its neutral start: the export must bake it
    with torch.no_grad():
        expected = api(input_ids=ids).logits
    torch.testing.assert_close(expected.double(), expected_logits(api, ids) * api.lm_head.logit_scale.double(),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    result = export_plain(api, tmp_path / "plain")
    assert result.parent == "GPT2LMHeadModel" and result.max_abs_diff <= result.tolerance
    exported = GPT2LMHeadModel.from_pretrained(tmp_path / "plain").eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, expected, rtol=1e-4, atol=1e-4)
