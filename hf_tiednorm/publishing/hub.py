"""Publish a trained hf_tiednorm checkpoint on the Hugging Face Hub.

``push_to_hub`` stages, in a separate folder, exactly what gets uploaded: the weights re-saved as safetensors
together with the modeling code (``save_pretrained`` of a registered model writes ``auto_map`` and copies the code
files, so the repository loads with ``trust_remote_code=True`` without hf_tiednorm installed), the tokenizer, the
model card (README.md; the checkpoint's own card is kept with its loading snippets and title naming ``repo_id``,
not the local folder) and the plots (``*.png``) of the checkpoint folder. It then creates the repository and uploads
the staged folder in one commit with ``huggingface_hub``. With ``dry_run_dir`` it only writes the staged folder there.
The repository id is validated (huggingface_hub's rule) before anything is staged. The checkpoint folder itself is only
read, never modified.

CLI::

    python -m hf_tiednorm.publishing.hub runs/cosine my-user/tiednorm-cosine-multi30k --dataset bentrevett/multi30k \
        --languages de en --metrics runs/cosine/test_results.json [--public] [--dry-run upload_preview/]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import httpx2
from huggingface_hub import CommitInfo, HfApi, ModelCard, get_token
from huggingface_hub.errors import OfflineModeIsEnabled
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from ..convert import copy_tokenizer
from .auto_map import foreign_auto_map
from .export import prepare_plain_upload_folder
from .model_card import (
    add_card_arguments,
    card_inputs_from_args,
    check_repo_id,
    load_tiednorm_config,
    write_model_card,
)
from .provenance import base_model_provenance, hub_id, provenance_from_args, state_provenance
from .staging_checks import check_no_token, check_staged_files, check_tokenizer_files


def _find_tokenizer_source(checkpoint: Path, tokenizer: str | os.PathLike | None) -> Path:
    source = Path(tokenizer) if tokenizer is not None else checkpoint
    if not ((source / "tokenizer.json").is_file() or (source / "tokenizer_config.json").is_file()):
        hint = "" if tokenizer is not None else "; pass the tokenizer folder with `tokenizer=` (CLI: --tokenizer)"
        raise FileNotFoundError(f"no tokenizer (tokenizer.json / tokenizer_config.json) in {source}{hint}")
    return source


def card_for_repo(card_path: Path, repo_id: str) -> ModelCard:
    """The checkpoint's own model card (as the training script wrote it, with its metrics) made to describe
    ``repo_id``: the loading snippets, the title and the model-index name named the local folder."""
    card = ModelCard.load(card_path)
    base = getattr(card.data, "base_model", None)
    if isinstance(base, str) and hub_id(base) is None:  # an older card naming a local folder: publish no path
        source_id, _ = base_model_provenance(base)
        card.data.base_model = source_id
        card.text = card.text.replace(f"Fine-tuned from `{base}`", f"Fine-tuned from `{source_id}`" if source_id
                                      else "Fine-tuned from a local model")
    name = repo_id.split("/")[-1]
    card.text = re.sub(r'(from_pretrained\(|model=)"[^"]*"', lambda match: f'{match.group(1)}"{repo_id}"', card.text)
    card.text = re.sub(r"^# .*$", f"# {name}", card.text, count=1, flags=re.MULTILINE)
    if getattr(card.data, "model_name", None) is not None:
        card.data.model_name = name
    return card


def prepare_upload_folder(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    repo_id: str,
    tokenizer: str | os.PathLike | None = None,
    metrics: dict[str, Any] | None = None,
    dataset: str | None = None,
    languages: list[str] | None = None,
    training: dict[str, Any] | None = None,
    license: str | None = None,
    base_model_id: str | None = None,
) -> Path:
    """Write into ``output_dir`` (new or empty) every file that ``push_to_hub`` uploads, and return it.

    The model card is rendered from the given metrics/dataset/languages/training; when none of them is given and the
    checkpoint already has a README.md (e.g. written by the training script), that card is kept as is. ``license``
    / ``base_model_id`` (CLI ``--license`` / ``--base-model``) state the card's license and base model over what the
    checkpoint records (``model_card.render_model_card``).
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    check_repo_id(repo_id)
    config = load_tiednorm_config(checkpoint)
    tokenizer_source = _find_tokenizer_source(checkpoint, tokenizer)
    if output_dir.resolve() == checkpoint.resolve() or checkpoint.resolve() in output_dir.resolve().parents:
        raise ValueError(f"the upload folder {output_dir} must lie outside the checkpoint folder {checkpoint}")
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} is not empty; choose a new folder for the upload preview")
    check_no_token(checkpoint)
    check_tokenizer_files(tokenizer_source)

    foreign = foreign_auto_map(getattr(config, "auto_map", None))
    if foreign:
        raise ValueError(
            f"{checkpoint / 'config.json'} maps Auto classes to remote code that is not hf_tiednorm's: {foreign}; "
            "the Hub would run it for trust_remote_code=True users. Remove those auto_map entries (a model trained "
            "by our scripts has none) and stage again"
        )
    auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto_class.from_pretrained(checkpoint, dtype="auto")
    # Staged beside the target and renamed into place at the end: a failure leaves no half-written folder (which
    # made the rerun refuse "not empty").
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.staging-", dir=output_dir.parent))
    try:
        # Re-saving (rather than copying) guarantees safetensors weights, the current code files and auto_map.
        model.save_pretrained(partial)
        copy_tokenizer(tokenizer_source, partial)
        for plot in sorted(checkpoint.glob("*.png")):
            shutil.copy2(plot, partial / plot.name)
        card_inputs = {"metrics": metrics, "dataset": dataset, "languages": languages, "training": training}
        if all(value is None for value in card_inputs.values()) and (checkpoint / "README.md").is_file():
            card = card_for_repo(checkpoint / "README.md", repo_id)
            state_provenance(card, license=license, base_model_id=base_model_id)
            card.save(partial / "README.md")
        else:
            write_model_card(partial, repo_id=repo_id, license=license, base_model_id=base_model_id, **card_inputs)
        check_staged_files(partial)
        if output_dir.exists():
            output_dir.rmdir()  # empty (checked above)
        os.replace(partial, output_dir)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return output_dir


