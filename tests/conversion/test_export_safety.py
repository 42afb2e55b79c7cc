"""Issue 40, export and publishing: nothing silent. The tie is kept only at an effective fp32 scale of 1 (S2); every
export refuses non-finite weights and a logit difference above its stated tolerance, and its card says what was
checked (S3); a runtime-registered head mode is not published as remote code (S6); no upload preview is written
inside its checkpoint (S7); another model's tokenizer is refused (S8), and so is a --tokenizer folder that does not
exist (S9); the caller's model keeps its training mode (S10); the card's convert-back command works wherever it
gives one (S11); only the run's plots are published (S15); staging is atomic (U6); a truncated weights file and an
output folder that is a file are named (U7, U8)."""

from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
import torch
from testing_utils import model_inputs, tiny_model, tiny_tokenizer
from tiny_architectures import inputs_for, source_model
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, LlamaConfig, LlamaForCausalLM

from hf_tiednorm.conversion import export as export_module
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.conversion.export import main as export_main
from hf_tiednorm.conversion.export_card import THIS_FOLDER
from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head
from hf_tiednorm.convert import main as convert_main
from hf_tiednorm.modeling.head import modes as head_modes
from hf_tiednorm.modeling.head.modes import Cosine, HeadMode
from hf_tiednorm.publishing.hub import push_to_hub
from hf_tiednorm.registration.head_modes import register_head_mode, unregister_head_mode

TOLERANCE = 1e-4


@torch.no_grad()
def logits(model, inputs) -> torch.Tensor:
    return model(**inputs).logits.float()


def saved(model, folder: Path, tokenizer=None) -> Path:
    model.save_pretrained(folder)
    (tokenizer or tiny_tokenizer()).save_pretrained(folder)
    return folder


def lossless_cosine_llama(tmp_path: Path, dtype=torch.float32):
    """A tiny Llama converted to cosine with its lossless start (g_i = ‖w_i‖), in ``dtype``."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=True)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "llama")
    return convert_checkpoint(tmp_path / "llama", head_mode="cosine", lossless_start=True).to(dtype)


# --- S2: the tie --------------------------------------------------------------------------------------------------


def test_a_bf16_logit_scale_of_1_05_is_not_dropped_by_the_tie():
    source = tiny_model("causal", head_mode="baseline", logit_scale_kind="scalar").to(torch.bfloat16)
    with torch.no_grad():
        source.lm_head.logit_scale.fill_(1.05)
    result = export_plain(source)
    assert not result.tied  # 96b48f9: tied (1.05 is within 8 bf16 ulps of 1), logits 4.5 % off
    inputs = model_inputs(source)
    expected = logits(source, inputs)
    error = (logits(result.model, inputs) - expected).abs().max() / expected.abs().max()
    assert error < 0.01, error


def test_the_cli_unties_a_bf16_lossless_start_whose_scale_was_trained(tmp_path, capsys):
    source = lossless_cosine_llama(tmp_path, torch.bfloat16)
    with torch.no_grad():
        source.lm_head.logit_scale.mul_(1.04)
    saved(source, tmp_path / "model")
    export_main([str(tmp_path / "model"), str(tmp_path / "out")])
    assert "untied" in capsys.readouterr().out  # 96b48f9: "tied", max diff 1.35
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    inputs = model_inputs(source)
    expected = logits(source, inputs)
    assert (logits(plain, inputs) - expected).abs().max() / expected.abs().max() < 0.01


def test_the_tie_follows_the_effective_scale_not_the_weight_dtype(tmp_path):
    assert export_plain(lossless_cosine_llama(tmp_path)).tied  # fp32: g_i·(1/‖w_i‖) is 1 up to one fp32 rounding
    one = tiny_model("causal", head_mode="baseline", logit_scale_kind="scalar").to(torch.bfloat16)  # g = 1 exactly
    assert export_plain(one).tied
    # In bf16 the learned g_i = ‖w_i‖ is itself rounded to bf16, so the scale is 1 only to 2^-9: untied, and exact.
    rounded = export_plain(lossless_cosine_llama(tmp_path, torch.bfloat16))
    assert not rounded.tied and rounded.max_abs_diff <= rounded.tolerance


# --- S3: the check ------------------------------------------------------------------------------------------------


def test_a_nan_weight_is_refused_by_name_and_nothing_is_written(tmp_path):
    source = tiny_model("seq2seq", head_mode="cosine")
    with torch.no_grad():
        source.model.decoder.layers[0].fc1.weight[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"not finite \(model\.decoder\.layers\.0\.fc1\.weight: 1 of"):
        export_plain(source, tmp_path / "out")  # 96b48f9: rc 0, max_abs_diff nan, the card said "exactly"
    assert not (tmp_path / "out").exists()


class UnguardedCosine(HeadMode):
    """A user's cosine that divides by every row norm, a zero one included."""

    name, equation, paper = "unguarded", "s_i = w_i·h / ‖w_i‖ (no dead-row guard)", "a test's own mode"

    def column_terms(self, weight, eps):
        return 1 / torch.linalg.vector_norm(weight.float(), dim=-1), None


