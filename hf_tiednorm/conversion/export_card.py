"""The model card (README.md) of a plain export (``export.py``): what the checkpoint is — a model trained with a
normalized tied head and exported to its parent architecture, with the same logits —, the parent, the size
increase of the untied output layer, and a loading snippet that needs neither hf_tiednorm nor ``trust_remote_code``.

A separate card from ``model_card.py``'s: that one describes an hf_tiednorm model (its remote code, its head as a
live module); an export is a stock checkpoint whose head is baked, and its card says how the rows were made.
"""

from __future__ import annotations

from pathlib import Path

import torch
from huggingface_hub import ModelCard, ModelCardData

from ..modeling.families.table import family_of_source
from ..modeling.head.modes import get_head_mode
from ..modeling.head.terms import head_terms
from .convert_checks import parallel_row_scales
from .lossless_start import takes_row_scales
from .source_provenance import PROVENANCE, folder_provenance, source_text
from .staging_checks import unshipped_head_mode
from .training_record import data_text, origin_text, read_training_record, record_metadata, trained

# Where the card's commands name the export: a placeholder the user replaces (a local card cannot know where the
# folder will be; tests/conversion/test_export.py substitutes it), or, on a Hub card, the folder `hf download` writes.
THIS_FOLDER = "<this folder>"


def baked_rows(head_mode: str) -> str:
    """What the baked output row i and bias are for ``head_mode``, asked of the registered mode: every mode scores
    σ_i·(w_i·h) + β_i (``HeadMode.column_terms``), times the logit scale g, plus the logit bias b."""
    mode = get_head_mode(head_mode)
    text = f"row i = g_i·σ_i·w_i, bias g_i·β_i + b_i, where {mode.equation} = σ_i·(w_i·h) + β_i"
    if mode.normalizes_input_lookups:
        text += "; the input embedding holds the lookups the mode makes (plain_head.plain_input_weight)"
    return text


@torch.no_grad()
def _terms_text(head: dict) -> str:
    """The head terms of an export's ``head`` record (``export.head_record``) for its card: "logit scale `vector`,
    logit bias `True`" and each registered term on."""
    shown = [f"{t.name.replace('_', ' ')} `{head[t.config_fields[0]]}`" for t in head_terms() if t.config_fields]
    return ", ".join([*shown, *(f"{name.replace('_', ' ')} `True`" for name in head.get("extra_terms", ()))])


def _untied_refusal(model) -> str | None:
    """Why ``tiednorm-convert --lossless-start`` cannot tie the untied export ``model`` back (the converter's own
    conditions, convert.py: a config that reloads untied, output rows that are positive multiples of the input rows,
    and no other lookup matrix that tying would change), or None."""
    config = model.config
    if type(config).from_dict(config.to_dict()).tie_word_embeddings:
        return (f"the export's config reloads with tie_word_embeddings=True ({type(config).__name__} sets it), so the "
                "converter reads its untied output layer as a broken tie")
    head, embedding = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    try:
        parallel_row_scales(head, embedding, 1e-6, "the export")
    except ValueError as error:
        return str(error).split(": a lossless start")[0]
    others = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Embedding)
              and module.weight is not embedding and module.weight.shape == embedding.shape
              and not torch.equal(module.weight, embedding)]  # fmt: skip
    if others:
        return f"the export's lookups {others} differ from its input embedding: one tied matrix cannot hold them all"
    return None


def convert_back(result, folder: str = THIS_FOLDER) -> tuple[list[str] | None, str]:
    """The ``tiednorm-convert`` arguments that give the normalized head back to the export ``result`` (an
    ``export.PlainExport``) with its logits, reading ``folder``, and a note saying why this mode and flags; or
    (None, why it cannot). tests/conversion/test_export.py runs the command for every case it gives one."""
    model, mode = result.model, get_head_mode(result.head["head_mode"])
    if not result.tied:
        refusal = _untied_refusal(model)
        if refusal:
            return None, refusal
    shipped = unshipped_head_mode(mode.name) is None
    note = "the lossless start gives back these logits"
    if shipped and result.tied and mode.lossless_start is None and mode.normalizes_input_lookups:
        arguments, note = ["--head-mode", mode.name], f"{mode.name}'s lookups are baked already: the same logits"
    elif shipped and mode.lossless_start is not None and (result.tied or takes_row_scales(mode)):
        arguments = ["--head-mode", mode.name, "--lossless-start"]
    else:  # any tied or parallel export comes back with a per-token logit scale: cosine's start sets one
        arguments = ["--head-mode", "cosine", "--lossless-start"]
        why = ("is registered only in the process that trained it" if not shipped else
               "has no lossless start" if mode.lossless_start is None else
               "sets no per-token logit scale at its lossless start, which this untied export needs")
        note = f"head mode {mode.name} {why}; cosine's lossless start gives back these logits"
    if result.bias_slot is not None and family_of_source(model.config.model_type) is not None:
        arguments.append("--generic")  # hf_tiednorm's own family has no final_logits_bias
        note += "; --generic keeps the final_logits_bias"
    return ["tiednorm-convert", folder, "normalized/", *arguments], note


