#!/usr/bin/env python
"""The paper's comparison as a resumable grid of training runs, three grids in all:

- translation: the 5 head modes and the HF contender ``marian`` (transformers' MarianMTModel, plain three-way tying,
  trained by the same run_translation.py pipeline: tokenizer, data, Trainer recipe, scoring) × seeds on Multi30k de→en
  (sacreBLEU, beam search with a fixed length penalty, on val and test_2016_flickr; each variant's norm histogram);
- clm: causal-LM perplexity on Multi30k English, baseline / cosine / l2 × tied / untied;
- techniques: the causal LM, plain tied baseline vs +projection regularization, +weight-norm initialization,
  +weight-norm regularization, adaptive input + softmax, and adaptive + cosine.

Every cell is one run of scripts/run_translation.py or scripts/run_clm.py in a subprocess (--workers of them at a
time); its result is appended as one JSON line to --results. A cell whose key (grid, variant, seed and a hash of
the grid's budget) already has an "ok" row is skipped, so rerunning the same command resumes the grid; changing
the budget starts new cells. The Trainer uses CUDA by itself when there is a GPU.

A budget that saves checkpoints (full: one per epoch) resumes a cell killed half-way from its last complete
checkpoint (run_translation.py / run_clm.py --resume_from_checkpoint last) in its folder under --runs_dir; a cell
folder without one (and every folder of the smoke/reduced budgets, which save none) starts over. So a full grid can
be run in slices (--max_minutes, or simply killed) and accumulate over days with the same command.

Precision (--precision): bf16 autocast for the full budget, fp32 for smoke/reduced (d ≤ 128, where bf16 gains
nothing on CPU; their earlier rows are fp32). It is part of the budget (bf16 budgets hash differently) and of each row.

    python experiments/reproduce_paper.py --budget reduced                         # run / resume (2-core CPU)
    python experiments/reproduce_paper.py --budget full --workers 8                # GPU box: the README recipe
    python experiments/reproduce_paper.py --budget full --report_only true         # tables, verdicts, histogram PNG

Order: every cell of the chosen grids with --seeds, then --extra_seeds for the translation baseline, the marian
contender and the --best_modes best head modes by mean *val* BLEU (test is never used to choose; --extra_seeds_all
true: extra seeds for every cell of every grid, scheduled at once).
--max_minutes stops starting cells after that long, so a grid can be run in slices of limited length.

Budgets: experiments/configs/paper_grid_{translation,clm}_{smoke,reduced,full}.yaml (the full translation budget is the
main-job recipe, scripts/configs/multi30k_de_en.yaml). The grid itself (cells, keys, JSONL, statistics, report) is
experiments/paper_grid/; this script is its command line.
"""

from paper_grid.cells import GridArguments  # experiments/paper_grid/, beside this script
from paper_grid.runner import run_grid
from transformers import HfArgumentParser


def main() -> None:
    (args,) = HfArgumentParser(GridArguments).parse_args_into_dataclasses()
    run_grid(args)


if __name__ == "__main__":
    main()
