"""experiments/reproduce_paper.py and experiments/paper_grid/: the grid's pure logic (budgets and their pinned hashes,
keys, resume, appends, statistics, verdicts, report) and one end-to-end run of a 3-cell translation grid with the smoke
budget."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from paper_grid import cells as grid  # experiments/paper_grid/ (on sys.path: conftest.py)
from paper_grid import report, runner
from safetensors.torch import save_file
from script_helpers import EXPERIMENTS, SCRIPTS, subprocess_env


def _args(**overrides):
    return grid.GridArguments(**{"budget": "smoke", **overrides})


def _row(variant, value, status="ok", grid_name="translation", metric="test_bleu", budget_hash="h", seed=0):
    return {"key": f"{grid_name}-{variant}-s{seed}-{budget_hash}", "grid": grid_name, "variant": variant,
            "seed": seed, "budget_hash": budget_hash, "status": status, metric: value}


def test_budget_hash_is_order_independent_and_changes_with_any_value():
    budget = grid.grid_budget("translation", _args())
    assert grid.budget_hash(budget) == grid.budget_hash(dict(reversed(list(budget.items()))))
    assert grid.budget_hash({**budget, "max_steps": budget["max_steps"] + 1}) != grid.budget_hash(budget)
    hashes = {grid.budget_hash(grid.grid_budget("translation", _args(budget=b))) for b in grid.BUDGETS}
    assert len(hashes) == 3
    # The techniques' own settings are part of their budget: another σ makes other cells.
    techniques = [grid.grid_budget("techniques", _args(wn_init_sigma=s)) for s in (0.1, 0.2)]
    assert grid.budget_hash(techniques[0]) != grid.budget_hash(techniques[1])
    cell = grid.grid_cells("translation", _args(), [3], ["cosine"])[0]
    assert cell["key"] == f"translation-cosine-s3-{grid.budget_hash(budget)}"


# The budget hashes of the grids run so far: results/paper_grid.jsonl rows and a running grid's cell folders and
# checkpoints are keyed by them, so a budget file or code change that moves one orphans those cells.
PINNED_BUDGET_HASHES = {
    ("reduced", "translation"): "ad678edc70",
    ("reduced", "clm"): "c394ca437b",
    ("reduced", "techniques"): "52ccea4ab2",
    ("full", "translation"): "cdbfc1e6f1",
    ("full", "clm"): "b2a0002789",
    ("full", "techniques"): "945de258be",
    ("smoke", "translation"): "1c157159d9",
    ("smoke", "clm"): "10a5120fca",
    ("smoke", "techniques"): "4253d5b220",
    ("reduced", "clm_head"): "d9002578b9",
    ("full", "clm_head"): "a9377ed47e",
    ("smoke", "clm_head"): "252c6266a1",
    ("full", "translation_head"): "ee80b65157",
}


@pytest.mark.parametrize(("budget", "grid_name"), sorted(PINNED_BUDGET_HASHES))
def test_budget_hashes_are_pinned(budget, grid_name):
    args = _args(budget=budget)
    expected = PINNED_BUDGET_HASHES[budget, grid_name]
    assert grid.budget_hash(grid.grid_budget(grid_name, args)) == expected
    assert grid.grid_cells(grid_name, args, [0])[0]["key"].endswith(f"-s0-{expected}")


def test_pinned_hashes_of_the_other_full_budget_options():
    """The full budget's other choices (fp32 instead of bf16, the fairseq embedding init) keep their hashes too."""
    fp32, init = _args(budget="full", precision="fp32"), _args(budget="full", embedding_init_std=0.0625)
    assert grid.budget_hash(grid.grid_budget("translation", fp32)) == "4bbd5744f0"
    assert grid.budget_hash(grid.grid_budget("clm", fp32)) == "6804bae90a"
    assert grid.budget_hash(grid.grid_budget("translation", init)) == "95c6ae4d70"
    assert grid.budget_hash(grid.grid_budget("translation", _args(budget="reduced",
                                                                  embedding_init_std=0.0625))) == "08d0d981cb"


