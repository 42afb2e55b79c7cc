"""The paper's comparison grid, its cells and budgets: the grids and their variants, ``GridArguments`` (the flags of
experiments/reproduce_paper.py), the budgets (experiments/configs/paper_grid_*.yaml and the main-job recipe
scripts/configs/multi30k_de_en.yaml), cell keys (a hash of the budget), and the JSONL of finished cells (read, append,
what is pending). ``runner`` runs the cells, ``report`` computes the statistics, verdicts and report.

Every cell is one run of scripts/run_translation.py or scripts/run_clm.py in a subprocess; its result is appended as
one JSON line to the results file. A cell whose key (grid, variant, seed and a hash of the grid's budget) already has an
"ok" row is skipped, so rerunning the same command resumes the grid; changing the budget starts new cells.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from hf_tiednorm.registration.head_modes import HEAD_MODES

ROOT = Path(__file__).resolve().parents[2]  # the checkout: scripts/, results/
MODES = HEAD_MODES  # the translation grid runs every head mode (hf_tiednorm.modeling.head.layer, the one list)
# The HF contender of the translation grid: transformers' MarianMTModel (run_translation.py --model_family marian).
MARIAN = "marian"
TRANSLATION_VARIANTS = (*MODES, MARIAN)
PRECISIONS = ("auto", "bf16", "fp32")
CLM_MODES = ("baseline", "cosine", "l2")
CLM_VARIANTS = tuple(f"{mode}-{tie}" for tie in ("tied", "untied") for mode in CLM_MODES)
# "When does a normalized head pay?" (issue 25): the causal-LM full budget evaluated after every epoch (learning
# curves, time to quality), for the plain modes and the head options that may give a normalized head back what the
# normalization takes: a learned logit scale (bounded scores limit the softmax's sharpness) and a learned per-token
# logit bias (the row norms of a tied matrix carry the unigram prior, which normalization deletes).
# The scale options ran first from g₀ = √d (the library default then; the g a score with *both* sides unit-norm needs).
# These heads keep the norm of h (only the rows of W are normalized), so their scores already have the scale of the
# plain ones and g₀ = √d makes the step-0 logits √d times too sharp (full LM budget: val perplexity 2-6·10⁴ after
# epoch 1 against 79 without a scale), so the library's learned scales now start at 1. The options keep their
# meaning: "scalar"/"vector" pin g₀ = √d of the budget's width (SQRT_D), the "...1" options start at g₀ = 1, where
# the model equals the scale-free one at step 0.
SQRT_D = "sqrt_d"
HEAD_OPTIONS = {
    "scalar": {"logit_scale_kind": "scalar", "logit_scale_init": SQRT_D},
    "vector": {"logit_scale_kind": "vector", "logit_scale_init": SQRT_D},
    "bias": {"logit_bias": True},
    "vector_bias": {"logit_scale_kind": "vector", "logit_scale_init": SQRT_D, "logit_bias": True},
    "scalar1": {"logit_scale_kind": "scalar", "logit_scale_init": 1.0},
    "vector1": {"logit_scale_kind": "vector", "logit_scale_init": 1.0},
    "vector1_bias": {"logit_scale_kind": "vector", "logit_scale_init": 1.0, "logit_bias": True},
}
CLM_HEAD_PLAIN = CLM_MODES
CLM_HEAD_VARIANTS = (*CLM_HEAD_PLAIN, *(f"{mode}-{option}" for mode in ("cosine", "l2") for option in HEAD_OPTIONS))
# The same question in translation: the translation budget (at full, the main job's recipe) with a validation BLEU
# after every epoch, greedy at every point (the final scores keep the recipe's beam search); same variants.
HEAD_GRIDS = ("clm_head", "translation_head")
PAPER_GRIDS = ("translation", "clm", "techniques")
GRIDS = (*PAPER_GRIDS, *HEAD_GRIDS)
BUDGETS = ("smoke", "reduced", "full")
# The full translation budget is the README main-job recipe, read from its config so that the two cannot drift.
CONFIGS = ROOT / "experiments" / "configs"
MAIN_JOB_CONFIG = ROOT / "scripts" / "configs" / "multi30k_de_en.yaml"
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
    "clm_head": ("test_perplexity", "eval_perplexity", False, "baseline"),
    "translation_head": ("test_bleu", "eval_bleu", True, "baseline"),
}


@dataclass
class GridArguments:
    """The command-line arguments of experiments/reproduce_paper.py: which grids, budget, seeds and workers."""

    # The paper's comparison by default; the head grids ("when does a normalized head pay?") by name: they are long
    # (17 variants, the translation one at the main job's recipe).
    grids: str = field(
        default=",".join(PAPER_GRIDS), metadata={"help": f"grids to run, comma-separated, from {GRIDS}"}
    )
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
    head_variants: str = field(
        default=",".join(CLM_HEAD_VARIANTS),
        metadata={"help": f"variants of the clm_head and translation_head grids, comma-separated, from "
                          f"{CLM_HEAD_VARIANTS}"},
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
        unknown = set(self.head_variant_list()) - set(CLM_HEAD_VARIANTS)
        if unknown:
            raise ValueError(f"--head_variants: unknown {sorted(unknown)}; choose from {CLM_HEAD_VARIANTS}")
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

    def head_variant_list(self) -> list[str]:
        return [v for v in self.head_variants.split(",") if v]

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
    if grid == "translation_head":  # the validation BLEU after every epoch, greedy: the learning curves (curves.py)
        return {"preset": args.budget, **translation_budget(args.budget), **translation_recipe(args), **precision,
                "eval_strategy": "epoch", "generation_num_beams_during_training": 1}
    budget = {"preset": args.budget, **clm_budget(args.budget), **precision}
    if grid == "clm_head":  # the validation perplexity after every epoch: the learning curves (curves.py)
        budget["eval_strategy"] = "epoch"
    if grid == "techniques":
        budget["techniques"] = technique_flags(budget["vocab_size"], args.wn_init_sigma)
    return budget


# ------------------------------------------------------------ pure logic (tests/experiments/test_reproduce_paper.py)
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


def head_option_flags(option: str, budget: dict) -> dict:
    """The script flags of a head option (HEAD_OPTIONS; "" for none), with g₀ = SQRT_D as √(the budget's width)."""
    flags = dict(HEAD_OPTIONS.get(option, {}))
    if flags.get("logit_scale_init") == SQRT_D:
        flags["logit_scale_init"] = math.sqrt(budget.get("hidden_size") or budget["d_model"])
    return flags


def grid_cells(grid: str, args: GridArguments, seeds: list[int], variants: list[str] | None = None) -> list[dict]:
    """The cells of one grid for ``seeds`` (all its variants, or only ``variants``)."""
    budget = grid_budget(grid, args)
    if grid == "translation":
        table = {v: {"model_family": MARIAN} if v == MARIAN else {"head_mode": v} for v in args.mode_list()}
    elif grid == "clm":
        table = {f"{mode}-{'tied' if tied else 'untied'}": {"head_mode": mode, "tie_word_embeddings": tied}
                 for tied in (True, False) for mode in CLM_MODES}
        table = {variant: table[variant] for variant in args.clm_variant_list()}
    elif grid in HEAD_GRIDS:
        table = {}
        for variant in args.head_variant_list():
            mode, _, option = variant.partition("-")
            tied = {"tie_word_embeddings": True} if grid == "clm_head" else {}  # translation: the recipe's three-way
            table[variant] = {"head_mode": mode, **tied, **head_option_flags(option, budget)}
    else:
        table = budget["techniques"]
    chosen = [v for v in table if variants is None or v in variants]
    return [make_cell(grid, v, s, budget, table[v]) for s in seeds for v in chosen]
