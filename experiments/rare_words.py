"""Rare-word quality of saved models: word F1 by training frequency, and how row norms follow token frequency.

Liu, Zhai & Chen's case for a normalized head is that the tied score w_i·h is biased by the row norm ‖w_i‖, and
that frequent tokens end training with the larger norms, so the head favours them over rare ones. This script
measures both halves of that argument on any saved model and reference file:

* **Word F1 by frequency bucket** (compare-mt's word-accuracy analysis): the reference and output are tokenized
  with sacreBLEU's 13a tokenizer; every word type is put in a bucket by how often it occurs in the *training
  references*; per sentence a word matches min(count in output, count in reference) times; precision, recall and
  F1 of each bucket come from the match, output and reference counts summed over the test set. Buckets: unseen, 1,
  2–4, 5–9, 10–99, 100–999, ≥ 1000 training occurrences.
* **Row norm against log frequency**: the Pearson and Spearman correlation of ‖w_i‖ (the shared matrix as stored;
  for ``l2`` the raw rows, whose lookups are normalized) with log(count) of token i in the tokenized training
  references, over the tokens that occur there.

Runs are named ``LABEL=FOLDER``; several folders with one label (seeds) are reported as mean ± std per bucket.
A folder holds the saved model and its predictions (``test_predictions.txt``, as ``scripts/run_translation.py
--do_predict`` writes them; one hypothesis a line, aligned with the references).

    python experiments/rare_words.py \\
        --references ../shared/data/multi30k/test_2016_flickr.en.gz \\
        --train_references ../shared/data/multi30k/train.en.gz \\
        --run baseline=runs/baseline_s0 --run cosine=runs/cosine_s0 \\
        --output results/rare_words_quick.json

writes the JSON and, beside it, the PNG of the same name.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

# (label, lowest count, highest count) of each training-frequency bucket; compare-mt's cut-offs, plus "unseen".
BUCKETS: tuple[tuple[str, int, float], ...] = (
    ("unseen", 0, 0),
    ("1", 1, 1),
    ("2-4", 2, 4),
    ("5-9", 5, 9),
    ("10-99", 10, 99),
    ("100-999", 100, 999),
    (">=1000", 1000, math.inf),
)
_tokenize = Tokenizer13a()


def read_text(path: Path) -> list[str]:
    """The lines of a UTF-8 text file (``.gz`` works), without their line ends."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        return handle.read().splitlines()


def words(line: str) -> list[str]:
    """The 13a-tokenized words of one line (sacreBLEU's default tokenization)."""
    return _tokenize(line.strip()).split()


def bucket_of(count: int) -> str:
    for label, low, high in BUCKETS:
        if low <= count <= high:
            return label
    raise AssertionError(count)


def bucket_f1(hypotheses: list[str], references: list[str], train_counts: Counter) -> dict[str, dict]:
    """Word precision / recall / F1 per training-frequency bucket.

    Args:
        hypotheses: one output line per reference.
        references: the reference lines.
        train_counts: word → occurrences in the training references.

    Returns:
        bucket label → {"reference_words", "output_words", "matches", "precision", "recall", "f1"}; a ratio with a
        zero denominator is ``None``.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} output lines for {len(references)} references: they must align")
    totals = {label: Counter() for label, _, _ in BUCKETS}
    for hypothesis, reference in zip(hypotheses, references):
        output, wanted = Counter(words(hypothesis)), Counter(words(reference))
        for word in output.keys() | wanted.keys():
            total = totals[bucket_of(train_counts.get(word, 0))]
            total["output_words"] += output[word]
            total["reference_words"] += wanted[word]
            total["matches"] += min(output[word], wanted[word])
    result = {}
    for label, total in totals.items():
        precision = total["matches"] / total["output_words"] if total["output_words"] else None
        recall = total["matches"] / total["reference_words"] if total["reference_words"] else None
        f1 = (
            2 * precision * recall / (precision + recall)
            if precision is not None and recall is not None and precision + recall > 0
            else (0.0 if precision is not None and recall is not None else None)
        )
        result[label] = {**{key: total[key] for key in ("reference_words", "output_words", "matches")},
                         "precision": precision, "recall": recall, "f1": f1}
    return result


def correlations(x: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """Pearson and Spearman correlation of two vectors (Spearman: Pearson of the average ranks)."""
    import pandas as pd  # a dependency of datasets

    x_, y_ = pd.Series(x), pd.Series(y)
    return {"pearson": float(x_.corr(y_)), "spearman": float(x_.rank().corr(y_.rank()))}


def norm_frequency(folder: Path, train_lines: list[str]) -> dict:
    """Correlation of the saved model's row norms ‖w_i‖ with log(count) of token i in ``train_lines``."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_tiednorm  # noqa: F401  (registers our families with the Auto classes)

    config = AutoConfig.from_pretrained(folder)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    weight = model.get_input_embeddings().weight.detach().float()
    ids = tokenizer(train_lines, add_special_tokens=False)["input_ids"]
    counts = torch.bincount(torch.tensor([i for line in ids for i in line]), minlength=weight.shape[0])
    seen = counts > 0
    norms = torch.linalg.vector_norm(weight, dim=-1)
    return {
        "tokens_seen": int(seen.sum()),
        "vocab_size": int(weight.shape[0]),
        **correlations(norms[seen].numpy(), counts[seen].float().log().numpy()),
    }