def test_budgets_are_the_config_files():
    """Each preset is its YAML file (flags in the file's order); the full translation budget is the main-job recipe
    without its per-cell keys."""
    for kind, read in (("translation", grid.translation_budget), ("clm", grid.clm_budget)):
        for name in grid.BUDGETS:
            path = grid.budget_config(kind, name)
            assert path.is_file(), path
            config = yaml.safe_load(path.read_text())
            assert read(name) == {k: v for k, v in config.items() if k not in grid.PER_CELL_KEYS}
            assert list(read(name)) == [k for k in config if k not in grid.PER_CELL_KEYS]
    assert grid.budget_config("translation", "full") == grid.MAIN_JOB_CONFIG
    assert not set(grid.PER_CELL_KEYS) & {k for n in grid.BUDGETS for k in grid.clm_budget(n)}


def test_full_budget_is_the_main_job_recipe():
    budget = grid.translation_budget("full")
    expected = {"d_model": 256, "encoder_layers": 3, "decoder_layers": 3, "encoder_ffn_dim": 1024, "vocab_size": 8000,
                "per_device_train_batch_size": 64, "learning_rate": 0.001, "lr_scheduler_type": "inverse_sqrt",
                "warmup_steps": 400, "label_smoothing": 0.1, "num_train_epochs": 10, "generation_num_beams": 4}
    assert {k: budget[k] for k in expected} == expected
    assert not {"max_train_samples", "max_eval_samples", "max_predict_samples", "head_mode", "seed"} & set(budget)


def test_grid_cells_cover_modes_tying_and_techniques():
    args = _args(budget="full")
    translation = grid.grid_cells("translation", args, [0])
    assert [c["variant"] for c in translation] == [*grid.MODES, "marian"]
    assert translation[-1]["flags"] == {"model_family": "marian"}
    clm = grid.grid_cells("clm", args, [0, 1])
    assert len(clm) == 12 and len({c["key"] for c in clm}) == 12
    assert {(c["flags"]["head_mode"], c["flags"]["tie_word_embeddings"]) for c in clm} == {
        (m, t) for m in grid.CLM_MODES for t in (True, False)}
    # --clm_variants picks some, with the same keys (e.g. the tied ones of the full budget's extra seeds)
    tied = grid.grid_cells("clm", _args(budget="full", clm_variants="baseline-tied,l2-tied"), [0, 1])
    assert [c["key"] for c in tied] == [c["key"] for c in clm if c["variant"] in ("baseline-tied", "l2-tied")]
    with pytest.raises(ValueError, match="--clm_variants: unknown"):
        _args(clm_variants="cosine-tied,square-tied")
    techniques = {c["variant"]: c["flags"] for c in grid.grid_cells("techniques", args, [0])}
    assert techniques["projection_reg"]["projection_regularization"] == 0.15
    assert techniques["wn_reg"] == {"head_mode": "baseline", "weight_norm_regularization": 1e-3,
                                    "weight_norm_target": 2.0}
    assert techniques["adaptive"]["adaptive_cutoffs"] == [2000, 6000]  # 8k vocabulary
    assert techniques["adaptive_cosine"]["head_mode"] == "cosine"
    assert techniques["wn_init"]["weight_norm_init_sigma"] == args.wn_init_sigma


def test_command_passes_data_dir_threads_and_cell_flags(tmp_path):
    args = _args(data_dir=str(tmp_path), num_threads=3)
    cell = grid.grid_cells("techniques", args, [7], ["adaptive"])[0]
    argv = runner.command(args, cell, tmp_path / "out")
    flags: dict[str, list[str]] = {}
    for token in argv[2:]:  # each flag with the values after it (--adaptive_cutoffs takes several)
        if token.startswith("--"):
            name = token
            flags[name] = []
        else:
            flags[name].append(token)
    assert argv[1].endswith("run_clm.py")
    assert flags["--train_file"] == [str(tmp_path / "train.en.gz")]
    assert flags["--test_file"] == [str(tmp_path / "test_2016_flickr.en.gz")]
    assert (flags["--seed"], flags["--num_threads"], flags["--adaptive_cutoffs"]) == (["7"], ["3"], ["75", "225"])
    assert flags["--do_train"] == ["true"] and flags["--save_strategy"] == ["no"]


