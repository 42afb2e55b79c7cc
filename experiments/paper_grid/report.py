"""The paper grid's statistics and report: mean ± std over seeds, verdicts against the reference (a difference is
only called a win beyond the seed spread), the bf16-vs-fp32 parity of the same cells, wall times by run kind, and the
report itself (JSON + Markdown + embedding-norm histograms PNG)."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace
from pathlib import Path

from .cells import (
    GRIDS,
    MARIAN,
    MODES,
    PRIMARY,
    ROOT,
    TRANSLATION_VARIANTS,
    GridArguments,
    budget_hash,
    grid_budget,
    grid_cells,
    load_rows,
)
from .curves import curves_report


def mean_std(values: list[float]) -> dict:
    return {
        "mean": statistics.fmean(values) if values else math.nan,
        "std": statistics.stdev(values) if len(values) > 1 else math.nan,
        "n": len(values),
    }


def summarize(rows: list[dict], grid: str, metric: str, budget_hash_: str) -> dict[str, dict]:
    """{variant: mean/std/n of metric} over the ok rows of one grid and budget."""
    groups: dict[str, list[float]] = {}
    for row in rows:
        if (row.get("status") == "ok" and row.get("grid") == grid and row.get("budget_hash") == budget_hash_
                and row.get(metric) is not None):
            groups.setdefault(row["variant"], []).append(float(row[metric]))
    return {variant: mean_std(values) for variant, values in groups.items()}


def verdict(summary: dict[str, dict], reference: str, higher_is_better: bool) -> dict[str, dict]:
    """Per variant: difference of means to the reference, whether it is an improvement, and whether it exceeds the
    seed spread, i.e. |diff| > combined std √(s_ref² + s_variant²) (the spread of the difference of two single
    runs); None when either side has a single seed."""
    ref = summary.get(reference)
    if ref is None:
        return {}
    out = {}
    for variant, stats in summary.items():
        if variant == reference:
            continue
        diff = stats["mean"] - ref["mean"]
        spread = math.sqrt(stats["std"] ** 2 + ref["std"] ** 2)
        out[variant] = {
            "diff": diff,
            "better": diff > 0 if higher_is_better else diff < 0,
            "combined_std": None if math.isnan(spread) else spread,
            "exceeds_seed_spread": None if math.isnan(spread) else abs(diff) > spread,
        }
    return out


def verdict_sentences(verdicts: dict[str, dict], reference: str, metric: str) -> list[str]:
    """Plain-language lines for the report. A difference within the seed spread is called level, not a win: the
    sign of a difference smaller than the spread of two single runs says nothing."""
    lines = []
    for variant, v in verdicts.items():
        if round(v["diff"], 2) == 0:  # no difference at the precision the line prints
            word = "is level with"
            spread = "no difference"
        elif v["exceeds_seed_spread"] is None:
            word = "is ahead of" if v["better"] else "is behind"
            spread = "seed spread unknown (one seed on a side)"
        elif v["exceeds_seed_spread"]:
            word = "beats" if v["better"] else "is worse than"
            spread = f"beyond the seed spread (combined std {v['combined_std']:.2f})"
        else:
            word = "is level with"
            spread = f"within the seed spread (combined std {v['combined_std']:.2f})"
        lines.append(f"- {variant} {word} {reference}: {metric} {v['diff']:+.2f}, {spread}")
    return lines


def best_variants(summary: dict[str, dict], exclude: tuple[str, ...], higher_is_better: bool, count: int) -> list[str]:
    """Up to ``count`` variants not in ``exclude`` with the best means, best first."""
    candidates = [v for v in summary if v not in exclude and not math.isnan(summary[v]["mean"])]
    sign = 1 if higher_is_better else -1
    return sorted(candidates, key=lambda v: -sign * summary[v]["mean"])[:count]


def head_modes_by_val_bleu(val: dict[str, dict]) -> list[str]:
    """The head modes (baseline included, the HF contender not) by mean val BLEU, best first: the first is the main
    job's head_mode (scripts/configs/multi30k_de_en.yaml)."""
    return best_variants({v: s for v, s in val.items() if v in MODES}, (), True, len(MODES))