def mean_std(values: list[float | None]) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"mean": None, "std": None, "n": 0}
    std = float(np.std(values, ddof=1)) if len(values) > 1 else None
    return {"mean": float(np.mean(values)), "std": std, "n": len(values)}


def analyse(runs: list[tuple[str, Path]], references: list[str], train_lines: list[str], predictions_name: str,
            with_norms: bool) -> dict:
    """Per run the bucket table (and norm correlation); per label the mean ± std over its runs."""
    train_counts = Counter(word for line in train_lines for word in words(line))
    per_run = []
    for label, folder in runs:
        hypotheses = read_text(folder / predictions_name)
        row = {"label": label, "folder": str(folder), "buckets": bucket_f1(hypotheses, references, train_counts)}
        if with_norms:
            row["norm_frequency"] = norm_frequency(folder, train_lines)
        per_run.append(row)
    by_label = defaultdict(list)
    for row in per_run:
        by_label[row["label"]].append(row)
    summary = {}
    for label, rows in by_label.items():
        summary[label] = {
            "f1": {bucket: mean_std([r["buckets"][bucket]["f1"] for r in rows]) for bucket, _, _ in BUCKETS},
            "reference_words": {bucket: rows[0]["buckets"][bucket]["reference_words"] for bucket, _, _ in BUCKETS},
        }
        if with_norms:
            summary[label]["norm_log_frequency"] = {
                key: mean_std([r["norm_frequency"][key] for r in rows]) for key in ("pearson", "spearman")
            }
    return {"buckets": [label for label, _, _ in BUCKETS], "runs": per_run, "summary": summary}


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buckets, labels = result["buckets"], list(result["summary"])
    width = 0.8 / max(len(labels), 1)
    figure, axis = plt.subplots(figsize=(10, 4.5))
    for k, label in enumerate(labels):
        stats = [result["summary"][label]["f1"][b] for b in buckets]
        means = [s["mean"] if s["mean"] is not None else np.nan for s in stats]
        errors = [np.nan if s["std"] is None else s["std"] for s in stats]  # one seed: no error bar
        n = max(s["n"] for s in stats)
        x = np.arange(len(buckets)) + (k - (len(labels) - 1) / 2) * width
        axis.bar(x, means, width, yerr=errors, capsize=2, label=f"{label} (n={n})")
    reference_words = result["summary"][labels[0]]["reference_words"] if labels else {}
    axis.set_xticks(np.arange(len(buckets)), [f"{b}\n(n={reference_words.get(b, 0)})" for b in buckets])
    axis.set_xlabel("occurrences in the training references (n: reference words of the scored split)")
    axis.set_ylabel("word F1 (mean ± std over runs)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def parse_run(text: str) -> tuple[str, Path]:
    label, sep, folder = text.partition("=")
    if not sep or not label or not folder:
        raise argparse.ArgumentTypeError(f"--run takes LABEL=FOLDER, got {text!r}")
    if not Path(folder).is_dir():
        raise argparse.ArgumentTypeError(f"--run {text}: {folder} is not a folder")
    return label, Path(folder)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--references", type=Path, required=True, help="reference file of the scored split")
    parser.add_argument("--train_references", type=Path, required=True,
                        help="target side of the training data: defines each word's frequency bucket and the "
                             "token counts for the norm correlation")
    parser.add_argument("--run", type=parse_run, action="append", required=True, metavar="LABEL=FOLDER",
                        help="a saved run (model + predictions); repeat a label for several seeds")
    parser.add_argument("--predictions_name", default="test_predictions.txt",
                        help="the predictions file inside each run folder (default: %(default)s)")
    parser.add_argument("--no_norms", action="store_true",
                        help="skip the row-norm correlation (for folders that hold predictions only)")
    parser.add_argument("--output", type=Path, required=True,
                        help="the JSON to write (e.g. results/rare_words.json); the PNG goes beside it")
    args = parser.parse_args(argv)
    result = analyse(args.run, read_text(args.references), read_text(args.train_references),
                     args.predictions_name, with_norms=not args.no_norms)
    result["command"] = {"references": str(args.references), "train_references": str(args.train_references),
                         "predictions_name": args.predictions_name}
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.output.with_suffix(".png"))
    for label, summary in result["summary"].items():
        cells = ", ".join(
            f"{bucket} {stats['mean']:.3f}" for bucket, stats in summary["f1"].items() if stats["mean"] is not None
        )
        print(f"{label}: word F1 by bucket: {cells}")
        if "norm_log_frequency" in summary:
            print(f"{label}: corr(‖w‖, log freq) spearman {summary['norm_log_frequency']['spearman']['mean']:.3f}")
    return result


if __name__ == "__main__":
    main()