def _load_script(name: str):
    module = sys.modules.get(f"script_{name}")
    if module is None:
        spec = importlib.util.spec_from_file_location(f"script_{name}", SCRIPTS / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("budget", ["smoke", "reduced", "full"])
def test_every_cell_command_parses_and_builds_a_valid_config(budget, tmp_path, monkeypatch):
    """What the cells would run, through the scripts' own parsers and config validation, without training."""
    import hf_tiednorm
    from hf_tiednorm.training.arguments import parse_arguments
    from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments, TiedNormTrainingArguments

    translation, clm = _load_script("run_translation"), _load_script("run_clm")
    args = _args(budget=budget)
    for grid_name in grid.GRIDS:
        for cell in grid.grid_cells(grid_name, args, [0]):
            argv = runner.command(args, cell, tmp_path / cell["key"])
            monkeypatch.setattr(sys, "argv", argv[1:])
            if grid_name in ("translation", "translation_head"):
                types = (translation.ModelArguments, translation.DataArguments, translation.RunArguments,
                         TiedNormSeq2SeqTrainingArguments)
                model_args, _, _, training_args = parse_arguments(types)
                config = hf_tiednorm.TiedNormSeq2SeqConfig(vocab_size=model_args.vocab_size,
                                                           **model_args.config_overrides())
                if model_args.model_family == "marian":
                    assert translation.marian_config(config).d_model == config.d_model
                assert training_args.bf16 is (budget == "full")
                if grid_name == "translation_head":  # the head options and the greedy curve reach the run
                    assert config.logit_scale_kind == cell["flags"].get("logit_scale_kind", "none"), cell["key"]
                    assert config.logit_bias is cell["flags"].get("logit_bias", False), cell["key"]
                    assert config.logit_scale_init == cell["flags"].get("logit_scale_init"), cell["key"]
                    assert training_args.generation_num_beams_during_training == 1
            else:
                model_args, *_ = parse_arguments((clm.ModelArguments, clm.DataArguments, clm.RunArguments,
                                                      TiedNormTrainingArguments))
                config = hf_tiednorm.TiedNormCausalConfig(vocab_size=model_args.vocab_size,
                                                          **model_args.config_overrides())
                assert config.head_mode == cell["flags"]["head_mode"]
                if grid_name == "clm_head":  # the head options reach the config
                    assert config.logit_scale_kind == cell["flags"].get("logit_scale_kind", "none"), cell["key"]
                    assert config.logit_bias is cell["flags"].get("logit_bias", False), cell["key"]
                    assert config.logit_scale_init == cell["flags"].get("logit_scale_init"), cell["key"]


def test_resume_skips_ok_cells_only():
    cells = grid.grid_cells("translation", _args(), [0])
    rows = [{"key": cells[0]["key"], "status": "ok"}, {"key": cells[1]["key"], "status": "failed rc=1"}]
    assert [c["key"] for c in grid.pending(cells, rows)] == [c["key"] for c in cells[1:]]


def test_workers_append_one_row_per_cell_and_max_minutes_stops_new_cells(tmp_path, monkeypatch):
    def fake_run_cell(args, cell, device):
        time.sleep(0.01 * (cell["seed"] % 3))  # finish out of order
        if cell["variant"] == "square":
            raise RuntimeError("post-processing broke")
        return {**cell, "status": "ok", "wall_minutes": 0.0, "test_bleu": float(cell["seed"])}

    monkeypatch.setattr(runner, "run_cell", fake_run_cell)
    path = tmp_path / "grid.jsonl"
    cells = grid.grid_cells("translation", _args(), list(range(6)))
    runner.run_cells(_args(workers=4, max_minutes=0.0), cells, path)
    assert not path.exists()  # past the deadline before the first cell: nothing started
    runner.run_cells(_args(workers=4), cells, path)
    rows = grid.load_rows(path)
    assert sorted(r["key"] for r in rows) == sorted(c["key"] for c in cells)
    assert {r["status"] for r in rows if r["variant"] == "square"} == {"failed: RuntimeError: post-processing broke"}
    assert len(grid.pending(cells, rows)) == 6  # the six failed square cells run again on resume


def test_truncated_last_line_is_ignored_and_the_next_append_starts_a_new_line(tmp_path):
    path = tmp_path / "grid.jsonl"
    grid.append_row(path, {"key": "a", "status": "ok"})
    with open(path, "a") as handle:
        handle.write('{"key": "b", "stat')  # a run killed mid-write
    assert [r["key"] for r in grid.load_rows(path)] == ["a"]
    grid.append_row(path, {"key": "c", "status": "ok"})
    assert [r["key"] for r in grid.load_rows(path)] == ["a", "c"]
    assert grid.load_rows(tmp_path / "missing.jsonl") == []


def test_mean_std():
    stats = report.mean_std([1.0, 2.0, 3.0])
    assert (stats["mean"], stats["std"], stats["n"]) == (2.0, 1.0, 3)
    single = report.mean_std([5.0])
    assert single["mean"] == 5.0 and math.isnan(single["std"]) and single["n"] == 1


def test_summarize_keeps_ok_rows_of_one_grid_and_budget():
    rows = [_row("baseline", 10.0), _row("baseline", 12.0, seed=1), _row("baseline", 99.0, status="failed rc=1"),
            _row("baseline", 50.0, budget_hash="other"), _row("baseline", 7.0, grid_name="clm")]
    assert report.summarize(rows, "translation", "test_bleu", "h") == {"baseline": {"mean": 11.0, "std": math.sqrt(2),
                                                                                 "n": 2}}


def test_verdict_compares_the_difference_with_the_combined_seed_spread():
    summary = {"baseline": report.mean_std([30.0, 31.0, 32.0]), "cosine": report.mean_std([33.0, 34.0, 35.0]),
               "square": report.mean_std([31.0, 32.0, 33.0]), "l2": report.mean_std([40.0])}
    result = report.verdict(summary, "baseline", higher_is_better=True)
    assert result["cosine"]["diff"] == pytest.approx(3.0)
    assert result["cosine"]["combined_std"] == pytest.approx(math.sqrt(2))
    assert result["cosine"]["better"] and result["cosine"]["exceeds_seed_spread"]
    assert result["square"]["better"] and not result["square"]["exceeds_seed_spread"]  # 1.0 < √2
    assert result["l2"]["exceeds_seed_spread"] is None  # one seed: no spread to compare with
    perplexity = report.verdict({"baseline": report.mean_std([50.0, 52.0]), "cosine": report.mean_std([40.0, 41.0])},
                              "baseline", higher_is_better=False)
    assert perplexity["cosine"]["better"] and perplexity["cosine"]["exceeds_seed_spread"]
    lines = report.verdict_sentences(result, "baseline", "test BLEU")
    assert "- cosine beats baseline: test BLEU +3.00, beyond the seed spread" in lines[0]
    # A difference inside the spread of two single runs is no win, whatever its sign.
    assert "- square is level with baseline: test BLEU +1.00, within the seed spread" in lines[1]
    assert "- l2 is ahead of baseline: test BLEU +9.00, seed spread unknown" in lines[2]
    worse = report.verdict({"baseline": summary["cosine"], "square": summary["baseline"]}, "baseline", True)
    assert "- square is worse than baseline: x -3.00, beyond" in report.verdict_sentences(worse, "baseline", "x")[0]
    assert report.best_variants(summary, ("baseline",), higher_is_better=True, count=2) == ["l2", "cosine"]
    assert report.best_variants(summary, ("baseline", "l2"), higher_is_better=False, count=1) == ["square"]
    assert report.verdict({"cosine": summary["cosine"]}, "baseline", True) == {}


def test_report_writes_json_markdown_and_histograms(tmp_path):
    args = _args(results=str(tmp_path / "grid.jsonl"), report_json=str(tmp_path / "summary.json"))
    norms = {"median": 0.3, "hist_max": 1.0, "hist_counts": [1.0, 3.0, 2.0, 0.0]}
    for mode, bleus in (("baseline", (30.0, 31.0)), ("cosine", (33.0, 34.0))):
        for seed, bleu in enumerate(bleus):
            cell = grid.grid_cells("translation", args, [seed], [mode])[0]
            grid.append_row(tmp_path / "grid.jsonl", {**cell, "status": "ok", "test_bleu": bleu, "eval_bleu": bleu,
                                                      "device": "CPU", "embedding_norms": norms})
    summary = report.report(args)
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["grids"]["translation"]["test"]["cosine"]["mean"] == 33.5
    assert saved["grids"]["translation"]["verdict"]["cosine"]["exceeds_seed_spread"] is True
    markdown = (tmp_path / "summary.md").read_text()
    assert "| cosine | 33.50 ± 0.71 (2) | 33.50 ± 0.71 (2) | +3.00 |" in markdown
    assert markdown == summary["markdown"] + "\n"
    assert (tmp_path / "summary.png").stat().st_size > 1000
    assert "clm" not in saved["grids"]  # no rows for it


@pytest.mark.slow  # ≈ 75 s on 2 busy CPU cores: three training subprocesses
def test_smoke_grid_end_to_end_and_resume(tmp_path, multi30k_dir):
    """Three translation cells (two head modes, the HF Marian contender) with the smoke budget on two workers, then a
    rerun that finds all done."""
    command = [sys.executable, str(EXPERIMENTS / "reproduce_paper.py"), "--budget", "smoke", "--grids", "translation",
               "--modes", "baseline,cosine,marian", "--seeds", "0", "--extra_seeds", "", "--workers", "2",
               "--num_threads", "1", "--data_dir", str(multi30k_dir), "--results", str(tmp_path / "grid.jsonl"),
               "--runs_dir", str(tmp_path / "runs"), "--report_json", str(tmp_path / "summary.json")]
    start = time.monotonic()
    first = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=300, check=False)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "grid.jsonl").read_text().splitlines()]
    assert sorted(r["variant"] for r in rows) == ["baseline", "cosine", "marian"]
    for row in rows:
        assert row["status"] == "ok" and row["budget"] == "smoke" and row["device"] and row["precision"] == "fp32"
        assert 0.0 <= row["test_bleu"] <= 100.0 and 0.0 <= row["eval_bleu"] <= 100.0 and row["wall_minutes"] > 0
        assert len(row["embedding_norms"]["hist_counts"]) == 40
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["grids"]["translation"]["test"]) == {"baseline", "cosine", "marian"}
    assert (tmp_path / "summary.png").is_file() and (tmp_path / "summary.md").is_file()
    second = subprocess.run(command, env=subprocess_env(), capture_output=True, text=True, timeout=120, check=False)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "3 of 3 cells already done; running 0" in second.stdout
    assert len((tmp_path / "grid.jsonl").read_text().splitlines()) == 3
    print(f"end-to-end smoke: {time.monotonic() - start:.0f} s")


