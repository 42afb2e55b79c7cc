"""Learning curves and time to quality: *when* does a normalized head pay (issue 25 §1)?

The full-budget grids answer "which head is better at convergence"; a head that reaches the same quality in fewer
steps is a compute saving all the same. A grid whose budget evaluates after every epoch (``clm_head``) leaves its
validation metric per epoch in each run's ``trainer_state.json`` (the Trainer's ``log_history``). The runner keeps
those points, one JSON row per cell, in ``<results stem>_curves.jsonl`` beside the grid's rows; this module reads
them back and asks, per variant and seed, after how many steps the validation metric first reaches the
reference's *final* validation score within a tolerance (perplexity at most 2 % above it, BLEU at most 0.5 below),
and its *best* one (the harder target where a run overfits), then reports mean ± std over seeds and plots mean ± std
per variant.

Minutes are the run's own ``train_runtime`` (evaluations included) scaled by the step fraction: one CPU's time, not
comparable across processors; a resumed cell has no minutes (its runtime covers only the last slice).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from .cells import load_rows

# Tolerances of "reached the reference's final quality" (issue 25): +2 % perplexity, -0.5 BLEU.
PERPLEXITY_TOLERANCE = 0.02
BLEU_TOLERANCE = 0.5


def curves_path(results: Path) -> Path:
    """``results/paper_grid.jsonl`` → ``results/paper_grid_curves.jsonl``."""
    return results.with_name(f"{results.stem}_curves.jsonl")


def curve_points(trainer_state: dict, train_runtime: float | None) -> list[dict]:
    """The evaluation points of one run: step, epoch, the validation metric(s) and, given the run's
    ``train_runtime`` (seconds), the minutes at that step.

    Args:
        trainer_state: a parsed ``trainer_state.json`` (``log_history``, ``global_step``).
        train_runtime: seconds of the whole (unresumed) training, or None.

    Returns:
        One dict per evaluation, in step order: ``step``, ``epoch``, ``eval_loss``, ``eval_perplexity``
        (exp(eval_loss): the grids that keep curves have no loss penalties) and/or ``eval_bleu``, ``minutes``.
    """
    last_step = trainer_state.get("global_step") or 0
    points = []
    for entry in trainer_state.get("log_history", []):
        if "eval_loss" not in entry and "eval_bleu" not in entry:
            continue
        point = {"step": entry["step"], "epoch": entry.get("epoch")}
        if "eval_loss" in entry:
            point["eval_loss"] = entry["eval_loss"]
            point["eval_perplexity"] = math.exp(min(entry["eval_loss"], 50.0))
        if "eval_bleu" in entry:
            point["eval_bleu"] = entry["eval_bleu"]
        if train_runtime and last_step:
            point["minutes"] = train_runtime / 60 * entry["step"] / last_step
        points.append(point)
    return sorted(points, key=lambda p: p["step"])


def curve_row(cell_row: dict, run_dir: Path) -> dict | None:
    """The curve row of a finished cell (its grid row plus ``points``), or None when the run logged no evaluation."""
    state_path = run_dir / "trainer_state.json"
    if not state_path.is_file():
        return None
    resumed = cell_row.get("resumed_from") is not None
    points = curve_points(json.loads(state_path.read_text()), None if resumed else cell_row.get("train_runtime"))
    if not points:
        return None
    keep = ("key", "grid", "variant", "seed", "budget", "budget_hash", "device", "precision", "num_threads",
            "resumed_from", "finished")
    return {**{k: cell_row.get(k) for k in keep}, "points": points}


def _mean_std(values: list[float]) -> dict:
    """Mean and sample std, None where undefined (JSON has no NaN)."""
    return {"mean": statistics.fmean(values) if values else None,
            "std": statistics.stdev(values) if len(values) > 1 else None, "n": len(values)}


def first_reaching(points: list[dict], metric: str, target: float, higher_is_better: bool) -> dict | None:
    """The first point whose ``metric`` is at least as good as ``target``; None if none is."""
    for point in points:
        value = point.get(metric)
        if value is not None and (value >= target if higher_is_better else value <= target):
            return point
    return None


def best_point(points: list[dict], metric: str, higher_is_better: bool) -> dict | None:
    """The run's best point by ``metric`` (a run that overfits ends above its best: the full-budget LM does)."""
    scored = [p for p in points if p.get(metric) is not None]
    return (max if higher_is_better else min)(scored, key=lambda p: p[metric]) if scored else None


