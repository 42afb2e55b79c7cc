"""The clm_head grid (issue 25): head options as cells, per-epoch validation points kept as learning curves, and
time to quality (steps to reach the reference's final validation score within the tolerance)."""

from __future__ import annotations

import json
import math

import pytest
from paper_grid import cells as grid  # experiments/paper_grid/ (script_helpers puts experiments/ on sys.path)
from paper_grid import curves, report, runner


def _args(**overrides):
    return grid.GridArguments(**{"budget": "smoke", **overrides})


def test_clm_head_cells_carry_the_head_options_and_evaluate_every_epoch():
    args = _args(budget="full")
    budget = grid.grid_budget("clm_head", args)
    assert budget["eval_strategy"] == "epoch" and grid.grid_budget("clm", args)["eval_strategy"] == "no"
    # The same training recipe as the clm grid otherwise.
    assert {**budget, "eval_strategy": "no"} == grid.grid_budget("clm", args)
    flags = {cell["variant"]: cell["flags"] for cell in grid.grid_cells("clm_head", args, [0])}
    assert list(flags) == list(grid.CLM_HEAD_VARIANTS)
    assert flags["cosine"] == {"head_mode": "cosine", "tie_word_embeddings": True}
    # The first scale options started at g₀ = √d (the library default then): they pin it, d = 256 at this budget, so
    # their rows keep their meaning now that a learned scale starts at 1.
    assert flags["l2-vector_bias"] == {"head_mode": "l2", "tie_word_embeddings": True, "logit_scale_kind": "vector",
                                       "logit_scale_init": 16.0, "logit_bias": True}
    assert flags["cosine-scalar"] == {"head_mode": "cosine", "tie_word_embeddings": True, "logit_scale_kind": "scalar",
                                      "logit_scale_init": 16.0}
    assert flags["cosine-bias"] == {"head_mode": "cosine", "tie_word_embeddings": True, "logit_bias": True}
    # The learned scale from g₀ = 1 (the scale-free head at step 0).
    assert flags["l2-vector1_bias"] == {"head_mode": "l2", "tie_word_embeddings": True, "logit_scale_kind": "vector",
                                        "logit_scale_init": 1.0, "logit_bias": True}
    # Translation: √ of the recipe's d_model.
    translation = {c["variant"]: c["flags"] for c in grid.grid_cells("translation_head", args, [0])}
    d_model = grid.grid_budget("translation_head", args)["d_model"]
    assert translation["cosine-vector"]["logit_scale_init"] == math.sqrt(d_model) == 16.0
    with pytest.raises(ValueError, match="--head_variants: unknown"):
        _args(head_variants="cosine-sharp")


def _state(points: list[tuple[int, float]], global_step: int) -> dict:
    history = [{"loss": 5.0, "step": 1}]
    for step, loss in points:
        history += [{"eval_loss": loss, "step": step, "epoch": step / 10}, {"loss": loss, "step": step}]
    history.append({"train_runtime": 120.0, "step": global_step})
    return {"global_step": global_step, "log_history": history}


def test_curve_points_take_every_evaluation_with_perplexity_and_minutes():
    points = curves.curve_points(_state([(10, 4.0), (20, 3.0)], 20), train_runtime=120.0)
    assert [p["step"] for p in points] == [10, 20]
    assert points[0]["eval_perplexity"] == pytest.approx(math.exp(4.0)) and points[0]["epoch"] == 1.0
    assert points[0]["minutes"] == pytest.approx(1.0) and points[1]["minutes"] == pytest.approx(2.0)
    assert "minutes" not in curves.curve_points(_state([(10, 4.0)], 10), train_runtime=None)[0]


def _curve(variant: str, seed: int, perplexities: list[float]) -> dict:
    return {"grid": "clm_head", "variant": variant, "seed": seed, "budget_hash": "h",
            "points": [{"step": 100 * (i + 1), "eval_perplexity": p, "minutes": float(i + 1)}
                       for i, p in enumerate(perplexities)]}