def push_to_hub(
    checkpoint: str | os.PathLike,
    repo_id: str,
    *,
    tokenizer: str | os.PathLike | None = None,
    private: bool = True,
    commit_message: str = "Upload hf_tiednorm model",
    token: str | None = None,
    dry_run_dir: str | os.PathLike | None = None,
    metrics: dict[str, Any] | None = None,
    dataset: str | None = None,
    languages: list[str] | None = None,
    training: dict[str, Any] | None = None,
    plain: bool = False,
    license: str | None = None,
    base_model_id: str | None = None,
) -> CommitInfo | Path:
    """Upload model + tokenizer + remote code + model card + plots of ``checkpoint`` to the Hub repo ``repo_id``.

    Returns the ``CommitInfo`` of the upload, or, with ``dry_run_dir``, the folder that would have been uploaded.
    The endpoint is huggingface_hub's (``HF_ENDPOINT``); the token is ``token``, else ``HF_TOKEN`` or the one saved
    by ``hf auth login``. With ``plain``, the upload is the plain export of ``checkpoint`` (``export.py``: the
    parent architecture, no remote code) with its own card. ``license`` / ``base_model_id``: the card's license and
    base model over what the checkpoint records (CLI ``--license`` / ``--base-model``).
    """
    # The path first: a typo in it is the likelier mistake, and the token error would hide it.
    if not Path(checkpoint).is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {checkpoint}")
    check_repo_id(repo_id)
    card_inputs = {"metrics": metrics, "dataset": dataset, "languages": languages, "training": training}
    stated = {"license": license, "base_model_id": base_model_id}

    def prepare(source, folder, **options):
        if not plain:
            return prepare_upload_folder(source, folder, **options, **stated)
        folder = prepare_plain_upload_folder(source, folder, **options)
        card = ModelCard.load(Path(folder) / "README.md")
        state_provenance(card, **stated)
        card.save(Path(folder) / "README.md")
        return folder

    if dry_run_dir is not None:
        return prepare(checkpoint, dry_run_dir, repo_id=repo_id, tokenizer=tokenizer, **card_inputs)

    # Fail before any work when there is no way to authenticate.
    token = token or get_token()
    if token is None:
        raise OSError(
            "no Hugging Face token found: log in with `hf auth login`, set the HF_TOKEN environment variable or pass "
            "`token=` (CLI: --token); use --dry-run to only build the folder"
        )
    api = HfApi(token=token)
    with tempfile.TemporaryDirectory(prefix="tiednorm_upload_") as staging:
        folder = prepare(checkpoint, staging, repo_id=repo_id, tokenizer=tokenizer, **card_inputs)
        try:
            api.create_repo(repo_id, private=private, exist_ok=True)
        except (httpx2.TransportError, OfflineModeIsEnabled) as err:
            raise ConnectionError(
                f"cannot reach the Hub at {api.endpoint} ({err}); check the network, HF_ENDPOINT and HF_HUB_OFFLINE. "
                f"Nothing was uploaded and {checkpoint} is unchanged."
            ) from err
        return api.upload_folder(repo_id=repo_id, folder_path=folder, commit_message=commit_message)


def build_parser() -> argparse.ArgumentParser:
    """The ``tiednorm-push`` command line; every option has a help text that names its default."""
    parser = argparse.ArgumentParser(
        prog="tiednorm-push",
        description="Upload an hf_tiednorm checkpoint to the Hugging Face Hub with its code, tokenizer, model card and "
        "plots, so that it loads with trust_remote_code=True where hf_tiednorm is not installed. The checkpoint "
        "folder is only read.",
    )
    parser.add_argument("checkpoint", help="folder written by save_pretrained")
    parser.add_argument("repo_id", help="Hub repository, e.g. my-user/tiednorm-cosine-multi30k")
    parser.add_argument("--tokenizer", help="tokenizer folder, when the checkpoint folder has none")
    parser.add_argument("--public", action="store_true", help="create a public repository (default: private)")
    parser.add_argument(
        "--commit-message", default="Upload hf_tiednorm model", help="commit message on the Hub (default: %(default)s)"
    )
    parser.add_argument("--token", help="Hub token (default: HF_TOKEN or the token saved by `hf auth login`)")
    parser.add_argument("--dry-run", metavar="DIR", help="only write the folder that would be uploaded into DIR")
    parser.add_argument(
        "--plain",
        action="store_true",
        help="upload the plain export instead (tiednorm-export: the parent architecture with the head baked in, "
        "loadable without trust_remote_code; default: the hf_tiednorm model with its code)",
    )
    add_card_arguments(parser)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = push_to_hub(
        args.checkpoint,
        args.repo_id,
        tokenizer=args.tokenizer,
        private=not args.public,
        commit_message=args.commit_message,
        token=args.token,
        dry_run_dir=args.dry_run,
        plain=args.plain,
        **provenance_from_args(args),
        **card_inputs_from_args(args),
    )
    print(f"wrote the upload folder {result}" if args.dry_run else f"uploaded: {result.commit_url}")


if __name__ == "__main__":
    main()