def time_to_quality(curve_rows: list[dict], reference: str, metric: str, higher_is_better: bool) -> dict:
    """Steps (and minutes) of each variant to reach the reference's final validation score within the tolerance.

    Args:
        curve_rows: rows of one grid and budget (``variant``, ``seed``, ``points``).
        reference: the variant whose final score (mean over its seeds) sets the target.
        metric: ``eval_perplexity`` or ``eval_bleu``.
        higher_is_better: True for BLEU.

    Returns:
        {"target", "reference_final", "variants": {variant: {"steps", "minutes" (mean/std/n over the seeds that
        reached it), "reached", "runs", "final" (mean/std/n of the last point)}}}; empty without reference curves.
    """
    reference_rows = [row for row in curve_rows if row["variant"] == reference]
    if not reference_rows:
        return {}
    def within_tolerance(value: float) -> float:
        return value - BLEU_TOLERANCE if higher_is_better else value * (1 + PERPLEXITY_TOLERANCE)

    reference_final = statistics.fmean(row["points"][-1][metric] for row in reference_rows)
    target = within_tolerance(reference_final)
    # A run that overfits (the full-budget LM) ends far from its best point, which makes its final score an easy
    # target; the second target is the reference's best point (mean over its seeds), within the same tolerance.
    reference_best = statistics.fmean(best_point(row["points"], metric, higher_is_better)[metric]
                                      for row in reference_rows)
    best_target = within_tolerance(reference_best)
    variants: dict[str, dict] = {}
    for row in curve_rows:
        entry = variants.setdefault(row["variant"], {"steps": [], "minutes": [], "runs": 0, "finals": [], "bests": [],
                                                     "best_steps": [], "steps_to_best": []})
        entry["runs"] += 1
        entry["finals"].append(row["points"][-1][metric])
        best = best_point(row["points"], metric, higher_is_better)
        entry["bests"].append(best[metric])
        entry["best_steps"].append(best["step"])
        point = first_reaching(row["points"], metric, target, higher_is_better)
        if point is not None:
            entry["steps"].append(point["step"])
            if point.get("minutes") is not None:
                entry["minutes"].append(point["minutes"])
        point = first_reaching(row["points"], metric, best_target, higher_is_better)
        if point is not None:
            entry["steps_to_best"].append(point["step"])
    return {
        "metric": metric,
        "reference": reference,
        "reference_final": reference_final,
        "target": target,
        "reference_best": reference_best,
        "best_target": best_target,
        "variants": {
            variant: {"steps": _mean_std(e["steps"]), "minutes": _mean_std(e["minutes"]),
                      "reached": len(e["steps"]), "runs": e["runs"], "final": _mean_std(e["finals"]),
                      "best": _mean_std(e["bests"]), "best_step": _mean_std(e["best_steps"]),
                      "steps_to_best_target": _mean_std(e["steps_to_best"]),
                      "reached_best_target": len(e["steps_to_best"])}
            for variant, e in variants.items()
        },
    }


def _fmt(stats: dict, digits: int) -> str:
    if stats["mean"] is None:
        return "–"
    spread = "–" if stats["std"] is None else f"{stats['std']:.{digits}f}"
    return f"{stats['mean']:.{digits}f} ± {spread}"