def test_time_to_quality_uses_the_reference_final_mean_and_the_tolerance():
    rows = [_curve("baseline", 0, [90, 60, 50]), _curve("baseline", 1, [92, 62, 52]),
            _curve("cosine", 0, [70, 51.5, 49]), _curve("cosine", 1, [80, 52.5, 49]),
            _curve("l2", 0, [95, 80, 70])]
    result = curves.time_to_quality(rows, "baseline", "eval_perplexity", higher_is_better=False)
    assert result["reference_final"] == 51.0 and result["target"] == pytest.approx(52.02)
    cosine = result["variants"]["cosine"]
    # Seed 0 gets there at step 200 (51.5), seed 1 at step 300 (52.5 at step 200 is above the target).
    assert cosine["reached"] == 2 and cosine["steps"]["mean"] == 250
    assert cosine["steps"]["std"] == pytest.approx(math.sqrt(5000)) and cosine["minutes"]["mean"] == 2.5
    baseline = result["variants"]["baseline"]
    # Seed 0 reaches 52.02 at step 300 (50), seed 1 too (52 ≤ 52.02; 62 at step 200 does not).
    assert (baseline["reached"], baseline["steps"]["mean"], baseline["steps"]["std"]) == (2, 300, 0)
    assert cosine["best"]["mean"] == 49 and cosine["best_step"]["mean"] == 300
    overfit = curves.time_to_quality([_curve("baseline", 0, [60, 40, 50])], "baseline", "eval_perplexity", False)
    assert overfit["variants"]["baseline"]["best"]["mean"] == 40 and overfit["target"] == pytest.approx(51.0)
    assert overfit["variants"]["baseline"]["steps"]["mean"] == 200  # the best point is below the final's target
    # The harder target: the reference's best point (mean over seeds) within the tolerance.
    assert result["reference_best"] == 51.0 and result["best_target"] == pytest.approx(52.02)  # here best = final
    assert cosine["steps_to_best_target"]["mean"] == 250 and baseline["steps_to_best_target"]["mean"] == 300
    assert overfit["best_target"] == pytest.approx(40.8) and overfit["variants"]["baseline"]["reached_best_target"] == 1
    assert overfit["variants"]["baseline"]["steps_to_best_target"]["mean"] == 200
    l2 = result["variants"]["l2"]
    assert l2["reached"] == 0 and l2["runs"] == 1 and l2["steps"]["mean"] is None
    bleu = curves.time_to_quality([{"variant": "baseline", "points": [{"step": 5, "eval_bleu": 30.0}]},
                                   {"variant": "cosine", "points": [{"step": 3, "eval_bleu": 29.6}]}],
                                  "baseline", "eval_bleu", higher_is_better=True)
    assert bleu["target"] == 29.5 and bleu["variants"]["cosine"]["steps"]["mean"] == 3
    assert curves.time_to_quality(rows, "marian", "eval_perplexity", False) == {}


def test_runner_keeps_the_curve_of_a_finished_cell_and_the_report_shows_time_to_quality(tmp_path, monkeypatch):
    args = _args(runs_dir=str(tmp_path / "runs"), results=str(tmp_path / "grid.jsonl"),
                 report_json=str(tmp_path / "summary.json"), grids="clm_head",
                 head_variants="baseline,cosine")
    final = {"baseline": 3.9, "cosine": 3.85}

    def fake_run_cell(args_, cell, device):
        out = tmp_path / "runs" / cell["key"]
        out.mkdir(parents=True)
        losses = [(10, 5.0), (20, 4.2), (30, final[cell["variant"]])] if cell["variant"] == "baseline" else \
            [(10, 4.5), (20, 3.95), (30, final[cell["variant"]])]
        (out / "trainer_state.json").write_text(json.dumps(_state(losses, 30)))
        return {**cell, "status": "ok", "wall_minutes": 1.0, "device": "CPU", "precision": "fp32",
                "resumed_from": None, "train_runtime": 60.0, "eval_perplexity": math.exp(final[cell["variant"]]),
                "test_perplexity": math.exp(final[cell["variant"]])}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    runner.run_cells(args, grid.grid_cells("clm_head", args, [0]), tmp_path / "grid.jsonl")
    curve_rows = grid.load_rows(tmp_path / "grid_curves.jsonl")
    assert [r["variant"] for r in curve_rows] == ["baseline", "cosine"]
    assert [p["step"] for p in curve_rows[0]["points"]] == [10, 20, 30]
    assert curve_rows[1]["points"][1]["minutes"] == pytest.approx(2 / 3)

    summary = report.report(args)
    quality = summary["grids"]["clm_head"]["time_to_quality"]
    # Target: exp(3.9) * 1.02 ≈ 50.4; cosine's exp(3.95) = 51.9 at step 20 misses it, exp(3.85) at step 30 makes it.
    assert quality["variants"]["cosine"]["steps"]["mean"] == 30
    assert quality["variants"]["baseline"]["steps"]["mean"] == 30
    assert "Time to quality" in summary["markdown"]
    assert (tmp_path / "summary_clm_head_curves.png").stat().st_size > 0


