"""A run's metrics as a model card's ``model-index``: the Trainer's metric names (``eval_bleu``,
``test_perplexity``, ...) to (split, metric) pairs, and those to huggingface_hub ``EvalResult`` entries.

sacreBLEU scores carry their signature in the entry's ``metric_config``; perplexity is rounded to 3 decimals;
metrics of other names stay out of the model-index (the card's body lists them). What the Trainer reports next to
its metrics but is no measurement of the model (runtimes, throughput, FLOs, epochs, step numbers, row counts) is no
metric and is left out; the step numbers ``train_loss_first_step`` / ``train_loss_last_step`` name the steps
``train_loss`` averages. A split scored on its first N of M rows (``--max_eval_samples``) is named ``split[:N]``
in the model-index, as ``datasets`` writes such a slice.

The training scripts save the subset with the split's metrics (``subset_metrics``: ``test_rows_scored`` and
``test_rows_in_split``), so every later card rendered from those files (``tiednorm-card --metrics``, ``tiednorm-push
--metrics``) names the subset as the run's own card did (issue 51: a re-render wrote ``split: test`` for a run scored
on ``test[:100]``). Runtimes (``train_minutes``) are no metric either.
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
_NOT_METRICS = ("_runtime", "_minutes", "_samples_per_second", "_steps_per_second", "total_flos", "epoch",
                "_first_step", "_last_step", "_resumed_from_step", "_blocks", "_samples", "_rows_scored",
                "_rows_in_split")
# The step bookkeeping the scripts save with the training metrics: it names the steps train_loss averages.
_STEP_NUMBERS = ("_first_step", "_last_step", "_resumed_from_step")
_SPLIT_PREFIX = {"validation": "eval", "test": "test"}


def subset_metrics(split: str, subset: tuple[int, int] | None) -> dict[str, int]:
    """What a script saves with ``split``'s metrics when it scored only the first rows: ``{prefix}_rows_scored`` and
    ``{prefix}_rows_in_split`` (``subset``: (rows scored, rows in the file), ``steps.select_first``); {} for a whole
    split."""
    if subset is None or subset[0] >= subset[1]:
        return {}
    prefix = _SPLIT_PREFIX[split]
    return {f"{prefix}_rows_scored": int(subset[0]), f"{prefix}_rows_in_split": int(subset[1])}


def metric_subsets(metrics: dict[str, Any] | None) -> dict[str, tuple[int, int]]:
    """The scored subsets that ``metrics`` (a run's saved metrics) record: ``{split: (rows scored, rows in it)}``."""
    found = {}
    for key, value in (metrics or {}).items():
        split, name = _split_metric_name(key.lower())
        total = (metrics or {}).get(key[: -len("_rows_scored")] + "_rows_in_split")
        if split is not None and name == "rows_scored" and isinstance(value, int) and isinstance(total, int):
            found[split] = (value, total)
    return found


def training_settings(training: dict[str, Any] | None, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """The card's training table from ``training`` (settings, or a run's ``train_results.json``): the step
    bookkeeping (``train_loss_first_step``, ...) is no setting and goes; ``train_loss`` names the steps it averages;
    a ``train_loss`` also among ``metrics`` is listed there, not twice."""
    training = dict(training or {})
    steps = (training.get("train_loss_first_step"), training.get("train_loss_last_step"))
    shown = {}
    for key, value in training.items():
        if key.endswith(_STEP_NUMBERS):
            continue
        if key == "train_loss":
            if metrics and "train_loss" in metrics:
                continue
            if None not in steps:
                key = f"train_loss (mean of steps {steps[0]}–{steps[1]})"
        shown[key] = value
    return shown


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
