#!/usr/bin/env python
"""Plot the row norms of a saved model's token embedding: their histogram (Liu et al., Figure 2) and norm vs
token frequency in the training data (hf_tiednorm/training/plots.py).

    python experiments/plot_embedding_norms.py --model_folder runs/multi30k_de_en  # writes PNGs into the folder
    python experiments/plot_embedding_norms.py --model_folder runs/x --output_dir plots --counts token_counts.pt

Frequencies come from ``token_counts.pt`` (saved by run_translation.py / run_clm.py, or given with --counts);
without them only the histogram is drawn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModel, HfArgumentParser

import hf_tiednorm  # noqa: F401  (registers the Auto classes)
from hf_tiednorm.training.plots import plot_embedding_norms


@dataclass
class PlotArguments:
    model_folder: str = field(
        metadata={"help": "folder written by save_pretrained (a run's --output_dir or a checkpoint)"}
    )
    output_dir: str | None = field(default=None, metadata={"help": "where the PNGs go; default: the model folder"})
    counts: str | None = field(
        default=None,
        metadata={
            "help": "token counts (a (vocab,) tensor saved with torch.save); default: <model_folder>/token_counts.pt "
            "if present"
        },
    )
    bins: int = field(default=60, metadata={"help": "histogram bins"})


def main() -> None:
    (args,) = HfArgumentParser(PlotArguments).parse_args_into_dataclasses()
    folder = Path(args.model_folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} is not a saved model folder (no config.json)")
    counts_path = Path(args.counts) if args.counts else folder / "token_counts.pt"
    if args.counts and not counts_path.is_file():
        raise FileNotFoundError(f"--counts {counts_path} not found")
    counts = torch.load(counts_path) if counts_path.is_file() else None
    model = AutoModel.from_pretrained(folder)
    for path in plot_embedding_norms(model, args.output_dir or folder, counts, title=folder.name, bins=args.bins):
        print(path)


if __name__ == "__main__":
    main()