def _val_rows(args, grid_name: str, metric: str, values: dict[str, float]) -> tuple[str, list[dict]]:
    """The budget hash and one ok seed-0 row per variant of a head grid with ``metric`` = ``values[variant]``."""
    hash_ = grid.budget_hash(grid.grid_budget(grid_name, args))
    return hash_, [{"grid": grid_name, "budget_hash": hash_, "status": "ok", "variant": v, "seed": 0, metric: value}
                   for v, value in values.items()]


def test_extra_seeds_go_to_the_plain_modes_and_the_options_ahead_of_baseline_on_val():
    args = _args()
    hash_, rows = _val_rows(args, "clm_head", "eval_perplexity", {"baseline": 50.0, "cosine": 60.0,
                                                                 "cosine-bias": 49.0, "l2-vector": 51.0, "l2": 55.0})
    assert runner.head_extra_seed_variants(args, rows) == ["baseline", "cosine", "l2", "cosine-bias"]
    # With curves, each run counts at its best epoch-end point: l2-vector overfits less and ends ahead of baseline,
    # but at their best baseline (40) beats it (45), and cosine-bias (38) still leads.
    for row in rows:
        row["key"] = row["variant"]
    curve_rows = [{"key": v, "budget_hash": hash_, "points": [{"eval_perplexity": b}, {"eval_perplexity": f}]}
                  for v, b, f in (("baseline", 40.0, 52.0), ("cosine-bias", 38.0, 49.0), ("l2-vector", 45.0, 51.0))]
    rows[3]["eval_perplexity"] = 51.0
    assert runner.head_extra_seed_variants(args, rows, "clm_head", curve_rows) == ["baseline", "cosine", "l2",
                                                                                   "cosine-bias"]
    assert runner.head_extra_seed_variants(args, rows, "clm_head", curve_rows[1:]) == [
        "baseline", "cosine", "l2", "cosine-bias", "l2-vector"]  # without baseline's curve: its final 50 counts


def test_a_clm_head_cell_runs_the_budget_its_key_hashes(tmp_path):
    """The per-epoch evaluation is part of clm_head's budget, so its cells must pass it to run_clm.py (a cell ran
    an hour without it once: the key said "evaluate every epoch", the command did not)."""
    args = _args(budget="full", data_dir=str(tmp_path))
    for grid_name in grid.GRIDS:
        budget = grid.grid_budget(grid_name, args)
        for cell in grid.grid_cells(grid_name, args, [0]):
            argv = runner.command(args, cell, tmp_path / "out")
            for name in budget:
                if name not in ("preset", "techniques", "bf16"):
                    assert f"--{name}" in argv, (cell["key"], name)
            assert argv[argv.index("--eval_strategy") + 1] == ("epoch" if grid_name in grid.HEAD_GRIDS else "no")


def test_a_clm_head_cell_without_evaluation_points_is_not_counted_as_done(tmp_path, monkeypatch):
    args = _args(runs_dir=str(tmp_path / "runs"), grids="clm_head", head_variants="cosine")

    def fake_run_cell(args_, cell, device):
        out = tmp_path / "runs" / cell["key"]
        out.mkdir(parents=True)
        (out / "trainer_state.json").write_text(json.dumps({"global_step": 4, "log_history": [{"loss": 3.0}]}))
        return {**cell, "status": "ok", "wall_minutes": 1.0, "resumed_from": None, "train_runtime": 60.0}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    cells = grid.grid_cells("clm_head", args, [0])
    runner.run_cells(args, cells, tmp_path / "grid.jsonl")
    rows = grid.load_rows(tmp_path / "grid.jsonl")
    assert rows[0]["status"].startswith("failed: no per-epoch evaluation points")
    assert grid.pending(cells, rows) == cells and not (tmp_path / "grid_curves.jsonl").exists()