def time_to_quality_markdown(result: dict, note: str | None = None) -> list[str]:
    if not result:
        return []
    name = "perplexity" if result["metric"] == "eval_perplexity" else "BLEU"
    bound = (f"≤ {result['target']:.2f} (+{PERPLEXITY_TOLERANCE:.0%})" if name == "perplexity"
             else f"≥ {result['target']:.2f} (−{BLEU_TOLERANCE})")
    best_bound = (f"≤ {result['best_target']:.2f}" if name == "perplexity" else f"≥ {result['best_target']:.2f}")
    lines = [f"### Time to quality: first epoch-end evaluation with val {name} {bound} of {result['reference']}'s "
             f"final {result['reference_final']:.2f}", "", *([note, ""] if note else []),
             f"The last column asks the same of {result['reference']}'s *best* point ({result['reference_best']:.2f}, "
             f"target {best_bound}), the harder target where a run overfits.", "",
             f"| variant | reached (runs) | steps (mean ± std) | minutes (mean ± std, one CPU) | final val {name} | "
             f"best val {name} (at step) | steps to the best's target (reached) |",
             "|---|---|---|---|---|---|---|"]
    for variant, stats in result["variants"].items():
        lines.append(f"| {variant} | {stats['reached']} ({stats['runs']}) | {_fmt(stats['steps'], 0)} | "
                     f"{_fmt(stats['minutes'], 1)} | {_fmt(stats['final'], 2)} | {_fmt(stats['best'], 2)} "
                     f"({_fmt(stats['best_step'], 0)}) | {_fmt(stats['steps_to_best_target'], 0)} "
                     f"({stats['reached_best_target']}) |")
    return lines + [""]


def plot_curves(curve_rows: list[dict], metric: str, target: float | None, path: Path) -> None:
    """Mean ± std band of ``metric`` against steps, one line per variant (the points of its seeds at equal steps):
    the whole run on the left, a zoom on the best points on the right (where the variants differ by a few percent)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_variant: dict[str, dict[int, list[float]]] = {}
    for row in curve_rows:
        for point in row["points"]:
            if point.get(metric) is not None:
                by_variant.setdefault(row["variant"], {}).setdefault(point["step"], []).append(point[metric])
    higher = metric == "eval_bleu"
    colors = plt.get_cmap("tab20").colors
    figure, axes = plt.subplots(1, 2, figsize=(12, 4.8))
    best_values = []
    for index, (variant, by_step) in enumerate(by_variant.items()):
        steps = sorted(by_step)
        stats = [_mean_std(by_step[s]) for s in steps]
        means = [s["mean"] for s in stats]
        spread = [s["std"] or 0.0 for s in stats]
        best_values.append(max(means) if higher else min(means))
        n = max(s["n"] for s in stats)
        style = {"color": colors[index % len(colors)], "linestyle": ("-", "--", ":")[index // len(colors) % 3]}
        for axis in axes:
            axis.plot(steps, means, marker="o", markersize=3, label=f"{variant} (n={n})", **style)
            axis.fill_between(steps, [m - d for m, d in zip(means, spread)], [m + d for m, d in zip(means, spread)],
                              alpha=0.15, color=style["color"])
    for axis in axes:
        if target is not None:
            axis.axhline(target, color="grey", linestyle="--", linewidth=1, label="target")
        axis.set_xlabel("optimizer step")
        axis.set_ylabel(f"validation {metric.removeprefix('eval_')} (mean ± std over seeds)")
    if metric == "eval_perplexity":
        axes[0].set_yscale("log")
    if best_values:  # the zoom: from the best variant's best point to a band around the target
        best = max(best_values) if higher else min(best_values)
        reference = target if target is not None else best
        low, high = (reference - 0.25 * abs(reference), best + 0.02 * abs(best)) if higher else \
            (best - 0.02 * best, max(reference, best) * 1.25)
        axes[1].set_ylim(low, high)
    axes[0].set_title("whole run")
    axes[1].set_title("near the best points")
    axes[1].legend(fontsize=7, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def curves_report(results: Path, grid: str, budget_hash_: str, metric: str, higher_is_better: bool, reference: str,
                  png: Path, note: str | None = None) -> tuple[dict, list[str]]:
    """Time to quality (JSON-able) and its Markdown for one grid and budget (``note``: a line under its heading), and
    the PNG of its curves."""
    rows = [row for row in load_rows(curves_path(results))
            if row.get("grid") == grid and row.get("budget_hash") == budget_hash_ and row.get("points")]
    if not rows:
        return {}, []
    result = time_to_quality(rows, reference, metric, higher_is_better)
    plot_curves(rows, metric, result.get("target"), png)
    lines = time_to_quality_markdown(result, note) + [f"Learning curves: `{png.name}`.", ""]
    return result, lines
