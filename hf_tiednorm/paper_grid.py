"""The paper's comparison grid: its cells, budgets (scripts/configs/paper_grid_*.yaml and the main-job recipe), cell
keys (a hash of the budget), the JSONL of finished cells (read, append, what is pending), running the cells, and the
statistics, verdicts and report. scripts/reproduce_paper.py is its command line (see its docstring for the grids).

Every cell is one run of scripts/run_translation.py or scripts/run_clm.py in a subprocess; its result is appended as
one JSON line to the results file. A cell whose key (grid, variant, seed and a hash of the grid's budget) already has an
"ok" row is skipped, so rerunning the same command resumes the grid; changing the budget starts new cells.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
MODES = ("baseline", "l2", "square", "distance", "cosine")
# The HF contender of the translation grid: transformers' MarianMTModel (run_translation.py --model_family marian).
MARIAN = "marian"
TRANSLATION_VARIANTS = (*MODES, MARIAN)
PRECISIONS = ("auto", "bf16", "fp32")
CLM_MODES = ("baseline", "cosine", "l2")
CLM_VARIANTS = tuple(f"{mode}-{tie}" for tie in ("tied", "untied") for mode in CLM_MODES)
GRIDS = ("translation", "clm", "techniques")
BUDGETS = ("smoke", "reduced", "full")
# The full translation budget is the README main-job recipe, read from its config so that the two cannot drift.
CONFIGS = ROOT / "scripts" / "configs"
MAIN_JOB_CONFIG = CONFIGS / "multi30k_de_en.yaml"
# Config keys that are per cell or per machine, not part of the budget.
PER_CELL_KEYS = ("output_dir", "head_mode", "seed", "num_threads", "dataset_name", "save_strategy", "save_total_limit")
# What the grid reads from a finished run's all_results.json.
METRICS = ("eval_bleu", "test_bleu", "eval_gen_len", "test_gen_len", "eval_loss", "test_loss", "eval_perplexity",
           "test_perplexity", "train_loss", "train_runtime")
# Per grid: the metric reported (test split), its validation twin (which chooses), whether higher is better, and the
# reference group.
PRIMARY = {
    "translation": ("test_bleu", "eval_bleu", True, "baseline"),
    "clm": ("test_perplexity", "eval_perplexity", False, "baseline-tied"),
    "techniques": ("test_perplexity", "eval_perplexity", False, "baseline"),
}


@dataclass
class GridArguments:
    """The command-line arguments of scripts/reproduce_paper.py: which grids, budget, seeds and workers."""

    grids: str = field(default=",".join(GRIDS), metadata={"help": f"grids to run, comma-separated, from {GRIDS}"})
    budget: str = field(
        default="reduced",
        metadata={
            "help": f"one of {BUDGETS}, shared by every cell: smoke (seconds), reduced (2-core CPU), full (README "
            "recipe)"
        },
    )
    data_dir: str = field(
        default="../shared/data/multi30k",
        metadata={"help": "Multi30k folder with train/val/test_2016_flickr.{de,en}.gz; relative to the repo root"},
    )
    results: str = field(
        default="results/paper_grid.jsonl", metadata={"help": "JSONL of finished cells (one row a cell, appended)"}
    )
    runs_dir: str = field(
        default="runs/paper",
        metadata={
            "help": "one output folder per cell (gitignored); a half-done cell resumes from its last complete "
            "checkpoint (full budget) or starts over"
        },
    )
    modes: str = field(
        default=",".join(TRANSLATION_VARIANTS),
        metadata={"help": f"translation variants, comma-separated, from {TRANSLATION_VARIANTS}"},
    )
    clm_variants: str = field(
        default=",".join(CLM_VARIANTS),
        metadata={"help": f"causal-LM variants, comma-separated, from {CLM_VARIANTS}"},
    )
    seeds: str = field(default="0", metadata={"help": "seeds run for every cell of every chosen grid"})
    extra_seeds: str = field(
        default="1,2",
        metadata={
            "help": "further translation seeds for baseline, marian and the --best_modes best head modes (by mean "
            "val BLEU)"
        },
    )
    best_modes: int = field(default=2, metadata={"help": "head modes (besides baseline) given --extra_seeds"})
    precision: str = field(
        default="auto",
        metadata={"help": f"one of {PRECISIONS}; auto: bf16 autocast for the full budget, fp32 for smoke/reduced"},
    )
    extra_seeds_all: bool = field(
        default=False,
        metadata={"help": "run --extra_seeds for every cell at once (no wait for the best modes; suits --workers)"},
    )
    workers: int = field(default=1, metadata={"help": "cells run at the same time (each a subprocess)"})
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads per cell; None: the machine's cores divided by --workers"}
    )
    # Fits the grid into commands of limited length, e.g. 10-minute calls on a borrowed GPU machine.
    max_minutes: float | None = field(
        default=None,
        metadata={
            "help": "start no new cell after this many minutes (running ones finish, the rest wait for the next "
            "resume); None: no limit"
        },
    )
    # σ of the weight-norm initialization ‖w_k‖ = σ·log(max(c_k, 2)). With the full budget's 8k BPE vocabulary on
    # Multi30k English the mean of log(max(c_k, 2)) is 2.26, so σ = 0.14 keeps the mean initial row norm at the
    # default init's 0.02·√256 = 0.32: the input side sees embeddings of the usual scale, only their spread now
    # follows frequency (rare tokens 0.10, "a" with 3.2·10⁴ occurrences 1.45).
    wn_init_sigma: float = field(
        default=0.14, metadata={"help": "σ of the weight-norm initialization ‖w_k‖ = σ·log(max(c_k, 2))"}
    )
    embedding_init_std: float | None = field(
        default=None,
        metadata={
            "help": "std of the token embeddings of every translation cell, ours and marian alike (the paper's fairseq "
            "init: d**-0.5 = 0.0625 at d = 256; square mode needs it); None: HF's 0.02. A recipe choice: pick it on "
            "val BLEU. Part of the budget (other cells)."
        },
    )
    report_only: bool = field(
        default=False, metadata={"help": "only rebuild the report (tables, verdicts, PNG) from --results for --budget"}
    )
    report_json: str | None = field(
        default=None,
        metadata={
            "help": "summary JSON of the report; its Markdown and PNG are written next to it (same stem). None: "
            "results/paper_summary_<budget>.json (_<precision> appended when --precision is not auto), so that a run "
            "of one budget never overwrites another's report"
        },
    )

    def __post_init__(self):
        if self.budget not in BUDGETS:
            raise ValueError(f"--budget must be one of {BUDGETS}, got {self.budget!r}")
        unknown = set(self.grid_list()) - set(GRIDS)
        if unknown:
            raise ValueError(f"--grids: unknown {sorted(unknown)}; choose from {GRIDS}")
        unknown = set(self.mode_list()) - set(TRANSLATION_VARIANTS)
        if unknown:
            raise ValueError(f"--modes: unknown {sorted(unknown)}; choose from {TRANSLATION_VARIANTS}")
        unknown = set(self.clm_variant_list()) - set(CLM_VARIANTS)
        if unknown:
            raise ValueError(f"--clm_variants: unknown {sorted(unknown)}; choose from {CLM_VARIANTS}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"--precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.workers < 1:
            raise ValueError(f"--workers must be >= 1, got {self.workers}")

    def grid_list(self) -> list[str]:
        return [g for g in self.grids.split(",") if g]

    def mode_list(self) -> list[str]:
        return [m for m in self.modes.split(",") if m]

    def clm_variant_list(self) -> list[str]:
        return [v for v in self.clm_variants.split(",") if v]

    def threads(self) -> int:
        return self.num_threads or max(1, (os.cpu_count() or 1) // self.workers)

    def report_path(self) -> Path:
        if self.report_json is not None:
            return ROOT / self.report_json
        precision = "" if self.precision == "auto" else f"_{self.precision}"
        return ROOT / "results" / f"paper_summary_{self.budget}{precision}.json"

    def bf16(self) -> bool:
        """Whether the cells train under bf16 autocast (passed to every cell as --bf16 true/false)."""
        return self.precision == "bf16" or (self.precision == "auto" and self.budget == "full")


# ---------------------------------------------------------------- budgets
def budget_config(kind: str, name: str) -> Path:
    """The YAML file of one budget preset: ``kind`` "translation" (run_translation.py flags) or "clm" (run_clm.py
    flags, shared by the clm and techniques grids); the full translation budget is the main-job recipe."""
    if kind == "translation" and name == "full":
        return MAIN_JOB_CONFIG
    return CONFIGS / f"paper_grid_{kind}_{name}.yaml"


def load_budget(kind: str, name: str) -> dict:
    """The flags of one budget preset, in the file's order, without the per-cell and per-machine keys."""
    config = yaml.safe_load(budget_config(kind, name).read_text())
    return {k: v for k, v in config.items() if k not in PER_CELL_KEYS}