def test_precision_is_part_of_the_budget_and_of_the_command(tmp_path):
    """bf16 for the full budget (its cells save a checkpoint per epoch), fp32 for smoke/reduced; the fp32 budgets hash
    as before precision was a choice, so their earlier (fp32) rows still count."""
    for budget, bf16, saving in (("full", "true", "epoch"), ("reduced", "false", "no"), ("smoke", "false", "no")):
        args = _args(budget=budget, data_dir=str(tmp_path))
        assert ("bf16" in grid.grid_budget("translation", args)) is (bf16 == "true")
        for name in ("translation", "clm"):
            cell = grid.grid_cells(name, args, [0])[0]
            flags = dict(zip(*[iter(runner.command(args, cell, tmp_path / "out")[2:])] * 2))
            assert (flags["--bf16"], flags["--save_strategy"]) == (bf16, saving)
    full = _args(budget="full")
    assert runner.command(full, grid.grid_cells("translation", full, [0])[0], tmp_path)[-1] == "bentrevett/multi30k"
    fp32 = _args(budget="full", precision="fp32")
    assert "bf16" not in grid.grid_budget("translation", fp32)
    assert grid.cell_key("translation", "cosine", 0, grid.grid_budget("translation", fp32)) != grid.cell_key(
        "translation", "cosine", 0, grid.grid_budget("translation", full))
    with pytest.raises(ValueError, match="--precision must be one of"):
        _args(precision="fp16")