def report(args: GridArguments) -> dict:
    """Tables (mean ± std, n) and verdicts per grid for --budget, written as JSON + Markdown, plus the PNG."""
    rows = load_rows(ROOT / args.results)
    summary: dict = {"budget": args.budget, "results": args.results, "grids": {}}
    markdown = [f"# The paper's comparison, budget `{args.budget}`", ""]
    for grid in GRIDS:
        budget = grid_budget(grid, args)
        metric, val_metric, higher, reference = PRIMARY[grid]
        test = summarize(rows, grid, metric, budget_hash(budget))
        if not test:
            continue
        order = [cell["variant"] for cell in grid_cells(grid, args, [0])]  # the grid's own order, then the rest
        test = {v: test[v] for v in sorted(test, key=lambda v: order.index(v) if v in order else len(order))}
        val = summarize(rows, grid, val_metric, budget_hash(budget))
        verdicts = verdict(test, reference, higher)
        ok = [r for r in rows if r.get("grid") == grid and r.get("budget_hash") == budget_hash(budget)
              and r.get("status") == "ok"]
        devices = sorted({r.get("device", "?") for r in ok})
        precisions = sorted({r.get("precision", "fp32") for r in ok})  # rows before the field were all fp32
        minutes = wall_minutes_by_run_kind(ok, devices)
        # The HF contender is a second reference where the grid has it.
        references = [reference] + ([MARIAN] if MARIAN in test and reference != MARIAN else [])
        verdicts_by_ref = {ref: verdict(test, ref, higher) for ref in references}
        val_verdicts = verdict(val, reference, higher)
        summary["grids"][grid] = {"budget": budget, "budget_hash": budget_hash(budget), "metric": metric,
                                  "test": test, "val": val, "verdict": verdicts, "devices": devices,
                                  "precisions": precisions, "wall_minutes": minutes,
                                  "verdict_by_reference": verdicts_by_ref, "val_verdict": val_verdicts}
        name = "BLEU" if higher else "perplexity"
        markdown += [f"## {grid} ({'higher' if higher else 'lower'} is better; devices: {device_legend(devices)}; "
                     f"precision: {', '.join(precisions)})", "",
                     f"| variant | val {name} (mean ± std, n) | test {name} (mean ± std, n) | Δ val vs {reference} | "
                     + " | ".join(f"Δ test vs {ref}" for ref in references)
                     + f" | wall min (mean of unresumed cells, by threads per cell{device_note(devices)}) |",
                     "|---|---|---|---|" + "---|" * len(references) + "---|"]
        for variant, t in test.items():
            v = val.get(variant, mean_std([]))
            deltas = [val_verdicts.get(variant, {}).get("diff")]
            deltas += [verdicts_by_ref[ref].get(variant, {}).get("diff") for ref in references]
            cells = " | ".join("" if d is None else f"{d:+.2f}" for d in deltas)
            wall = "; ".join(f"{stats['mean']:.1f} ({kind})" for kind, stats in minutes.get(variant, {}).items()) or "–"
            markdown.append(f"| {variant} | {_fmt(v)} | {_fmt(t)} | {cells} | {wall} |")
        markdown += [""]
        for ref in references:
            markdown += verdict_sentences(verdicts_by_ref[ref], ref, f"test {name}")
        markdown += [""]
        if grid == "translation":
            ranking = head_modes_by_val_bleu(val)
            summary["grids"][grid]["val_ranking"] = ranking
            markdown += ["Head modes by mean val BLEU (the main job's `head_mode` is the first): "
                         + " > ".join(f"{v} {val[v]['mean']:.2f} ({val[v]['n']})" for v in ranking), ""]
            parity = precision_parity(rows, args, test)
            summary["grids"][grid]["precision_parity"] = parity
            markdown += parity_markdown(parity, devices)
        png = args.report_path().with_name(f"{args.report_path().stem}_{grid}_curves.png")
        beams = budget.get("generation_num_beams_during_training")  # the curve decodes otherwise than the table
        note = (f"The epoch-end points decode with {beams} beam(s) (1: greedy), the table above with "
                f"{budget['generation_num_beams']}." if beams else None)
        quality, lines = curves_report(ROOT / args.results, grid, budget_hash(budget), val_metric, higher, reference,
                                       png, note)
        if quality:
            summary["grids"][grid]["time_to_quality"] = quality
            markdown += lines
    summary["markdown"] = "\n".join(markdown)
    json_path = args.report_path()
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(summary, indent=1))
    json_path.with_suffix(".md").write_text(summary["markdown"] + "\n")
    translation_hash = budget_hash(grid_budget("translation", args))
    plot_histograms([r for r in rows if r.get("budget_hash") == translation_hash], json_path.with_suffix(".png"))
    print(summary["markdown"], flush=True)
    return summary


def precision_parity(rows: list[dict], args: GridArguments, test: dict[str, dict]) -> list[dict]:
    """bf16 vs fp32 of the same translation cells: each (variant, seed) with an ok row in the report's precision and
    in the other one (same budget otherwise), next to the variant's seed std of test BLEU in the report's precision,
    the yardstick for "parity"."""
    precisions = ("bf16", "fp32") if args.bf16() else ("fp32", "bf16")
    hashes = [budget_hash(grid_budget("translation", replace(args, precision=p))) for p in precisions]
    cells = [{(r["variant"], r["seed"]): r for r in rows if r.get("status") == "ok" and r.get("grid") == "translation"
              and r.get("budget_hash") == h} for h in hashes]
    pairs = []
    for variant, seed in sorted(cells[0].keys() & cells[1].keys()):
        runs = [c[(variant, seed)] for c in cells]
        metrics = ("eval_bleu", "test_bleu", "wall_minutes", "num_threads", "device", "resumed_from")
        pairs.append({"variant": variant, "seed": seed, "precisions": list(precisions),
                      **{m: [r.get(m) for r in runs] for m in metrics},
                      "test_bleu_seed_std": test.get(variant, mean_std([]))["std"]})
    return pairs


