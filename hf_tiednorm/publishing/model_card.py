"""Model cards (README.md) for saved ``hf_tiednorm`` checkpoints.

``write_model_card(folder, ...)`` reads the folder's ``config.json`` and renders the Jinja template in
``model_cards/`` with ``huggingface_hub.ModelCard``: front matter (library, pipeline tag, tags, languages,
datasets, license, ``model-index`` with sacreBLEU / perplexity results) and a body with the scoring mode and its
equation, the tie topology, any regularizer fields, training data and budget, loading instructions, the
embedding-norm histogram when present, and BibTeX citations. The folder holds one of hf_tiednorm's own families or a
converted model of any tied architecture (``tiednorm_wrapped``: ``hf_tiednorm.convert``, ``normalize_tied_head``).

CLI::

    python -m hf_tiednorm.publishing.model_card runs/cosine --dataset bentrevett/multi30k --languages de en \
        --metrics runs/cosine/test_results.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id
from safetensors import safe_open
from transformers import AutoConfig, PreTrainedConfig

from ..conversion import training_record
from ..conversion.saved_code import VERSION_FIELD
from ..conversion.source_provenance import PROVENANCE
from ..conversion.staging_checks import has_chat_template
from ..modeling.families.configuration import TiedNormHeadConfigMixin
from ..modeling.families.configuration_encoder_decoder import TieTopologyConfigMixin
from ..modeling.families.table import ROWS, family_of_config
from ..modeling.head.modes import get_head_mode
from .card_metrics import eval_results, metric_subsets, parse_metrics, training_settings
from .card_terms import term_rows
from .provenance import (
    add_provenance_arguments,
    card_provenance,
    check_base_model_id,
    license_details,
    license_text,
    provenance_from_args,
)

TEMPLATE_NAME = "tiednorm_model_card.md"
# File names of the two embedding-norm plots in a model folder (training/plots.py draws them; the card embeds the
# histogram, tiednorm-push uploads both).
EMBEDDING_NORM_PLOT = "embedding_norms.png"
NORM_VS_FREQUENCY_PLOT = "embedding_norms_vs_frequency.png"
# Any config of the family table (families/table.py): our families' and the wrapper's (a converted model of any tied
# architecture, whose wrapped config is its text_config). Every per-family answer of the card is the table's.
TiedNormConfig = PreTrainedConfig

TIE_TOPOLOGY_TEXT = {
    "three_way": "three-way: encoder input = decoder input = output embedding",
    "decoder": "decoder: decoder input = output embedding; the encoder has its own",
    "untied": "untied: three separate matrices (the head mode applies to the output matrix)",
}
# A converted encoder-decoder has no tie_topology: it keeps the tie its architecture makes (conversion refuses untied
# heads). Only Marian's share_encoder_decoder_embeddings=False (two vocabularies) says, in the config, which one.
WRAPPED_TIE_TEXT = "input = output embedding: the matrix the architecture ties its output layer to"
LIU_ET_AL_BIBTEX = """@article{liu2020normalization,
  title   = {Normalization of Input-output Shared Embeddings in Text Generation Models},
  author  = {Liu, Jinyang and Zhai, Yujia and Chen, Zizhong},
  journal = {arXiv preprint arXiv:2001.07885},
  year    = {2020}
}"""
PRESS_WOLF_BIBTEX = """@inproceedings{press2017using,
  title     = {Using the Output Embedding to Improve Language Models},
  author    = {Press, Ofir and Wolf, Lior},
  booktitle = {Proceedings of the 15th Conference of the European Chapter of the Association for Computational
               Linguistics: Volume 2, Short Papers},
  pages     = {157--163},
  year      = {2017}
}"""
def template_path() -> Path:
    """The card template: inside the installed package if shipped there, else in the source checkout."""
    package_dir = Path(__file__).resolve().parents[1]  # hf_tiednorm/
    for candidate in (package_dir / "model_cards" / TEMPLATE_NAME, package_dir.parent / "model_cards" / TEMPLATE_NAME):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"model card template {TEMPLATE_NAME!r} not found in {package_dir / 'model_cards'} nor "
        f"{package_dir.parent / 'model_cards'}; reinstall hf_tiednorm with its package data"
    )


# Fields that only mean something while another field turns their technique on.
_DEPENDENT_FIELDS = {
    "adaptive_div_value": "adaptive_cutoffs",
    "adaptive_tie_projections": "adaptive_cutoffs",
    "weight_norm_target": "weight_norm_regularization",
}


def _regularizer_fields(config: TiedNormConfig) -> dict[str, Any]:
    """Config fields that are neither the HF parent's nor the head's/topology's and describe this model: the
    regularizers and the like that are on (a value other than the family's default, plus the settings of a technique
    that is on, e.g. ``adaptive_tie_projections`` with ``adaptive_cutoffs``). Transformers' bookkeeping
    (``custom_pipelines``) is left out.

    Found generically so that fields added later (projection, weight-norm penalties, ...) appear on the card. A
    converted model has none (its config refuses them: it trains with the wrapped model's own loss).
    """
    row = family_of_config(config)
    if not row.has_technique_fields(config):
        return {}
    parent = row.hf_parent_config()
    # The head's and the tie topology's fields have their own rows (label smoothing too), and so do the parent's.
    own_rows = [*fields(TiedNormHeadConfigMixin), *fields(TieTopologyConfigMixin)]
    known = set(parent.to_dict()) | {field.name for field in own_rows} | {
        "label_smoothing", "auto_map", "architectures", "transformers_version", "model_type", "_name_or_path", "dtype",
        "custom_pipelines", "unk_token_id", "extra_terms", PROVENANCE, VERSION_FIELD,
    }  # fmt: skip
    values = config.to_dict()
    defaults = type(config)().to_dict()

    def describes_model(name: str) -> bool:
        if name in _DEPENDENT_FIELDS:
            return bool(values.get(_DEPENDENT_FIELDS[name]))
        return name not in defaults or values[name] != defaults[name]

    # "_"-prefixed entries are bookkeeping, not settings (a GGUF source's config carries "_model_name_or_path").
    shown = [n for n in sorted(values) if n not in known and not n.startswith("_") and describes_model(n)]
    return {name: values[name] for name in shown}


def _num_parameters(folder: Path) -> str:
    """Stored parameter count, read from the safetensors headers (a tied matrix is stored once)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return "unknown (no safetensors weights in the folder)"
    total = 0
    for file in files:
        with safe_open(file, framework="pt") as weights:
            total += sum(math.prod(weights.get_slice(name).get_shape()) for name in weights.keys())  # noqa: SIM118 (safe_open is no dict)
    return f"{total / 1e6:.2f}M" if total >= 1e5 else f"{total:,}"


def _architecture_text(config: TiedNormConfig) -> str:
    return family_of_config(config).architecture_text(config)


def _tie_topology_text(config: TiedNormConfig) -> str:
    if isinstance(config, TieTopologyConfigMixin) and config.is_encoder_decoder:  # our encoder-decoders declare it
        return TIE_TOPOLOGY_TEXT[config.tie_topology]
    if not config.tie_word_embeddings:
        return "untied"
    if config.is_encoder_decoder:  # a wrapped one keeps the tie its architecture makes
        two_vocabularies = getattr(config.text_config, "share_encoder_decoder_embeddings", True) is False
        return TIE_TOPOLOGY_TEXT["decoder"] if two_vocabularies else WRAPPED_TIE_TEXT
    return "input = output embedding"


def check_repo_id(repo_id: str) -> None:
    """huggingface_hub's rule for a model repository id ("name" or "namespace/name"; letters, digits, '-', '_',
    '.'), as ``ValueError`` naming the id, before anything is staged or uploaded."""
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(f"invalid Hub repository id {repo_id!r}: {error}") from None


def load_tiednorm_config(folder: str | os.PathLike) -> TiedNormConfig:
    """The checkpoint's config, refusing folders that are not hf_tiednorm checkpoints (own family or converted)."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder} has no config.json; pass a folder written by save_pretrained")
    config = AutoConfig.from_pretrained(folder)
    if family_of_config(config) is None:
        raise ValueError(
            f"{folder} holds a {config.model_type!r} model, not an hf_tiednorm one (one of "
            f"{sorted(ROWS)}); convert it first with `python -m hf_tiednorm.convert`"
        )
    return config


def render_model_card(
    folder: str | os.PathLike,
    *,
    metrics: dict[str, Any] | None = None,
    dataset: str | None = None,
    languages: list[str] | None = None,
    training: dict[str, Any] | None = None,
    eval_subsets: dict[str, tuple[int, int]] | None = None,
    repo_id: str | None = None,
    license: str | None = None,
    base_model: str | None = None,
    base_model_id: str | None = None,
    trained_in: str | os.PathLike | None = None,
    license_name: str | None = None,
    license_link: str | None = None,
) -> ModelCard:
    """The model card of a saved checkpoint folder, without writing it (``write_model_card`` writes it).

    Args:
        folder: a folder written by ``save_pretrained`` of an hf_tiednorm model (own family or converted).
        metrics: evaluation results, e.g. the Trainer's ``{"test_bleu": 38.1, "test_bleu_signature": "nrefs:1|...",
            "eval_loss": 1.9}``. ``bleu``/``sacrebleu`` and ``perplexity``/``ppl`` go into the ``model-index``
            (the ``eval_``/``test_`` prefix gives the split); every other number is listed in the card's body.
        dataset: the training data: its Hub id (``"bentrevett/multi30k"``, also the front matter's ``datasets``) or
            words (``"200 support chats"``, the body); None: what the folder's card recorded, else not recorded.
        languages: ISO codes of the languages, e.g. ``["de", "en"]``.
        training: training budget and settings, rendered as a table (e.g. ``{"steps": 20000, "GPU hours": 1.5}``).
        eval_subsets: splits scored on their first rows only, ``{split: (rows scored, rows in the file)}`` (the
            scripts' ``--max_eval_samples``): the card says so, and the model-index names the split ``split[:N]``.
        repo_id: Hub repository the card describes (used in the loading snippet); defaults to the folder name.
        license: license identifier of the weights; None: the base model's where it states one
            (``base_model_provenance``), else the one the folder's config records (a conversion's ``provenance``,
            source_provenance.py), else ``unknown``: never a default the source did not state.
        base_model: the model this one was fine-tuned from (a Hub id or a local folder, e.g. a converted model). The
            card names its Hub id where known (``base_model_provenance``, the folder's recorded ``provenance``) and
            otherwise says "a local model": never a path of this machine. None: the folder's recorded provenance.
        base_model_id: the Hub id the card names as the base model (CLI ``--base-model``), over the recorded one;
            the card says the model is based on it.
        trained_in: the folder a run saved the model in (default: ``folder``; ``tiednorm-push`` renders into a
            staging folder): what it says of its training (conversion/training_record.py) gives "Fine-tuned from ...
            with ...", whatever saved it (TRL's ``save_model`` too).
        license_name, license_link: an ``other`` license's name and link (CLI ``--license-name`` /
            ``--license-link``), over those the folder records; refused with any other license.
    """
    folder = Path(folder)
    config = load_tiednorm_config(folder)
    check_base_model_id(base_model_id)
    if base_model_id is not None:
        config.provenance = {**(getattr(config, PROVENANCE, None) or {}), "base_model": base_model_id}
    source_id, license, source = card_provenance(config, base_model, license)
    details = license_details(config, license, license_name, license_link)
    # What was done to the weights: by this run (base_model), or what the folder says, whatever saved it.
    record = training_record.read_training_record(Path(trained_in) if trained_in is not None else folder, dataset)
    fine_tuned = base_model is not None or training_record.trained(record)
    dataset = record.data if record is not None else None
    results, signature = parse_metrics(metrics or {})
    eval_subsets = {**metric_subsets(metrics), **(eval_subsets or {})}  # the run saved them with its metrics
    subsets = {split: used for split, (used, total) in (eval_subsets or {}).items() if used < total}
    results = [(f"{split}[:{subsets[split]}]" if split in subsets else split, name, value)
               for split, name, value in results]
    if results and dataset is None:
        raise ValueError("metrics were given without `dataset`: the model-index needs the evaluation dataset's id")
    if repo_id is not None:
        check_repo_id(repo_id)
    repo_id = repo_id or folder.resolve().name
    model_name = repo_id.split("/")[-1]
    is_encoder_decoder = config.is_encoder_decoder
    mode = get_head_mode(config.head_mode)  # its equation and paper (head/modes.py)
    tags = ["tiednorm", config.head_mode, "translation" if is_encoder_decoder else "text-generation"]
    tags += family_of_config(config).card_tags(config)
    tied = config.tie_word_embeddings
    citations = ([LIU_ET_AL_BIBTEX] if mode.cites_liu_et_al else []) + ([PRESS_WOLF_BIBTEX] if tied else [])

    card_data = ModelCardData(
        library_name="transformers",
        pipeline_tag="translation" if is_encoder_decoder else "text-generation",
        tags=tags,
        language=languages,
        datasets=[dataset] if training_record.is_dataset_id(dataset) else None,  # words: the body and the record
        license=license,
        **details,
        base_model=source_id,
        model_name=model_name,
        eval_results=eval_results(results, signature, dataset, is_encoder_decoder) or None,
        **training_record.record_metadata(record),
    )
    built_in_terms, added_terms = term_rows(config, folder)
    return ModelCard.from_template(
        card_data,
        template_path=str(template_path()),
        model_name=model_name,
        repo_id=repo_id,
        architecture=_architecture_text(config),
        is_encoder_decoder=is_encoder_decoder,
        auto_class="AutoModelForSeq2SeqLM" if is_encoder_decoder else "AutoModelForCausalLM",
        # The one-line pipeline usage, shown when the folder's config records the pipeline (its code ships with it).
        translation_pipeline="tiednorm-translation" in (getattr(config, "custom_pipelines", None) or {}),
        head_mode=config.head_mode,
        mode_equation=mode.equation,
        mode_reference=mode.paper,
        **built_in_terms,
        extra_terms=added_terms,
        tie_topology=_tie_topology_text(config),
        label_smoothing=getattr(config, "label_smoothing", 0.0),  # a converted model has its architecture's loss
        num_parameters=_num_parameters(folder),
        vocab_size=config.vocab_size,
        regularizers=_regularizer_fields(config),
        origin=training_record.origin_text(record, source, from_base=base_model is not None),
        data_line=training_record.data_text(record, languages) if fine_tuned or dataset else "",
        chat_template=not is_encoder_decoder and has_chat_template(folder),
        license_text=license_text(license, details),
        training=training_settings(training, metrics),
        results={f"{name} ({split})" if split else name: f"{value:g}" for split, name, value in results},
        subsets=[f"the first {used:,} of {total:,} rows of the {split} split" for split, (used, total)
                 in sorted((eval_subsets or {}).items()) if used < total],
        bleu_signature=signature,
        norm_plot=EMBEDDING_NORM_PLOT if (folder / EMBEDDING_NORM_PLOT).is_file() else None,
        citations=citations,
    )


def write_model_card(folder: str | os.PathLike, **card_options: Any) -> Path:
    """Render README.md into a saved checkpoint folder and return its path.

    ``card_options`` are the keyword arguments of ``render_model_card`` (metrics, dataset, languages, training,
    repo_id, license), documented there.
    """
    card = render_model_card(folder, **card_options)
    path = Path(folder) / "README.md"
    # Write next to the target and rename, so an interrupted write never leaves a truncated card.
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=path.parent, suffix=".tmp", delete=False) as tmp:
        tmp.write(str(card))
    os.replace(tmp.name, path)
    return path


def read_json_object(path: str | None, what: str) -> dict[str, Any] | None:
    """The JSON object in ``path`` (a UTF-8 byte-order mark, as Windows editors write it, is accepted); ``ValueError``
    naming the file and the flag when it is missing, not JSON or not an object."""
    if path is None:
        return None
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what} file not found: {path}")
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8-sig"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{what} file {path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise TypeError(f"{what} file {path} must hold a JSON object, got {type(data).__name__}")
    return data


def add_card_arguments(parser: argparse.ArgumentParser) -> None:
    """The card's content options, shared by this CLI and ``tiednorm-push`` (which renders the card it uploads)."""
    parser.add_argument(
        "--metrics", help="JSON file of evaluation metrics for the card (e.g. the Trainer's test_results.json)"
    )
    parser.add_argument(
        "--training",
        help="JSON file of training settings and budget for the card (e.g. the Trainer's train_results.json, or your "
        'own {"steps": 20000, "GPU hours": 1.5})',
    )
    parser.add_argument(
        "--dataset",
        help="the training data for the card: its Hub id (e.g. bentrevett/multi30k), or words where it has none (e.g. "
        "'200 support chats, 40 held out') (default: what the folder's card recorded, else not recorded)",
    )
    parser.add_argument("--languages", nargs="+", help="ISO language codes for the card, e.g. de en")
    add_provenance_arguments(parser)


def card_inputs_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``render_model_card`` keyword arguments parsed by ``add_card_arguments``, the JSON files read."""
    return {
        "metrics": read_json_object(args.metrics, "--metrics"),
        "dataset": args.dataset,
        "languages": args.languages,
        "training": read_json_object(args.training, "--training"),
    }


def build_parser() -> argparse.ArgumentParser:
    """The ``tiednorm-card`` command line; every option has a help text that names its default."""
    parser = argparse.ArgumentParser(
        prog="tiednorm-card",
        description="Render README.md (the model card) into a saved hf_tiednorm folder (trained or converted) from "
        "its config.json, with the metrics, data and training settings given.",
    )
    parser.add_argument("folder", help="checkpoint folder written by save_pretrained")
    add_card_arguments(parser)
    parser.add_argument(
        "--repo-id", help="Hub repository id used in the card's loading snippet (default: the folder name)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    path = write_model_card(args.folder, repo_id=args.repo_id, **provenance_from_args(args),
                            **card_inputs_from_args(args))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