def test_embedding_init_std_reaches_every_translation_cell_and_the_budget(tmp_path):
    args = _args(budget="full", embedding_init_std=0.0625, data_dir=str(tmp_path))
    assert grid.grid_budget("translation", args)["embedding_init_std"] == 0.0625
    assert "embedding_init_std" not in grid.grid_budget("translation", _args(budget="full"))
    for cell in grid.grid_cells("translation", args, [0]):
        argv = runner.command(args, cell, tmp_path / "out")
        assert argv[argv.index("--embedding_init_std") + 1] == "0.0625", cell["variant"]


def _fake_cell_run(calls: list[list[str]]):
    def run(argv, cwd, env, stdout, stderr, check):
        calls.append(argv)
        stdout.write("new slice\n")
        out = Path(argv[argv.index("--output_dir") + 1])
        (out / "all_results.json").write_text(json.dumps({"eval_bleu": 30.0, "test_bleu": 29.0}))
        return subprocess.CompletedProcess(argv, 0)

    return run


def test_a_killed_full_budget_cell_resumes_from_its_last_complete_checkpoint(tmp_path, monkeypatch):
    args = _args(budget="full", runs_dir=str(tmp_path / "runs"), data_dir=str(tmp_path))
    cell = grid.grid_cells("translation", args, [0], ["square"])[0]
    out = tmp_path / "runs" / cell["key"]
    for step, state in ((454, '{"global_step": 454}'), (908, '{"global_st')):  # the newer save was cut off
        folder = out / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        # Every file a resume needs (hf_tiednorm.training.run_directory.checkpoint_problems), tiny.
        save_file({"weight": torch.zeros(2, 2)}, folder / "model.safetensors")
        (folder / "config.json").write_text("{}")
        for name in ("optimizer.pt", "scheduler.pt", "rng_state.pth"):
            torch.save({}, folder / name)
        (folder / "trainer_state.json").write_text(state)
    (out / "run.log").write_text("first slice\n")
    calls: list[list[str]] = []
    monkeypatch.setattr(runner.subprocess, "run", _fake_cell_run(calls))
    row = runner.run_cell(args, cell, "CPU")
    assert calls[0][-2:] == ["--resume_from_checkpoint", "last"]
    assert (out / "checkpoint-454").is_dir() and (out / "run.log").read_text() == "first slice\nnew slice\n"
    assert (row["status"], row["resumed_from"], row["precision"], row["test_bleu"]) == (
        "ok", "checkpoint-454", "bf16", 29.0)


