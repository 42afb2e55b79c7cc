"""A run's metrics as a model card's ``model-index``: the Trainer's metric names (``eval_bleu``,
``test_perplexity``, ...) to (split, metric) pairs, and those to huggingface_hub ``EvalResult`` entries.

sacreBLEU scores carry their signature in the entry's ``metric_config``; perplexity is rounded to 3 decimals;
metrics of other names stay out of the model-index (the card's body lists them). What the Trainer reports next to
its metrics but is no measurement of the model (runtimes, throughput, FLOs, epochs, step numbers, row counts) is no
metric and is left out; the step numbers ``train_loss_first_step`` / ``train_loss_last_step`` name the steps
``train_loss`` averages. A split scored on its first N of M rows (``--max_eval_samples``) is named ``split[:N]``
in the model-index, as ``datasets`` writes such a slice.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub import EvalResult

# Prefixes the Trainer puts on metric names, and the dataset split each one means.
_SPLIT_PREFIXES = {"eval_": "validation", "validation_": "validation", "test_": "test", "predict_": "test"}
_BLEU_NAMES = ("bleu", "sacrebleu")
_SIGNATURE_NAMES = ("bleu_signature", "sacrebleu_signature", "signature")
_PERPLEXITY_NAMES = ("perplexity", "ppl")
# Numbers the Trainer and the scripts report that measure the run, not the model.
_NOT_METRICS = ("_runtime", "_samples_per_second", "_steps_per_second", "total_flos", "epoch", "_first_step",
                "_last_step", "_resumed_from_step", "_blocks", "_samples")


def _split_metric_name(key: str) -> tuple[str | None, str]:
    for prefix, split in _SPLIT_PREFIXES.items():
        if key.startswith(prefix):
            return split, key[len(prefix) :]
    return None, key


def is_metric(key: str) -> bool:
    """Whether the reported number ``key`` measures the model (not a runtime, throughput, step number, count)."""
    return key != "precision" and not key.lower().endswith(_NOT_METRICS)


def parse_metrics(metrics: dict[str, Any]) -> tuple[list[tuple[str | None, str, float]], str | None]:
    """[(split, name, value)] of the numeric metrics (names normalized) and the sacreBLEU signature if given."""
    results, signature = [], None
    steps = (metrics.get("train_loss_first_step"), metrics.get("train_loss_last_step"))
    for key, value in metrics.items():
        split, name = _split_metric_name(key.lower())
        if name in _SIGNATURE_NAMES:
            signature = str(value)
            continue
        if not is_metric(key):  # e.g. the run's precision (in all_results.json): the card lists it with the settings
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"metric {key!r} must be a number (or the sacreBLEU signature string), got {value!r}")
        if name in _BLEU_NAMES:
            name = "sacrebleu"
        elif name in _PERPLEXITY_NAMES:
            name = "perplexity"
        elif key == "train_loss" and None not in steps:
            name = f"train_loss (mean of steps {steps[0]}–{steps[1]})"
        results.append((split, name, float(value)))
    return results, signature


def eval_results(
    results: list[tuple[str | None, str, float]], signature: str | None, dataset: str, is_encoder_decoder: bool
) -> list[EvalResult]:
    """model-index entries: sacreBLEU (with its signature) and perplexity; other metrics stay in the body."""
    task_type, task_name = (
        ("translation", "Translation") if is_encoder_decoder else ("text-generation", "Text Generation")
    )
    # metric -> (display name, rounding, metric_config); sacreBLEU carries its signature.
    known = {"sacrebleu": ("sacreBLEU", 2, signature), "perplexity": ("Perplexity", 3, None)}
    return [
        EvalResult(
            task_type=task_type,
            task_name=task_name,
            dataset_type=dataset,
            dataset_name=dataset,
            dataset_split=split,
            metric_type=name,
            metric_name=known[name][0],
            metric_value=round(value, known[name][1]),
            metric_config=known[name][2],
        )
        for split, name, value in results
        if name in known
    ]
