"""The training scripts take every model family of hf_tiednorm (hf_tiednorm/modeling/families/table.py):
run_translation.py every encoder-decoder one (BART trains from scratch with the main recipe's flags), run_clm.py the
causal ones."""

from __future__ import annotations

import json

import pytest
from script_helpers import load_script, run_script, tiny_translation_flags

from hf_tiednorm.modeling.families.table import FAMILIES, families


def test_run_translation_offers_every_encoder_decoder_family():
    translation = load_script("run_translation")
    own = {family.lm_class for family in translation.OWN_FAMILIES.values()}
    assert own == {FAMILIES[name].lm_class for name in families(encoder_decoder=True)}
    assert "bart" in translation.MODEL_FAMILIES and "marian" in translation.MODEL_FAMILIES
    assert families(encoder_decoder=False) == ("causal",)  # run_clm.py builds TiedNormForCausalLM, the causal one


def test_bart_trains_from_scratch_through_run_translation(data_flags, tmp_path, monkeypatch):
    output_dir = tmp_path / "bart"
    flags = tiny_translation_flags(
        data_flags, output_dir, "--model_family", "bart", "--do_train", "--do_eval", "--max_steps", "2",
        "--save_strategy", "no", "--eval_strategy", "no", "--head_mode", "cosine", "--predict_with_generate",
    )
    run_script("run_translation", flags, monkeypatch)
    config = json.loads((output_dir / "config.json").read_text())
    assert config["model_type"] == "tiednorm_bart" and config["head_mode"] == "cosine"
    assert config["architectures"] == ["TiedNormBartForConditionalGeneration"]
    results = json.loads((output_dir / "all_results.json").read_text())
    assert results["train_loss"] > 0 and "eval_bleu" in results


@pytest.mark.parametrize("bad", ["fairseq", "causal"])
def test_run_translation_refuses_a_family_that_is_no_encoder_decoder(bad, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="--model_family must be one of"):
        run_script("run_translation", ["--output_dir", tmp_path, "--report_to", "none", "--model_family", bad],
                   monkeypatch)


@pytest.mark.parametrize("bad", ["fairseq", "seq2seq"])
def test_run_clm_refuses_a_family_that_is_no_registered_causal_one(bad, tmp_path):
    with pytest.raises(ValueError, match=r"--model_family must be one of \('causal',\)"):
        load_script("run_clm").main(["--output_dir", tmp_path, "--report_to", "none", "--model_family", bad])