@pytest.fixture
def unguarded_mode():
    register_head_mode(UnguardedCosine())
    try:
        yield UnguardedCosine.name
    finally:
        unregister_head_mode(UnguardedCosine.name)


def test_a_user_mode_dividing_by_a_zero_norm_row_is_refused(unguarded_mode):
    source = tiny_model("causal", head_mode=unguarded_mode)  # its padding row 0 is a zero row
    with pytest.raises(ValueError, match=r"not finite \(lm_head\.weight: 32 of 1952 values, first at index \[0, 0\]"):
        export_plain(source, check=False)  # the weights are checked even without the logit comparison


def test_a_difference_above_the_tolerance_is_refused(monkeypatch):
    """Whatever made the baked layer wrong (here: a tie forced on a trained scale), the logit check refuses it."""
    source = tiny_model("causal", head_mode="baseline", logit_scale_kind="scalar")
    with torch.no_grad():
        source.lm_head.logit_scale.fill_(1.05)
    monkeypatch.setattr(export_module, "rows_are_lookups", lambda rows, lookups: True)
    with pytest.raises(ValueError, match="above the tolerance .* for float32"):
        export_plain(source)


def test_the_card_states_the_check_and_its_tolerance_not_exactly(tmp_path):
    result = export_plain(tiny_model("causal", head_mode="cosine", logit_scale_kind="vector"), tmp_path / "out")
    card = (tmp_path / "out" / "README.md").read_text()
    assert "exactly" not in card and f"tolerance {result.tolerance:.1e}" in card
    export_plain(tiny_model("causal", head_mode="cosine"), tmp_path / "unchecked", check=False)
    assert "not compared" in (tmp_path / "unchecked" / "README.md").read_text()


# --- S10 ----------------------------------------------------------------------------------------------------------


def test_a_model_in_training_mode_stays_in_training_mode():
    source = tiny_model("seq2seq", head_mode="cosine").train()
    source.model.encoder.eval()  # a mixed state comes back as it was, module by module
    export_plain(source)
    assert source.training and source.model.decoder.training and not source.model.encoder.training


# --- S6, S7, S8, S9, S15, U6, U7, U8: staging -----------------------------------------------------------------------


class RenamedCosine(Cosine):
    name = "my_cosine"