def parity_markdown(pairs: list[dict], devices: list[str]) -> list[str]:
    if not pairs:
        return []
    first, second = pairs[0]["precisions"]
    lines = [f"### {first} vs {second}, same cells", "",
             f"| variant | seed | val BLEU {first} / {second} | test BLEU {first} / {second} | Δ test ({second} − "
             f"{first}) | test std over seeds ({first}) | wall min {first} / {second} "
             f"(threads{device_note(devices)}) |",
             "|---|---|---|---|---|---|---|"]
    for p in pairs:
        val, test = p["eval_bleu"], p["test_bleu"]
        std = "–" if math.isnan(p["test_bleu_seed_std"]) else f"{p['test_bleu_seed_std']:.2f}"
        walls = [f"{minutes:.1f} ({run_kind(threads, device, devices)}{', a resumed slice' if resumed else ''})"
                 for minutes, threads, device, resumed
                 in zip(p["wall_minutes"], p["num_threads"], p["device"], p["resumed_from"], strict=True)]
        lines.append(f"| {p['variant']} | {p['seed']} | {val[0]:.2f} / {val[1]:.2f} | {test[0]:.2f} / {test[1]:.2f} "
                     f"| {test[1] - test[0]:+.2f} | {std} | {' / '.join(walls)} |")
    return lines + [""]


def device_legend(devices: list[str]) -> str:
    """The report's devices, numbered [1], [2], ... when there are several (wall times then name theirs)."""
    return devices[0] if len(devices) == 1 else ", ".join(f"[{i}] {d}" for i, d in enumerate(devices, 1))


def device_note(devices: list[str]) -> str:
    return ", device" if len(devices) > 1 else ""


def run_kind(threads, device: str | None, devices: list[str]) -> str:
    """A cell's threads ("2 thr"), and its device ("2 thr, [1]") when the report has several: wall times compare
    only on one processor."""
    label = f"{threads} thr"
    if device is not None and device not in devices:  # a cell from outside the report's rows (the other precision)
        label += f", {device}"
    elif len(devices) > 1:
        label += f", [{devices.index(device) + 1}]"
    return label


def wall_minutes_by_run_kind(rows: list[dict], devices: list[str]) -> dict[str, dict[str, dict]]:
    """{variant: {run_kind: mean/std/n of wall minutes}} over the cells that ran whole in one command (a resumed
    cell's row holds its last slice only). Split by threads per cell, because two 1-thread cells side by side on a
    2-core machine each take ~1.5x as long as one 2-thread cell alone, and by device where the rows have several."""
    groups: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        if not row.get("resumed_from") and row.get("wall_minutes") is not None:
            kind = run_kind(row.get("num_threads", "?"), row.get("device"), devices)
            groups.setdefault(row["variant"], {}).setdefault(kind, []).append(float(row["wall_minutes"]))
    def order(kind: str) -> tuple[int, str]:  # most threads first, then by device
        threads = kind.split()[0]
        return -int(threads) if threads.isdigit() else 0, kind

    return {variant: {kind: mean_std(by_kind[kind]) for kind in sorted(by_kind, key=order)}
            for variant, by_kind in groups.items()}


def _fmt(stats: dict) -> str:
    std = "–" if math.isnan(stats["std"]) else f"{stats['std']:.2f}"
    return f"{stats['mean']:.2f} ± {std} ({stats['n']})"


def plot_histograms(rows: list[dict], path: Path) -> None:
    """One embedding-norm histogram per translation mode (its lowest seed)."""
    hists = {}
    for row in sorted(rows, key=lambda r: r["seed"]):
        if row.get("status") == "ok" and row.get("grid") == "translation" and row.get("embedding_norms"):
            hists.setdefault(row["variant"], row["embedding_norms"])
    if not hists:
        return
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    modes = [m for m in TRANSLATION_VARIANTS if m in hists]
    figure, axes = plt.subplots(1, len(modes), figsize=(3.2 * len(modes), 2.8), squeeze=False)
    for axis, mode in zip(axes[0], modes):
        h = hists[mode]
        width = h["hist_max"] / len(h["hist_counts"])
        axis.bar([width * (i + 0.5) for i in range(len(h["hist_counts"]))], h["hist_counts"], width=width)
        axis.set_title(f"{mode} (median {h['median']:.2f})", fontsize=9)
        axis.set_xlabel("row norm ‖w_i‖")
    axes[0][0].set_ylabel("tokens")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
