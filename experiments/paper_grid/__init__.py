"""The paper's comparison grid (experiments/reproduce_paper.py is its command line): ``cells`` (grids, budgets, cell
keys, the JSONL of finished cells), ``runner`` (running and resuming the cells), ``report`` (statistics, verdicts,
the report). It imports hf_tiednorm; the library never imports it."""