def test_a_cell_without_a_complete_checkpoint_starts_over(tmp_path, monkeypatch):
    args = _args(budget="full", runs_dir=str(tmp_path / "runs"), data_dir=str(tmp_path))
    cell = grid.grid_cells("translation", args, [0], ["marian"])[0]
    out = tmp_path / "runs" / cell["key"]
    (out / "checkpoint-454").mkdir(parents=True)  # killed during its first save: no trainer_state.json
    (out / "tokenizer.json").write_text("{}")
    calls: list[list[str]] = []
    monkeypatch.setattr(runner.subprocess, "run", _fake_cell_run(calls))
    row = runner.run_cell(args, cell, "CPU")
    assert "--resume_from_checkpoint" not in calls[0] and calls[0][calls[0].index("--model_family") + 1] == "marian"
    assert sorted(p.name for p in out.iterdir()) == ["all_results.json", "run.log"]
    assert row["resumed_from"] is None and (out / "run.log").read_text() == "new slice\n"


def test_extra_seeds_go_to_baseline_marian_and_the_best_modes_by_val_bleu():
    """Chosen on validation BLEU: here the test ranking would pick distance and square instead."""
    args = _args()
    budget_hash = grid.budget_hash(grid.grid_budget("translation", args))
    scores = {"baseline": (30, 30), "marian": (35, 35), "l2": (33, 30), "cosine": (32, 31), "square": (31, 34),
              "distance": (29, 36)}
    rows = []
    for variant, (val, test) in scores.items():
        rows.append({**_row(variant, float(test), budget_hash=budget_hash), "eval_bleu": float(val)})
    assert runner.extra_seed_variants(args, rows) == ["baseline", "marian", "l2", "cosine"]
    assert runner.extra_seed_variants(_args(best_modes=1, modes="baseline,l2,cosine"), rows) == ["baseline", "l2"]