def translation_budget(name: str) -> dict:
    """run_translation.py flags shared by every translation cell."""
    return load_budget("translation", name)


def clm_budget(name: str) -> dict:
    """run_clm.py flags shared by every causal-LM cell (clm and techniques grids)."""
    return load_budget("clm", name)


def technique_flags(vocab_size: int, wn_init_sigma: float) -> dict[str, dict]:
    """run_clm.py flags of each technique on top of the tied baseline LM (papers' hyper-parameters)."""
    # Adaptive bands: the most frequent quarter of the vocabulary at full width, the next half at d/4, the rest
    # at d/16 (8k vocabulary: 2000 6000; Baevski & Auli's k = 4 shrink factor).
    cutoffs = [vocab_size // 4, 3 * vocab_size // 4]
    adaptive = {"adaptive_cutoffs": cutoffs, "adaptive_div_value": 4.0, "adaptive_tie_projections": True}
    return {
        "baseline": {"head_mode": "baseline"},
        "projection_reg": {"head_mode": "baseline", "projection_regularization": 0.15},
        "wn_init": {"head_mode": "baseline", "weight_norm_init_sigma": wn_init_sigma},
        "wn_reg": {"head_mode": "baseline", "weight_norm_regularization": 1e-3, "weight_norm_target": 2.0},
        "adaptive": {"head_mode": "baseline", **adaptive},
        "adaptive_cosine": {"head_mode": "cosine", **adaptive},
    }


def translation_recipe(args: GridArguments) -> dict:
    """Recipe flags of every translation cell that the grid's arguments choose (entering the budget only when set)."""
    return {} if args.embedding_init_std is None else {"embedding_init_std": args.embedding_init_std}


def grid_budget(grid: str, args: GridArguments) -> dict:
    """Everything that must be equal across the cells of one grid (hashed into the cell keys). bf16 enters only when
    on, so that the fp32 budgets keep the hashes of the rows written before precision was a choice (all fp32)."""
    precision = {"bf16": True} if args.bf16() else {}
    if grid == "translation":
        return {"preset": args.budget, **translation_budget(args.budget), **translation_recipe(args), **precision}
    budget = {"preset": args.budget, **clm_budget(args.budget), **precision}
    if grid == "techniques":
        budget["techniques"] = technique_flags(budget["vocab_size"], args.wn_init_sigma)
    return budget


# ---------------------------------------------------------------- pure logic (tests/test_reproduce_paper.py)
def budget_hash(budget: dict) -> str:
    return hashlib.sha1(json.dumps(_hash_form(budget), sort_keys=True).encode()).hexdigest()[:10]


def _hash_form(value):
    """``value`` with every list of ints written as the comma-separated string the flags once took: the first
    techniques rows were keyed when ``--adaptive_cutoffs`` was the string "1000,3000", and the same cells must keep
    their keys now that it is a list."""
    if isinstance(value, dict):
        return {key: _hash_form(item) for key, item in value.items()}
    if isinstance(value, list) and value and all(isinstance(item, int) for item in value):
        return ",".join(map(str, value))
    return value


def cell_key(grid: str, variant: str, seed: int, budget: dict) -> str:
    return f"{grid}-{variant}-s{seed}-{budget_hash(budget)}"


def make_cell(grid: str, variant: str, seed: int, budget: dict, flags: dict) -> dict:
    """One grid cell: ``variant`` names its group in the report; ``flags`` are its run-specific script flags."""
    return {"key": cell_key(grid, variant, seed, budget), "grid": grid, "variant": variant, "seed": seed,
            "budget": budget["preset"], "budget_hash": budget_hash(budget), "flags": flags}


def load_rows(path: Path) -> list[dict]:
    """Rows of the JSONL; a truncated line (a run killed mid-write) is ignored."""
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


_APPEND_LOCK = threading.Lock()


def append_row(path: Path, row: dict) -> None:
    """Append one row as one write of one line (O_APPEND), under a lock; if the file ends in a truncated line, the
    row starts on a fresh line so that it is not glued onto the broken one."""
    with _APPEND_LOCK:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            size = os.fstat(fd).st_size
            broken = size > 0 and Path(path).read_bytes()[-1:] != b"\n"
            os.write(fd, (("\n" if broken else "") + json.dumps(row) + "\n").encode())
        finally:
            os.close(fd)


def pending(cells: list[dict], rows: list[dict]) -> list[dict]:
    """Cells without an "ok" row (failed cells run again)."""
    done = {row.get("key") for row in rows if row.get("status") == "ok"}
    return [cell for cell in cells if cell["key"] not in done]


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


# ---------------------------------------------------------------- cells and runs
def grid_cells(grid: str, args: GridArguments, seeds: list[int], variants: list[str] | None = None) -> list[dict]:
    """The cells of one grid for ``seeds`` (all its variants, or only ``variants``)."""
    budget = grid_budget(grid, args)
    if grid == "translation":
        table = {v: {"model_family": MARIAN} if v == MARIAN else {"head_mode": v} for v in args.mode_list()}
    elif grid == "clm":
        table = {f"{mode}-{'tied' if tied else 'untied'}": {"head_mode": mode, "tie_word_embeddings": tied}
                 for tied in (True, False) for mode in CLM_MODES}
        table = {variant: table[variant] for variant in args.clm_variant_list()}
    else:
        table = budget["techniques"]
    chosen = [v for v in table if variants is None or v in variants]
    return [make_cell(grid, v, s, budget, table[v]) for s in seeds for v in chosen]


def data_dir(args: GridArguments) -> Path:
    path = Path(args.data_dir)
    return path if path.is_absolute() else (ROOT / path).resolve()


def command(args: GridArguments, cell: dict, out: Path) -> list[str]:
    data = data_dir(args)
    if cell["grid"] == "translation":
        script = "run_translation.py"
        files = {f"{split}_file": str(data / f"{name}.{{lang}}.gz")
                 for split, name in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr"))}
        budget = {**translation_budget(args.budget), **translation_recipe(args)}
    else:
        script = "run_clm.py"
        files = {f"{split}_file": str(data / f"{name}.en.gz")
                 for split, name in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr"))}
        budget = clm_budget(args.budget)
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

    from hf_tiednorm.training import cpu_description

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
    from hf_tiednorm.training import last_complete_checkpoint

    checkpoint = last_complete_checkpoint(out) if out.is_dir() else None
    if checkpoint is None:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
    return checkpoint


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
           "finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "command": " ".join(argv[1:])}
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
        append_row(results, row)
        shown = {k: round(row[k], 3) for k in ("eval_bleu", "test_bleu", "test_perplexity") if k in row}
        print(f"[{time.strftime('%H:%M:%S')}] {row['status']} {cell['key']} {shown} ({row['wall_minutes']:.1f} min)",
              flush=True)

    with ThreadPoolExecutor(max_workers=args.workers) as pool:
        list(pool.map(work, todo))  # list(): re-raise what a worker could not record (a failed append)


def head_modes_by_val_bleu(val: dict[str, dict]) -> list[str]:
    """The head modes (baseline included, the HF contender not) by mean val BLEU, best first: the first is the main
    job's head_mode (scripts/configs/multi30k_de_en.yaml)."""
    return best_variants({v: s for v, s in val.items() if v in MODES}, (), True, len(MODES))


def extra_seed_variants(args: GridArguments, rows: list[dict]) -> list[str]:
    """The translation variants that get --extra_seeds: baseline, marian and the --best_modes head modes with the
    best mean *validation* BLEU (choosing on test would tune on it), among those of --modes."""
    val = summarize(rows, "translation", "eval_bleu", budget_hash(grid_budget("translation", args)))
    best = best_variants(val, ("baseline", MARIAN), higher_is_better=True, count=args.best_modes)
    return [v for v in ("baseline", MARIAN, *best) if v in args.mode_list()]


# ---------------------------------------------------------------- report
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
        name = "BLEU" if grid == "translation" else "perplexity"
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
    report(args)
