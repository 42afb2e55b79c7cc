"""Running the paper grid: each cell is one run of scripts/run_translation.py or scripts/run_clm.py in a subprocess
(--workers at a time), resumed from its last complete checkpoint when a full-budget cell was killed; its row (status,
metrics, device, wall time, embedding norms) is appended to the results JSONL as soon as it finishes. ``run_grid``
runs the chosen grids, then the extra seeds for the best head modes, then writes the report."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .cells import (
    CLM_HEAD_PLAIN,
    HEAD_GRIDS,
    MARIAN,
    METRICS,
    PRIMARY,
    ROOT,
    GridArguments,
    append_row,
    budget_hash,
    grid_budget,
    grid_cells,
    load_rows,
    pending,
)
from .curves import best_point, curve_row, curves_path
from .report import best_variants, report, summarize


def data_dir(args: GridArguments) -> Path:
    path = Path(args.data_dir)
    return path if path.is_absolute() else (ROOT / path).resolve()


def command(args: GridArguments, cell: dict, out: Path) -> list[str]:
    data = data_dir(args)
    if cell["grid"] in ("translation", "translation_head"):
        script = "run_translation.py"
        files = {f"{split}_file": str(data / f"{name}.{{lang}}.gz")
                 for split, name in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr"))}
    else:
        script = "run_clm.py"
        files = {f"{split}_file": str(data / f"{name}.en.gz")
                 for split, name in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr"))}
    # The flags of the budget the cell's key hashes (its grid's own additions included, e.g. clm_head's per-epoch
    # evaluation), less what is not a script flag: the preset's name, the technique table, bf16 (passed below).
    budget = {k: v for k, v in grid_budget(cell["grid"], args).items() if k not in ("preset", "techniques", "bf16")}
    # The full budget saves a checkpoint per epoch, so that a killed cell resumes (run_cell); the others start over.
    saving = {"save_strategy": "epoch", "save_total_limit": 1} if args.budget == "full" else {"save_strategy": "no"}
    flags = {**budget, **files, **cell["flags"], "output_dir": out, "seed": cell["seed"], "bf16": args.bf16(),
             "num_threads": args.threads(), **saving, "dataset_name": "bentrevett/multi30k"}
    argv = [sys.executable, str(ROOT / "scripts" / script)]
    for name, value in flags.items():
        values = value if isinstance(value, list) else [value]  # a list flag (--adaptive_cutoffs) takes nargs
        argv += [f"--{name}", *(str(item).lower() if isinstance(item, bool) else str(item) for item in values)]
    return argv


def device_name() -> str:
    import torch

    from hf_tiednorm.training.precision import cpu_description

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return cpu_description()


def embedding_norms(folder: Path) -> dict:
    """Row norms of the output (tied) embedding of a saved model: summary and a 40-bin histogram; {} when the model
    has no single output matrix (adaptive softmax bands)."""
    import torch
    from safetensors.torch import load_file

    path = folder / "model.safetensors"
    if not path.is_file():
        return {}
    state = load_file(str(path))
    for name in ("lm_head.weight", "model.shared.weight", "model.decoder.embed_tokens.weight",
                 "model.embed_tokens.weight"):
        if name in state:
            norms = torch.linalg.vector_norm(state[name].float(), dim=-1)
            break
    else:
        return {}
    top = float(norms.max())
    quantiles = torch.quantile(norms, torch.tensor([0.05, 0.5, 0.95])).tolist()
    return {"mean": float(norms.mean()), "std": float(norms.std()), "q05": quantiles[0], "median": quantiles[1],
            "q95": quantiles[2], "hist_max": top, "hist_counts": torch.histc(norms, bins=40, min=0.0, max=top).tolist()}


def prepare_cell_dir(out: Path) -> Path | None:
    """The checkpoint a cell killed half-way resumes from (its folder kept); None after wiping a folder without one
    (a fresh start, e.g. smoke/reduced cells, which save none)."""
    from hf_tiednorm.training.run_directory import last_complete_checkpoint

    checkpoint = last_complete_checkpoint(out) if out.is_dir() else None
    if checkpoint is None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    return checkpoint


def repo_relative_command(argv: list[str]) -> str:
    """``argv`` as the command a reader reruns from the checkout: this machine's checkout path and its parent
    (where ``shared/`` lies) become relative (a row must not carry the absolute paths of the machine that ran it)."""
    text = " ".join(argv)
    return text.replace(f"{ROOT}/", "").replace(f"{ROOT.parent}/", "../")


def run_cell(args: GridArguments, cell: dict, device: str) -> dict:
    out = ROOT / args.runs_dir / cell["key"]
    checkpoint = prepare_cell_dir(out)
    argv = command(args, cell, out)
    if checkpoint is not None:
        argv += ["--resume_from_checkpoint", "last"]  # the run's own newest complete checkpoint
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    start = time.monotonic()
    with open(out / "run.log", "a" if checkpoint else "w") as log:
        rc = subprocess.run(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, check=False).returncode
    # wall_minutes: this slice only (a resumed cell's earlier slices ran in earlier commands).
    row = {**cell, "status": "ok" if rc == 0 else f"failed rc={rc}", "wall_minutes": (time.monotonic() - start) / 60,
           "device": device, "num_threads": args.threads(), "precision": "bf16" if args.bf16() else "fp32",
           "resumed_from": None if checkpoint is None else checkpoint.name,
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": repo_relative_command(argv[1:])}
    results = out / "all_results.json"
    if rc == 0 and results.is_file():
        metrics = json.loads(results.read_text())
        row.update({name: metrics[name] for name in METRICS if name in metrics})
        row["embedding_norms"] = embedding_norms(out)
    elif rc == 0:
        row["status"] = "failed: no all_results.json"
    if row["status"] != "ok":
        row["log_tail"] = (out / "run.log").read_text(errors="replace").splitlines()[-15:]
    return row


def run_cells(args: GridArguments, cells: list[dict], results: Path) -> None:
    """Run the pending cells, --workers at a time; each appends its row as soon as it finishes."""
    todo = pending(cells, load_rows(results))
    print(f"{len(cells) - len(todo)} of {len(cells)} cells already done; running {len(todo)} with "
          f"{args.workers} worker(s) × {args.threads()} thread(s)", flush=True)
    device = device_name()
    deadline = math.inf if args.max_minutes is None else time.monotonic() + 60 * args.max_minutes

    def work(cell: dict) -> None:
        if time.monotonic() > deadline:
            print(f"[{time.strftime('%H:%M:%S')}] --max_minutes reached: {cell['key']} left for the next resume",
                  flush=True)
            return
        print(f"[{time.strftime('%H:%M:%S')}] start {cell['key']}", flush=True)
        try:
            row = run_cell(args, cell, device)
        # One cell's broken post-processing must not stop the others; its "failed" row makes it rerun on resume.
        except Exception as error:  # noqa: BLE001
            row = {**cell, "status": f"failed: {type(error).__name__}: {error}"[:500], "wall_minutes": 0.0,
                   "device": device}
        curve = curve_row(row, ROOT / args.runs_dir / cell["key"]) if row["status"] == "ok" else None
        if curve is None and row["status"] == "ok" and grid_budget(cell["grid"], args).get("eval_strategy") == "epoch":
            row["status"] = "failed: no per-epoch evaluation points in trainer_state.json"  # runs again on resume
        append_row(results, row)
        if curve is not None and row["status"] == "ok":  # the per-epoch validation points, in a JSONL of their own
            append_row(curves_path(results), curve)
        shown = {k: round(row[k], 3) for k in ("eval_bleu", "test_bleu", "test_perplexity") if k in row}
        print(f"[{time.strftime('%H:%M:%S')}] {row['status']} {cell['key']} {shown} ({row['wall_minutes']:.1f} min)",
              flush=True)

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(work, todo))  # list(): re-raise what a worker could not record (a failed append)


def extra_seed_variants(args: GridArguments, rows: list[dict]) -> list[str]:
    """The translation variants that get --extra_seeds: baseline, marian and the --best_modes head modes with the
    best mean *validation* BLEU (choosing on test would tune on it), among those of --modes."""
    val = summarize(rows, "translation", "eval_bleu", budget_hash(grid_budget("translation", args)))
    best = best_variants(val, ("baseline", MARIAN), higher_is_better=True, count=args.best_modes)
    return [v for v in ("baseline", MARIAN, *best) if v in args.mode_list()]


def head_extra_seed_variants(args: GridArguments, rows: list[dict], grid: str = "clm_head",
                             curve_rows: list[dict] | None = None) -> list[str]:
    """The variants of a head grid (clm_head, translation_head) that get --extra_seeds: the plain modes (their
    learning curves need the seed spread) and every head option that leads the baseline on its mean *validation*
    metric (perplexity, BLEU) at its best epoch-end point, where ``curve_rows`` has the run's curve (the full LM
    overfits: its final point is 10-40 % above its best, so a final score ranks how fast a head overfits, not how
    good it gets), else at the end."""
    _, val_metric, higher, _ = PRIMARY[grid]
    hash_ = budget_hash(grid_budget(grid, args))
    best = {row["key"]: point[val_metric] for row in curve_rows or [] if row.get("budget_hash") == hash_
            and (point := best_point(row.get("points", []), val_metric, higher)) is not None}
    rows = [{**row, val_metric: best.get(row.get("key"), row.get(val_metric))} for row in rows]
    val = summarize(rows, grid, val_metric, hash_)
    baseline = val.get("baseline", {}).get("mean")
    leaders = [v for v, stats in val.items() if v not in CLM_HEAD_PLAIN and baseline is not None
               and (stats["mean"] > baseline if higher else stats["mean"] < baseline)]
    return [v for v in (*CLM_HEAD_PLAIN, *leaders) if v in args.head_variant_list()]


def run_grid(args: GridArguments) -> None:
    """Run (or resume) the chosen grids, then the extra seeds, then write the report."""
    results = ROOT / args.results
    started = time.monotonic()
    if not args.report_only:
        if not (data_dir(args) / "train.de.gz").is_file():
            raise FileNotFoundError(f"Multi30k not found in --data_dir {data_dir(args)} (train.de.gz etc.)")
        seeds = [int(s) for s in args.seeds.split(",") if s]
        extra = [int(s) for s in args.extra_seeds.split(",") if s]
        first = seeds + extra if args.extra_seeds_all else seeds
        run_cells(args, [cell for grid in args.grid_list() for cell in grid_cells(grid, args, first)], results)
        out_of_time = args.max_minutes is not None and time.monotonic() - started > 60 * args.max_minutes
        if extra and not args.extra_seeds_all and "translation" in args.grid_list() and not out_of_time:
            chosen = extra_seed_variants(args, load_rows(results))
            print(f"extra seeds {extra} for {chosen} (best modes by mean val BLEU)", flush=True)
            run_cells(args, grid_cells("translation", args, extra, chosen), results)
        for grid in HEAD_GRIDS:
            out_of_time = args.max_minutes is not None and time.monotonic() - started > 60 * args.max_minutes
            if extra and not args.extra_seeds_all and grid in args.grid_list() and not out_of_time:
                chosen = head_extra_seed_variants(args, load_rows(results), grid, load_rows(curves_path(results)))
                print(f"{grid}: extra seeds {extra} for {chosen} (plain modes, and head options ahead of baseline "
                      "on val)", flush=True)
                run_cells(args, grid_cells(grid, args, extra, chosen), results)
    report(args)