def test_a_runtime_registered_mode_is_not_published_as_remote_code(tmp_path):
    register_head_mode(RenamedCosine())
    try:
        saved(tiny_model("causal", head_mode="my_cosine"), tmp_path / "model")
        with pytest.raises(ValueError, match=r"registered at runtime .*\(tiednorm-push --plain"):
            push_to_hub(tmp_path / "model", "tester/x", dry_run_dir=tmp_path / "up")  # 96b48f9: staged
        assert not (tmp_path / "up").exists()
        folder = push_to_hub(tmp_path / "model", "tester/x", dry_run_dir=tmp_path / "plain", plain=True)
        assert json.loads((folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    finally:
        unregister_head_mode("my_cosine")


def test_a_builtin_mode_redefined_at_runtime_is_not_published_as_remote_code(tmp_path, monkeypatch):
    saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    redefined = Cosine()
    redefined.equation = "s_i = something else"  # the staged head_modes.py would score with the original
    with pytest.raises(ValueError, match="'cosine' is built in"):  # refused where it is registered (issue 48)
        register_head_mode(redefined, replace=True)
    monkeypatch.setitem(head_modes.HEAD_MODE_REGISTRY, "cosine", redefined)  # past the registry: push still refuses it
    with pytest.raises(ValueError, match="head_mode 'cosine' was registered at runtime"):
        push_to_hub(tmp_path / "model", "tester/x", dry_run_dir=tmp_path / "up")


@pytest.mark.parametrize("plain", [False, True])
def test_no_upload_preview_inside_the_checkpoint(plain, tmp_path):
    saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    with pytest.raises(ValueError, match="must lie outside the checkpoint folder"):
        push_to_hub(tmp_path / "model", "tester/x", dry_run_dir=tmp_path / "model" / "preview", plain=plain)
    assert not (tmp_path / "model" / "preview").exists()  # 96b48f9 (--plain): written inside the checkpoint
    with pytest.raises(ValueError, match="must lie outside the checkpoint folder"):
        export_plain(tmp_path / "model", tmp_path / "model" / "plain")


def another_models_tokenizer(tmp_path: Path) -> Path:
    """A 61-token tokenizer beside a 40-token model, as with another model's tokenizer folder."""
    saved(tiny_model("causal", head_mode="cosine", vocab_size=40), tmp_path / "model")
    return tmp_path / "model"


@pytest.mark.parametrize("route", ["push", "push-plain", "export"])
def test_another_models_tokenizer_is_refused_naming_both(route, tmp_path):
    model = another_models_tokenizer(tmp_path)
    pattern = rf"tokenizer of {model} does not belong to the model of {model}: it has 61 tokens .* vocab_size is 40"
    with pytest.raises(ValueError, match=pattern):  # 96b48f9: staged; the first use failed with an IndexError
        if route == "export":
            export_plain(model, tmp_path / "out")
        else:
            push_to_hub(model, "tester/x", dry_run_dir=tmp_path / "out", plain=route == "push-plain")
    assert not (tmp_path / "out").exists()


def test_a_tokenizer_with_another_end_of_sequence_token_is_refused(tmp_path):
    saved(tiny_model("causal", head_mode="cosine", eos_token_id=5), tmp_path / "model")
    with pytest.raises(ValueError, match=r"its end-of-sequence token id is 2, the model's is \[5\]"):
        export_plain(tmp_path / "model", tmp_path / "out")


def test_a_missing_tokenizer_folder_is_named(tmp_path):
    saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    with pytest.raises(FileNotFoundError, match="tokenizer folder not found: no_such_dir"):
        export_main([str(tmp_path / "model"), str(tmp_path / "out"), "--tokenizer", "no_such_dir"])  # 96b48f9: rc 0
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=f"no tokenizer .* in {tmp_path / 'empty'}"):
        export_plain(tmp_path / "model", tmp_path / "out", tokenizer=tmp_path / "empty")


def test_only_the_plots_the_run_wrote_are_published(tmp_path):
    model = saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    for name in ("embedding_norms.png", "embedding_norms_vs_frequency.png", "Screenshot 2026-11-20.png"):
        (model / name).write_bytes(b"\x89PNG")
    folder = push_to_hub(model, "tester/x", dry_run_dir=tmp_path / "up")
    assert sorted(path.name for path in folder.glob("*.png")) == [
        "embedding_norms.png", "embedding_norms_vs_frequency.png"
    ]  # 96b48f9: the screenshot too


@pytest.mark.parametrize("route", ["export", "push-plain"])
def test_a_corrupt_tokenizer_leaves_no_half_written_folder_and_names_the_file(route, tmp_path):
    model = saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    good = (model / "tokenizer.json").read_text()
    (model / "tokenizer.json").write_text(good[: len(good) // 2])

    def stage():
        if route == "export":
            return export_plain(model, tmp_path / "out")
        return push_to_hub(model, "tester/x", dry_run_dir=tmp_path / "out", plain=True)

    with pytest.raises(ValueError, match=f"{model / 'tokenizer.json'} is not valid JSON"):
        stage()  # 96b48f9: a bare JSONDecodeError after the weights were written
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]  # nothing half-written beside it either
    (model / "tokenizer.json").write_text(good)
    stage()  # the rerun is not refused as "not empty"
    assert (tmp_path / "out" / "tokenizer.json").is_file()


def test_a_failure_late_in_the_export_leaves_no_folder(tmp_path, monkeypatch):
    model = saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")

    def broken_card(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr("hf_tiednorm.conversion.export_card.write_export_card", broken_card)
    with pytest.raises(RuntimeError, match="disk full"):
        export_plain(model, tmp_path / "out")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model"]


def test_a_truncated_weights_file_is_named(tmp_path):
    model = saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ValueError, match=r"model\.safetensors is truncated \(\d+ of \d+ bytes\)"):
        export_main([str(model), str(tmp_path / "out")])  # 96b48f9: a safetensors error naming no file


@pytest.mark.parametrize("route", ["export", "convert", "push", "push-plain", "below-a-file"])
def test_an_output_folder_that_is_a_file_is_named(route, tmp_path):
    model = saved(tiny_model("causal", head_mode="cosine"), tmp_path / "model")
    (tmp_path / "taken").write_text("a file")
    out = tmp_path / "taken" / "out" if route == "below-a-file" else tmp_path / "taken"
    with pytest.raises(NotADirectoryError, match="is a file|lies below .*taken, which is a file"):
        if route in ("export", "below-a-file"):
            export_plain(model, out)
        elif route == "convert":
            convert_main([str(model), str(out)])
        else:
            push_to_hub(model, "tester/x", dry_run_dir=out, plain=route == "push-plain")


# --- S11: converting back -----------------------------------------------------------------------------------------


def trained(model):
    """Learned logit scale / bias far from their initialization (1 and 0), as after training."""
    head = model.get_output_embeddings()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        if head.logit_scale is not None:
            head.logit_scale.copy_(torch.rand(head.logit_scale.shape, generator=generator) * 1.5 + 0.5)
        if head.logit_bias is not None:
            head.logit_bias.copy_(torch.randn(head.logit_bias.shape, generator=generator))
    return model


BACK = {  # case -> (build, what the card must say: "command" or "cannot")
    "marian-distance": (lambda: tiny_model("seq2seq", head_mode="distance"), "command"),
    "marian-cosine-bias": (lambda: trained(tiny_model("seq2seq", head_mode="cosine", logit_bias=True)), "command"),
    "bart-cosine-bias": (lambda: trained(tiny_model("bart", head_mode="cosine", logit_bias=True)), "command"),
    "llama-cosine-scalar": (
        lambda: trained(tiny_model("causal", head_mode="cosine", logit_scale_kind="scalar")), "command"
    ),
    "llama-baseline-scalar": (
        lambda: trained(tiny_model("causal", head_mode="baseline", logit_scale_kind="scalar")), "command"
    ),
    "llama-l2": (lambda: tiny_model("causal", head_mode="l2"), "command"),
    "llama-l2-vector": (lambda: trained(tiny_model("causal", head_mode="l2", logit_scale_kind="vector")), "command"),
    "marian-distance-scalar": (
        lambda: trained(tiny_model("seq2seq", head_mode="distance", logit_scale_kind="scalar")), "command"
    ),
    "wrapped-marian-distance": (
        lambda: trained(normalize_tied_head(source_model("marian"), "distance", logit_bias=True, generic=True).eval()),
        "command",
    ),
    "marian-decoder-topology": (lambda: tiny_model("seq2seq", head_mode="cosine", tie_topology="decoder"), "cannot"),
    "wrapped-t5-vector": (
        lambda: trained(normalize_tied_head(source_model("t5"), "cosine", logit_scale_kind="vector").eval()), "cannot"
    ),
}


@pytest.mark.parametrize("case", sorted(BACK))
def test_the_cards_convert_back_command_gives_back_the_logits(case, tmp_path):
    build, expected = BACK[case]
    source = build()
    export_plain(source, tmp_path / "plain")
    card = (tmp_path / "plain" / "README.md").read_text()
    inputs = inputs_for(source) if source.config.model_type == "tiednorm_wrapped" else model_inputs(source)
    if expected == "cannot":
        assert "cannot be converted back to the normalized head losslessly" in card and "tiednorm-convert" not in card
        return
    command = shlex.split(card.split("convert it back: `")[1].split("`")[0].replace(THIS_FOLDER, "PLACEHOLDER"))
    assert command[:3] == ["tiednorm-convert", "PLACEHOLDER", "normalized/"], command
    convert_main([str(tmp_path / "plain"), str(tmp_path / "back"), *command[3:]])  # 96b48f9: refused in 5 of these
    auto = AutoModelForSeq2SeqLM if source.config.is_encoder_decoder else AutoModelForCausalLM
    back = auto.from_pretrained(tmp_path / "back", trust_remote_code=True).eval()
    torch.testing.assert_close(logits(back, inputs), logits(source, inputs), rtol=0, atol=TOLERANCE)


def test_a_hub_card_downloads_before_converting_and_names_no_hub_id_to_the_converter(tmp_path, monkeypatch):
    saved(trained(tiny_model("causal", head_mode="cosine", logit_scale_kind="vector")), tmp_path / "model")
    folder = push_to_hub(tmp_path / "model", "tester/plain-cosine", dry_run_dir=tmp_path / "up", plain=True)
    card = (folder / "README.md").read_text()
    assert "`hf download tester/plain-cosine --local-dir plain-cosine`, then `tiednorm-convert plain-cosine " in card
    assert "tiednorm-convert tester/" not in card  # 96b48f9: a Hub id the converter cannot fetch
    shutil.copytree(folder, tmp_path / "plain-cosine")  # what `hf download` writes
    command = shlex.split(card.split("then `")[1].split("`")[0])
    monkeypatch.chdir(tmp_path)  # the command as the card gives it, run where the download went
    convert_main(command[1:])
    assert (tmp_path / "normalized" / "config.json").is_file()
