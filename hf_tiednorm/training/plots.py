"""Embedding row-norm plots of a model: the histogram of ‖w_i‖ (Liu, Zhai & Chen, Figure 2) and ‖w_i‖ against the
token's training frequency. The training scripts draw them next to every saved model (the model card shows the
histogram); ``experiments/plot_embedding_norms.py`` draws them for any saved folder."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

from ..modeling.head.adaptive import embedding_matrices  # noqa: E402
from ..publishing.model_card import EMBEDDING_NORM_PLOT, NORM_VS_FREQUENCY_PLOT  # noqa: E402 (the card embeds them)


def embedding_row_norms(model: PreTrainedModel) -> torch.Tensor:
    """(V,) fp32 norms of the stored input-embedding rows, in token-id order (band after band when adaptive), on the
    model's device."""
    weights = embedding_matrices(model.get_input_embeddings())
    return torch.cat([torch.linalg.vector_norm(w.detach().float(), dim=-1) for w in weights])


def plot_embedding_norms(
    model: PreTrainedModel, output_dir: str | Path, counts: torch.Tensor | None = None, title: str = "", bins: int = 60
) -> list[Path]:
    """Write the histogram (and, given per-token training ``counts``, the norm-vs-frequency scatter) as PNG files
    into ``output_dir``; returns their paths."""
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    # Host copies: matplotlib reads numpy arrays, and a model trained on a GPU has its norms there (counts come from
    # the data, on the host; a mask of one must not index the other across devices).
    norms = embedding_row_norms(model).detach().cpu().numpy()
    title = f"{title} ({getattr(model.config, 'head_mode', '?')})"

    figure, axis = plt.subplots(figsize=(5, 3.5))
    axis.hist(norms, bins=bins, color="tab:blue")
    axis.set_xlabel("embedding row norm ‖w_i‖")
    axis.set_ylabel("tokens")
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(out / EMBEDDING_NORM_PLOT, dpi=120)
    plt.close(figure)
    written = [out / EMBEDDING_NORM_PLOT]

    if counts is not None:
        if counts.shape[0] != norms.shape[0]:
            raise ValueError(f"{counts.shape[0]} token counts for an embedding of {norms.shape[0]} rows")
        counts = counts.detach().cpu().numpy()
        seen = counts > 0  # log scale: unseen tokens have no position on the axis
        figure, axis = plt.subplots(figsize=(5, 3.5))
        axis.scatter(counts[seen], norms[seen], s=3, alpha=0.4)
        axis.set_xscale("log")
        axis.set_xlabel("token frequency in the training data")
        axis.set_ylabel("embedding row norm ‖w_i‖")
        axis.set_title(f"{title}; {int((~seen).sum())} unseen tokens not shown")
        figure.tight_layout()
        figure.savefig(out / NORM_VS_FREQUENCY_PLOT, dpi=120)
        plt.close(figure)
        written.append(out / NORM_VS_FREQUENCY_PLOT)
    return written


__all__ = ["EMBEDDING_NORM_PLOT", "NORM_VS_FREQUENCY_PLOT", "embedding_row_norms", "plot_embedding_norms"]
