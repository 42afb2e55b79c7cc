"""The quick first-contact run (bash scripts/main_job.sh --quick) is the reduced paper-grid recipe it cites.

Its config quotes the reduced translation grid's val ranking to justify its head mode and recipe; these checks keep
the two in step (change the grid, rerun it, then the config, never the other way round).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
QUICK = ROOT / "scripts" / "configs" / "multi30k_de_en_quick.yaml"
REDUCED_REPORT = ROOT / "results" / "paper_summary_reduced.json"
# What the quick run may set differently from the grid cell: where it writes, how it decodes (greedy: 4× faster
# than beam 4 and the same for every prediction), the batch size of scoring, and per-machine keys.
DECODING_AND_MACHINE_KEYS = {"output_dir", "dataset_name", "head_mode", "seed", "num_threads", "save_strategy",
                             "generation_num_beams", "per_device_eval_batch_size"}


def _quick() -> dict:
    return yaml.safe_load(QUICK.read_text())


def test_quick_run_trains_the_head_mode_the_reduced_grid_ranks_first_by_val_bleu():
    val = json.loads(REDUCED_REPORT.read_text())["grids"]["translation"]["val"]
    best = max(val, key=lambda mode: val[mode]["mean"])
    assert _quick()["head_mode"] == best


def test_quick_run_trains_the_reduced_grid_recipe():
    budget = dict(json.loads(REDUCED_REPORT.read_text())["grids"]["translation"]["budget"])
    budget.pop("preset")
    quick = _quick()
    for key, value in budget.items():
        if key not in DECODING_AND_MACHINE_KEYS:
            assert quick.get(key) == value, f"{key}: quick {quick.get(key)!r}, reduced grid {value!r}"
    # The whole test set is translated, and the whole training set is read (no max_*_samples).
    assert not any(key.startswith("max_") and key.endswith("_samples") for key in quick)