def test_report_has_deltas_vs_baseline_and_marian_wall_times_and_precision(tmp_path):
    args = _args(results=str(tmp_path / "grid.jsonl"), report_json=str(tmp_path / "summary.json"))
    for variant, bleus in (("baseline", (30.0, 31.0)), ("cosine", (33.0, 34.0)), ("marian", (32.0, 32.0))):
        for seed, bleu in enumerate(bleus):
            cell = grid.grid_cells("translation", args, [seed], [variant])[0]
            # A resumed cell's wall time is its last slice only: left out of the wall-time mean.
            resumed = {"resumed_from": "checkpoint-2270", "wall_minutes": 4.0} if variant == "marian" and seed else {}
            # Wall times are shown per threads per cell: cosine's seed 1 ran on one thread beside another cell.
            threads = {"num_threads": 1, "wall_minutes": 15.0} if variant == "cosine" and seed else {}
            grid.append_row(tmp_path / "grid.jsonl", {**cell, "status": "ok", "test_bleu": bleu, "eval_bleu": bleu - 1,
                                                      "device": "CPU", "precision": "fp32", "wall_minutes": 10.0,
                                                      "num_threads": 2, **resumed, **threads})
    summary = report.report(args)
    markdown = summary["markdown"]
    header = ("| variant | val BLEU (mean ± std, n) | test BLEU (mean ± std, n) | Δ val vs baseline "
              "| Δ test vs baseline | Δ test vs marian | wall min (mean of unresumed cells, by threads per cell) |")
    assert header in markdown
    assert ("| cosine | 32.50 ± 0.71 (2) | 33.50 ± 0.71 (2) | +3.00 | +3.00 | +1.50 | 10.0 (2 thr); 15.0 (1 thr) |"
            in markdown)
    assert "| marian | 31.00 ± 0.00 (2) | 32.00 ± 0.00 (2) | +1.50 | +1.50 |  | 10.0 (2 thr) |" in markdown
    assert "precision: fp32" in markdown and "- cosine beats marian: test BLEU +1.50" in markdown
    assert summary["grids"]["translation"]["verdict_by_reference"]["marian"]["baseline"]["diff"] == -1.5


def test_report_ranks_head_modes_by_val_bleu_and_pairs_bf16_with_fp32_cells(tmp_path):
    """The default head_mode is the head mode with the best mean *val* BLEU (marian is no head mode; test BLEU does
    not choose). Cells trained in both precisions are set side by side with the variant's seed spread."""
    args = _args(budget="full", results=str(tmp_path / "grid.jsonl"), report_json=str(tmp_path / "s.json"))
    fp32 = _args(budget="full", precision="fp32")
    runs = [(args, "baseline", 0, 39.2, 38.0), (args, "baseline", 1, 39.4, 38.4), (args, "cosine", 0, 39.0, 39.5),
            (args, "marian", 0, 40.0, 40.0), (fp32, "baseline", 0, 39.1, 38.3), (fp32, "cosine", 1, 38.0, 38.0)]
    for cell_args, variant, seed, val, test in runs:
        cell = grid.grid_cells("translation", cell_args, [seed], [variant])[0]
        grid.append_row(tmp_path / "grid.jsonl", {**cell, "status": "ok", "eval_bleu": val, "test_bleu": test,
                                                  "wall_minutes": 30.0, "num_threads": 2, "device": "CPU",
                                                  "precision": "bf16" if cell_args.bf16() else "fp32"})
    summary = report.report(args)
    translation = summary["grids"]["translation"]
    assert translation["val_ranking"] == ["baseline", "cosine"]
    ranking = "(the main job's `head_mode` is the first): baseline 39.30 (2) > cosine 39.00 (1)"
    assert f"Head modes by mean val BLEU {ranking}" in summary["markdown"]
    # Only baseline seed 0 ran in both precisions; the fp32-only cosine seed 1 has no pair and no place in the table.
    [pair] = translation["precision_parity"]
    assert (pair["variant"], pair["seed"], pair["precisions"]) == ("baseline", 0, ["bf16", "fp32"])
    assert pair["test_bleu"] == [38.0, 38.3] and pair["test_bleu_seed_std"] == pytest.approx(math.sqrt(0.08))
    row = "| baseline | 0 | 39.20 / 39.10 | 38.00 / 38.30 | +0.30 | 0.28 | 30.0 (2 thr) / 30.0 (2 thr) |"
    assert row in summary["markdown"]


