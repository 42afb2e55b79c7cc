"""The model card (README.md) of a plain export (``export.py``): what the checkpoint is — a model trained with a
normalized tied head and exported to its parent architecture, with the same logits —, the parent, the size
increase of the untied output layer, and a loading snippet that needs neither hf_tiednorm nor ``trust_remote_code``.

A separate card from ``model_card.py``'s: that one describes an hf_tiednorm model (its remote code, its head as a
live module); an export is a stock checkpoint whose head is baked, and its card says how the rows were made.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from .model_card import MODE_EQUATIONS

# What the baked output row i and bias are, per head mode (g: the logit scale, b: the logit bias, P: Press & Wolf's
# projection when the model had one); the l2 lookups are written into the embedding.
BAKED_ROWS = {
    "baseline": "g_i·w_i", "l2": "g_i·ŵ_i (and the input embedding holds ŵ_i)", "square": "g_i·w_i/‖w_i‖²",
    "distance": "g_i·w_i, bias −½g_i‖w_i‖²", "cosine": "g_i·w_i/‖w_i‖",
}  # fmt: skip


def export_card(result, repo_id: str | None = None) -> ModelCard:
    """The card of ``result`` (an ``export.PlainExport``); ``repo_id`` names the model in the snippet (else ".")."""
    name = repo_id or "."
    auto = "AutoModelForSeq2SeqLM" if result.model.config.is_encoder_decoder else "AutoModelForCausalLM"
    head = result.head
    equation, reference = MODE_EQUATIONS[head["head_mode"]]
    data = ModelCardData(library_name="transformers", tags=["hf_tiednorm", "hf_tiednorm-export"])
    checked = (
        f"largest |logit difference| to the normalized model on random token ids: {result.max_abs_diff:.1e}"
        if result.max_abs_diff is not None
        else "logits not compared at export time"
    )
    text = f"""---
{data.to_yaml()}
---

# {name.split("/")[-1] if repo_id else "Plain export of an hf_tiednorm model"}

A **{result.parent}** checkpoint for stock `transformers` (no remote code, `hf_tiednorm` not needed). It was trained
with a **normalized tied output head** (`hf_tiednorm`, `head_mode="{head["head_mode"]}"`: {equation}, {reference};
logit scale `{head["logit_scale"]}`, logit bias `{head["logit_bias"]}`) and **exported plain**: every head mode is an
affine map of the plain scores, so the output layer's rows are the effective ones ({BAKED_ROWS[head["head_mode"]]})
and the logits are the normalized model's, exactly up to float rounding ({checked}).

| | |
|---|---|
| parent architecture | `{result.parent}` (exported from `{result.source_type}`) |
| output layer | {"tied to the input embedding (the effective rows equal the lookups)" if result.tied else "untied"} |
| per-token bias | {f"`{result.bias_slot}`" if result.bias_slot else "none (identically zero)"} |
| size increase | {result.size_text()} |

```python
from transformers import AutoTokenizer, {auto}

tokenizer = AutoTokenizer.from_pretrained("{name}")
model = {auto}.from_pretrained("{name}")
```

To train it further with the normalized head, convert it back:
`tiednorm-convert {name} normalized/ --head-mode {head["head_mode"]} --lossless-start` (l2 without
`--lossless-start`: its unit lookups are baked already).
"""
    return ModelCard(text)


def write_export_card(folder: str | Path, result, repo_id: str | None = None) -> Path:
    """Write ``export_card(result, repo_id)`` to ``folder``/README.md and return its path."""
    path = Path(folder) / "README.md"
    export_card(result, repo_id).save(path)
    return path


__all__ = ["BAKED_ROWS", "export_card", "write_export_card"]