def _provenance(result, source: Path | None) -> dict:
    """Where the exported weights came from: the provenance the model's config records (it travels with every
    save_pretrained), else what its folder states."""
    provenance = getattr(result.model.config, PROVENANCE, None) or {}
    if source is not None and not provenance and (source / "config.json").is_file():
        provenance = folder_provenance(source)
    return provenance


def _metadata(result, name: str, source: Path | None) -> ModelCardData:
    """The export's front matter: the pipeline tag of its architecture and, from the hf_tiednorm checkpoint it was
    exported from (``source``), what that card states (data sets, languages, metrics — the scored subset's split
    name included —, license with an ``other`` license's name and link, base model) or, with no card, the provenance
    its config records; a license nobody stated is ``unknown``."""
    stated = ModelCardData()
    if source is not None and (source / "README.md").is_file():
        stated = ModelCard.load(source / "README.md").data
    provenance = _provenance(result, source)
    encoder_decoder = result.model.config.is_encoder_decoder
    license = stated.license or provenance.get("license") or "unknown"
    details = {}
    if license == "other":
        for key in ("license_name", "license_link"):
            value = getattr(stated, key, None) or provenance.get(key)
            if value:
                details[key] = value
    return ModelCardData(
        library_name="transformers",
        pipeline_tag="translation" if encoder_decoder else "text-generation",
        tags=["hf_tiednorm", "hf_tiednorm-export"],
        language=stated.language,
        datasets=stated.datasets,
        license=license,
        **details,
        base_model=stated.base_model or provenance.get("base_model"),
        model_name=name.split("/")[-1] if stated.eval_results else None,
        eval_results=stated.eval_results,
        **record_metadata(read_training_record(source)),  # how the exported weights were trained
    )


def export_card(result, repo_id: str | None = None, source: str | Path | None = None) -> ModelCard:
    """The card of ``result`` (an ``export.PlainExport``); ``repo_id`` names the model in the snippet (else ".");
    ``source``: the hf_tiednorm checkpoint folder it was exported from, whose card's metadata the export keeps."""
    name = repo_id or "."
    auto = "AutoModelForSeq2SeqLM" if result.model.config.is_encoder_decoder else "AutoModelForCausalLM"
    head = result.head
    mode = get_head_mode(head["head_mode"])
    local = repo_id.split("/")[-1] if repo_id else THIS_FOLDER
    command, note = convert_back(result, local)
    if command is None:
        back = (f"It cannot be converted back to the normalized head losslessly: {note}. To train it further, resume "
                "from the hf_tiednorm checkpoint it was exported from.")
    else:
        download = f"`hf download {repo_id} --local-dir {local}`, then " if repo_id else ""
        back = (f"To train it further with the normalized head, convert it back: {download}`{' '.join(command)}` "
                f"({note}).")
    data = _metadata(result, name if repo_id else "plain-export", Path(source) if source is not None else None)
    if result.max_abs_diff is not None:
        checked = (
            f"the logits are the normalized model's up to float rounding: the largest |logit difference| on random "
            f"token ids was {result.max_abs_diff:.1e}, checked against the tolerance {result.tolerance:.1e}"
        )
    else:
        checked = "the logits were not compared with the normalized model's at export time"
    # Where the weights came from and what was done to them, in the words of every other card (source_text,
    # training_record.origin_text): the training record of the folder exported (its training_args.bin,
    # trainer_state.json and card), whatever trained it.
    folder = Path(source) if source is not None else None
    record = read_training_record(folder)
    origin = source_text(_provenance(result, folder), data.base_model if isinstance(data.base_model, str) else None)
    origin = origin_text(record, origin) or "Its source is not recorded."
    if trained(record) or (record is not None and record.data):
        origin += " " + data_text(record, data.language if isinstance(data.language, list) else None)
    text = f"""---
{data.to_yaml()}
---

# {name.split("/")[-1] if repo_id else "Plain export of an hf_tiednorm model"}

A **{result.parent}** checkpoint for stock `transformers` (no remote code, `hf_tiednorm` not needed). It was trained
with a **normalized tied output head** (`hf_tiednorm`, `head_mode="{head["head_mode"]}"`: {mode.equation}, {mode.paper};
{_terms_text(head)}) and **exported plain**: every head mode is
an affine map of the plain scores, so the output layer's rows are the effective ones ({baked_rows(head["head_mode"])});
{checked}.

{origin}

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

{back}
"""
    return ModelCard(text)


def write_export_card(
    folder: str | Path, result, repo_id: str | None = None, source: str | Path | None = None
) -> Path:
    """Write ``export_card(result, repo_id, source)`` to ``folder``/README.md and return its path."""
    path = Path(folder) / "README.md"
    export_card(result, repo_id, source).save(path)
    return path


__all__ = ["THIS_FOLDER", "baked_rows", "convert_back", "export_card", "write_export_card"]