def test_report_numbers_the_devices_when_cells_ran_on_several(tmp_path):
    """Wall times compare only on one processor: with rows from two devices every wall time names its device."""
    args = _args(budget="full", results=str(tmp_path / "grid.jsonl"), report_json=str(tmp_path / "s.json"))
    fp32 = _args(budget="full", precision="fp32")
    amd, intel = "CPU (AMD EPYC, avx512_bf16, 2 cores)", "CPU (Intel(R) Xeon(R), avx512_bf16+amx_bf16, 2 cores)"
    runs = [(args, 0, amd, 30.0), (args, 1, intel, 20.0), (args, 2, intel, 22.0), (fp32, 0, "CPU (other)", 40.0)]
    for cell_args, seed, device, minutes in runs:
        cell = grid.grid_cells("translation", cell_args, [seed], ["baseline"])[0]
        grid.append_row(tmp_path / "grid.jsonl", {**cell, "status": "ok", "eval_bleu": 39.0, "test_bleu": 38.0,
                                                  "wall_minutes": minutes, "num_threads": 2, "device": device,
                                                  "precision": "bf16" if cell_args.bf16() else "fp32"})
    markdown = report.report(args)["markdown"]
    assert f"devices: [1] {amd}, [2] {intel}; precision: bf16" in markdown
    assert "by threads per cell, device) |" in markdown
    assert "| 38.00 ± 0.00 (3) |  |  | 30.0 (2 thr, [1]); 21.0 (2 thr, [2]) |" in markdown
    # The fp32 cell ran on a device none of the bf16 rows did: its wall time names that device in full.
    assert "| +0.00 | 0.00 | 30.0 (2 thr, [1]) / 40.0 (2 thr, CPU (other)) |" in markdown


def test_a_difference_that_prints_as_zero_is_level_and_a_resumed_slice_is_marked(tmp_path):
    args = _args(budget="full", results=str(tmp_path / "grid.jsonl"), report_json=str(tmp_path / "s.json"))
    fp32 = _args(budget="full", precision="fp32")
    runs = [(args, "baseline", 38.6914, {"resumed_from": "checkpoint-2270"}), (args, "distance", 38.6925, {}),
            (fp32, "baseline", 38.78, {})]
    for cell_args, variant, test, extra in runs:
        cell = grid.grid_cells("translation", cell_args, [0], [variant])[0]
        grid.append_row(tmp_path / "grid.jsonl", {**cell, "status": "ok", "eval_bleu": 39.0, "test_bleu": test,
                                                  "wall_minutes": 20.0, "num_threads": 2, "device": "CPU", **extra})
    markdown = report.report(args)["markdown"]
    assert "- distance is level with baseline: test BLEU +0.00, no difference" in markdown
    assert "| 20.0 (2 thr, a resumed slice) / 20.0 (2 thr) |" in markdown


def test_the_main_job_trains_the_head_mode_the_full_grid_ranks_first_by_val_bleu():
    """The default earns its place: the main job's head_mode is the first of the committed full-budget grid's head
    modes by mean val BLEU (rerun the grid, then change the config, never the other way round)."""
    full = _args(budget="full")
    rows = grid.load_rows(grid.ROOT / full.results)
    val = report.summarize(rows, "translation", "eval_bleu", grid.budget_hash(grid.grid_budget("translation", full)))
    assert set(val) >= set(grid.MODES), "every head mode has a full-budget cell"
    assert yaml.safe_load(grid.MAIN_JOB_CONFIG.read_text())["head_mode"] == report.head_modes_by_val_bleu(val)[0]


def test_each_budget_and_precision_reports_to_its_own_files(tmp_path):
    """A grid run ends with a report: running the full budget's fp32 twin cells must not overwrite the reduced or the
    bf16 full report (it overwrote results/paper_summary.json, the reduced budget's, before)."""
    paths = {(budget, precision): _args(budget=budget, precision=precision).report_path()
             for budget in ("reduced", "full") for precision in ("auto", "fp32")}
    assert paths[("reduced", "auto")] == grid.ROOT / "results" / "paper_summary_reduced.json"
    assert paths[("full", "auto")] == grid.ROOT / "results" / "paper_summary_full.json"
    assert paths[("full", "fp32")] == grid.ROOT / "results" / "paper_summary_full_fp32.json"
    assert len(set(paths.values())) == len(paths)
    assert _args(report_json=str(tmp_path / "x.json")).report_path() == tmp_path / "x.json"


def test_a_grid_row_records_the_command_relative_to_the_checkout():
    """A results row is a record a reader reruns: no absolute path of the machine that ran the cell (issue 33)."""
    argv = ["scripts/run_translation.py", "--output_dir", f"{runner.ROOT}/runs/grid/cell",
            "--train_file", f"{runner.ROOT.parent}/shared/data/multi30k/train.de.gz", "--seed", "0"]
    command = runner.repo_relative_command(argv)
    assert str(runner.ROOT.parent) not in command
    assert command == ("scripts/run_translation.py --output_dir runs/grid/cell "
                       "--train_file ../shared/data/multi30k/train.de.gz --seed 0")
