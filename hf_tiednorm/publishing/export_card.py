"""The model card (README.md) of a plain export (``export.py``): what the checkpoint is — a model trained with a
normalized tied head and exported to its parent architecture, with the same logits —, the parent, the size
increase of the untied output layer, and a loading snippet that needs neither hf_tiednorm nor ``trust_remote_code``.

A separate card from ``model_card.py``'s: that one describes an hf_tiednorm model (its remote code, its head as a
live module); an export is a stock checkpoint whose head is baked, and its card says how the rows were made.
"""

from __future__ import annotations

from pathlib import Path

from huggingface_hub import ModelCard, ModelCardData

from ..head_modes import get_head_mode
from ..source_provenance import PROVENANCE, folder_provenance


def baked_rows(head_mode: str) -> str:
    """What the baked output row i and bias are for ``head_mode``, asked of the registered mode: every mode scores
    σ_i·(w_i·h) + β_i (``HeadMode.column_terms``), times the logit scale g, plus the logit bias b."""
    mode = get_head_mode(head_mode)
    text = f"row i = g_i·σ_i·w_i, bias g_i·β_i + b_i, where {mode.equation} = σ_i·(w_i·h) + β_i"
    if mode.normalizes_input_lookups:
        text += "; the input embedding holds the lookups the mode makes (HeadMode.plain_input_weight)"
    return text


def _metadata(result, name: str, source: Path | None) -> ModelCardData:
    """The export's front matter: the pipeline tag of its architecture and, from the hf_tiednorm checkpoint it was
    exported from (``source``), what that card states (data sets, languages, metrics, license, base model) or, with
    no card, the provenance its config records; a license nobody stated is ``unknown``."""
    stated = ModelCardData()
    if source is not None and (source / "README.md").is_file():
        stated = ModelCard.load(source / "README.md").data
    provenance = getattr(result.model.config, PROVENANCE, None) or {}
    if source is not None and not provenance and (source / "config.json").is_file():
        provenance = folder_provenance(source)
    encoder_decoder = result.model.config.is_encoder_decoder
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="translation" if encoder_decoder else "text-generation",
        tags=["hf_tiednorm", "hf_tiednorm-export"],
        language=stated.language,
        datasets=stated.datasets,
        license=stated.license or provenance.get("license") or "unknown",
        base_model=stated.base_model or provenance.get("base_model"),
        model_name=name.split("/")[-1] if stated.eval_results else None,
        eval_results=stated.eval_results,
    )


def export_card(result, repo_id: str | None = None, source: str | Path | None = None) -> ModelCard:
    """The card of ``result`` (an ``export.PlainExport``); ``repo_id`` names the model in the snippet (else ".");
    ``source``: the hf_tiednorm checkpoint folder it was exported from, whose card's metadata the export keeps."""
    name = repo_id or "."
    auto = "AutoModelForSeq2SeqLM" if result.model.config.is_encoder_decoder else "AutoModelForCausalLM"
    head = result.head
    mode = get_head_mode(head["head_mode"])
    back = f"`tiednorm-convert {name} normalized/ --head-mode {mode.name}"
    if mode.lossless_start is None:  # e.g. l2: its unit lookups are baked already
        back += f"` (head mode {mode.name} has no lossless start; fine-tune after converting)"
    else:
        back += " --lossless-start` (the lossless start gives back these logits)"
    data = _metadata(result, name if repo_id else "plain-export", Path(source) if source is not None else None)
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
with a **normalized tied output head** (`hf_tiednorm`, `head_mode="{head["head_mode"]}"`: {mode.equation}, {mode.paper};
logit scale `{head["logit_scale"]}`, logit bias `{head["logit_bias"]}`) and **exported plain**: every head mode is an
affine map of the plain scores, so the output layer's rows are the effective ones ({baked_rows(head["head_mode"])})
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

To train it further with the normalized head, convert it back: {back}.
"""
    return ModelCard(text)


def write_export_card(
    folder: str | Path, result, repo_id: str | None = None, source: str | Path | None = None
) -> Path:
    """Write ``export_card(result, repo_id, source)`` to ``folder``/README.md and return its path."""
    path = Path(folder) / "README.md"
    export_card(result, repo_id, source).save(path)
    return path


__all__ = ["baked_rows", "export_card", "write_export_card"]
