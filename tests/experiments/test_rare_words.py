"""experiments/rare_words.py: word F1 by training-frequency bucket and the row-norm / frequency correlation."""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest
import torch
from testing_utils import tiny_model, tiny_tokenizer

SCRIPT = Path(__file__).resolve().parents[2] / "experiments" / "rare_words.py"
_spec = importlib.util.spec_from_file_location("rare_words", SCRIPT)
rare_words = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(rare_words)


def test_bucket_f1_counts_clipped_matches_per_bucket():
    train = Counter({"a": 1000, "dog": 5, "runs": 1, "cat": 2})
    # "a": ref 2, out 1 → 1 match; "dog": ref 1, out 2 → 1 match; "runs": ref 1, out 0; "cat": out 1, ref 0;
    # "zebra" (unseen): out 1, ref 1 → 1 match.
    result = rare_words.bucket_f1(["a dog dog cat zebra"], ["a a dog runs zebra"], train)
    assert result[">=1000"] == {"reference_words": 2, "output_words": 1, "matches": 1,
                                "precision": 1.0, "recall": 0.5, "f1": pytest.approx(2 / 3)}
    assert result["5-9"]["precision"] == 0.5 and result["5-9"]["recall"] == 1.0
    assert result["1"]["recall"] == 0.0 and result["1"]["precision"] is None and result["1"]["f1"] is None
    assert result["2-4"]["precision"] == 0.0 and result["2-4"]["recall"] is None
    assert result["unseen"]["f1"] == 1.0
    assert result["10-99"]["reference_words"] == 0 and result["10-99"]["f1"] is None


def test_bucket_f1_uses_13a_tokens_and_refuses_misaligned_files():
    result = rare_words.bucket_f1(["a dog."], ["a dog ."], Counter({"a": 1, "dog": 1, ".": 1}))
    assert result["1"]["f1"] == 1.0  # "dog." is split like the reference's "dog ."
    with pytest.raises(ValueError, match="2 output lines for 1 references"):
        rare_words.bucket_f1(["a", "b"], ["a"], Counter())


def test_main_writes_json_png_and_a_norm_correlation_that_follows_the_weights(tmp_path):
    tokenizer = tiny_tokenizer()
    model = tiny_model("seq2seq", vocab_size=len(tokenizer))
    train = ["a dog runs on the grass ."] * 9 + ["a woman reads a book ."] * 3 + ["two men play music ."]
    ids = tokenizer(train, add_special_tokens=False)["input_ids"]
    counts = torch.bincount(torch.tensor([i for line in ids for i in line]), minlength=len(tokenizer)).float()
    with torch.no_grad():  # row norm = log(count) + 1 exactly (equal counts, equal norms): both correlations are 1
        weight = model.get_input_embeddings().weight
        weight.zero_()
        weight[:, 0] = counts.clamp_min(1).log() + 1
    run = tmp_path / "run"
    model.save_pretrained(run)
    tokenizer.save_pretrained(run)
    (run / "test_predictions.txt").write_text("a dog runs .\na man reads .\n")
    (tmp_path / "ref.en").write_text("a dog runs .\na woman reads .\n")
    (tmp_path / "train.en").write_text("\n".join(train) + "\n")

    result = rare_words.main(["--references", str(tmp_path / "ref.en"), "--train_references",
                              str(tmp_path / "train.en"), "--run", f"cosine={run}", "--run", f"cosine={run}",
                              "--output", str(tmp_path / "out" / "rare")])
    saved = json.loads((tmp_path / "out" / "rare.json").read_text())
    assert (tmp_path / "out" / "rare.png").stat().st_size > 0
    assert saved["summary"] == json.loads(json.dumps(result["summary"]))
    norms = saved["summary"]["cosine"]["norm_log_frequency"]
    assert norms["spearman"]["mean"] == pytest.approx(1.0) and norms["pearson"]["mean"] == pytest.approx(1.0)
    assert norms["spearman"]["n"] == 2 and norms["spearman"]["std"] == pytest.approx(0.0)
    f1 = saved["summary"]["cosine"]["f1"]
    assert f1[">=1000"]["n"] == 0  # no word occurs that often in 13 training lines
    assert f1["2-4"]["mean"] == pytest.approx(2 / 3)  # "reads": hit; "woman" (3x) missed, "man" (unseen) wrong


def test_run_argument_names_a_missing_folder(tmp_path, capsys):
    with pytest.raises(SystemExit):
        rare_words.main(["--references", "r", "--train_references", "t", "--run", f"x={tmp_path / 'nope'}",
                         "--output", str(tmp_path / "o")])
    assert "is not a folder" in capsys.readouterr().err