def test_translation_head_cells_are_the_translation_recipe_with_a_greedy_bleu_after_every_epoch():
    """The translation side of "when does a normalized head pay?": the main job's recipe (the full translation budget)
    with a validation BLEU after every epoch, greedy at every point; the final scores keep its beam search."""
    args = _args(budget="full")
    budget = grid.grid_budget("translation_head", args)
    recipe = grid.grid_budget("translation", args)
    assert budget == {**recipe, "eval_strategy": "epoch", "generation_num_beams_during_training": 1}
    assert budget["generation_num_beams"] == 4 and grid.budget_hash(budget) == "ee80b65157"
    flags = {cell["variant"]: cell["flags"] for cell in grid.grid_cells("translation_head", args, [0])}
    assert list(flags) == list(grid.CLM_HEAD_VARIANTS)
    # The recipe's three-way tying stays; run_translation.py has no --tie_word_embeddings.
    assert flags["cosine"] == {"head_mode": "cosine"}
    assert flags["l2-vector_bias"] == {"head_mode": "l2", "logit_scale_kind": "vector", "logit_scale_init": 16.0,
                                       "logit_bias": True}
    argv = runner.command(args, grid.grid_cells("translation_head", args, [0])[0], grid.ROOT / "runs" / "x")
    assert argv[1].endswith("run_translation.py")
    assert argv[argv.index("--generation_num_beams_during_training") + 1] == "1"


def test_translation_head_extra_seeds_go_to_the_options_ahead_of_baseline_on_val_bleu():
    _, rows = _val_rows(_args(), "translation_head", "eval_bleu", {"baseline": 39.0, "cosine": 38.0,
                                                                   "cosine-bias": 39.4, "l2-vector": 38.9, "l2": 39.1})
    args = _args()
    # Higher BLEU leads: cosine-bias does, l2-vector does not (the clm_head rule would have picked it the other way).
    assert runner.head_extra_seed_variants(args, rows, "translation_head") == ["baseline", "cosine", "l2",
                                                                                "cosine-bias"]


def test_the_translation_head_report_has_bleu_curves_and_says_how_they_decode(tmp_path, monkeypatch):
    args = _args(runs_dir=str(tmp_path / "runs"), results=str(tmp_path / "grid.jsonl"),
                 report_json=str(tmp_path / "summary.json"), grids="translation_head", head_variants="baseline,l2")
    bleus = {"baseline": [10.0, 20.0, 30.0], "l2": [15.0, 29.6, 30.5]}

    def fake_run_cell(args_, cell, device):
        out = tmp_path / "runs" / cell["key"]
        out.mkdir(parents=True)
        history = [{"eval_loss": 3.0, "eval_bleu": b, "step": 10 * (i + 1), "epoch": i + 1}
                   for i, b in enumerate(bleus[cell["variant"]])]
        (out / "trainer_state.json").write_text(json.dumps({"global_step": 30, "log_history": history}))
        return {**cell, "status": "ok", "wall_minutes": 1.0, "device": "CPU", "precision": "fp32",
                "resumed_from": None, "train_runtime": 60.0, "eval_bleu": bleus[cell["variant"]][-1] + 2,
                "test_bleu": bleus[cell["variant"]][-1] + 1}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    runner.run_cells(args, grid.grid_cells("translation_head", args, [0]), tmp_path / "grid.jsonl")
    summary = report.report(args)
    quality = summary["grids"]["translation_head"]["time_to_quality"]
    assert quality["metric"] == "eval_bleu" and quality["target"] == 29.5
    assert quality["variants"]["l2"]["steps"]["mean"] == 20 and quality["variants"]["baseline"]["steps"]["mean"] == 30
    assert "val BLEU (mean ± std, n)" in summary["markdown"]
    assert "The epoch-end points decode with 1 beam(s) (1: greedy), the table above with 2." in summary["markdown"]
    assert (tmp_path / "summary_translation_head_curves.png").stat().st_size > 0


def test_the_head_grids_run_only_when_named():
    """The default command is the paper's comparison; the 17-variant head grids (one at the main job's recipe, ~17 min
    a cell) would multiply its time."""
    assert _args().grid_list() == ["translation", "clm", "techniques"]
    assert _args(grids="clm_head,translation_head").grid_list() == list(grid.HEAD_GRIDS)
