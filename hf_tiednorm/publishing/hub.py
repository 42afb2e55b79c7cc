"""Publish a trained hf_tiednorm checkpoint on the Hugging Face Hub.

``push_to_hub`` stages, in a separate folder, exactly what gets uploaded: the weights re-saved as safetensors
together with the modeling code (``save_pretrained`` of a registered model writes ``auto_map`` and the two generated
code files, so the repository loads with ``trust_remote_code=True`` without hf_tiednorm installed), the tokenizer, the
model card (README.md; the checkpoint's own card is kept with its loading snippets and title naming ``repo_id``,
not the local folder) and the plots a run writes there (``RUN_PLOTS``; any other image is left out, with a log
line). It then creates the repository and uploads the staged folder in one commit with ``huggingface_hub``. With
``dry_run_dir`` it only writes the staged folder there.
The repository id is validated (huggingface_hub's rule) before anything is staged. The checkpoint folder itself is only
read, never modified.

CLI::

    python -m hf_tiednorm.publishing.hub runs/cosine my-user/tiednorm-cosine-multi30k --dataset bentrevett/multi30k \
        --languages de en --metrics runs/cosine/test_results.json [--public] [--dry-run upload_preview/]
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import CommitInfo, HfApi, ModelCard, get_token
from huggingface_hub.errors import OfflineModeIsEnabled

try:  # huggingface_hub 2.x talks HTTP through httpx2, 1.x (with transformers 5.17, the lowest declared) through httpx
    from httpx2 import TransportError
except ImportError:
    from httpx import TransportError
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

from ..conversion.export import export_plain
from ..conversion.export_card import write_export_card
from ..conversion.saved_code import foreign_auto_map
from ..conversion.staging_checks import (
    check_new_folder,
    check_no_token,
    check_staged_files,
    check_tokenizer_files,
    check_tokenizer_fits,
    copy_tokenizer,
    find_tokenizer,
    staged_folder,
    unshipped_head_mode,
)
from .model_card import (
    EMBEDDING_NORM_PLOT,
    NORM_VS_FREQUENCY_PLOT,
    add_card_arguments,
    card_inputs_from_args,
    check_repo_id,
    load_tiednorm_config,
    write_model_card,
)
from .provenance import base_model_provenance, hub_id, provenance_from_args, state_provenance

logger = logging.getLogger(__name__)

# The plots a training run (or experiments/plot_embedding_norms.py) writes into a model folder: the only images
# published. Any other *.png there (a screenshot dropped in the folder) is not the run's and stays local.
RUN_PLOTS = (EMBEDDING_NORM_PLOT, NORM_VS_FREQUENCY_PLOT)


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
    license_name: str | None = None,
    license_link: str | None = None,
) -> Path:
    """Write into ``output_dir`` (new or empty) every file that ``push_to_hub`` uploads, and return it.

    The model card is rendered from the given metrics/dataset/languages/training; when none of them is given and the
    checkpoint already has a README.md (e.g. written by the training script), that card is kept as is. ``license``
    / ``base_model_id`` / ``license_name`` / ``license_link`` (CLI ``--license`` / ``--base-model`` /
    ``--license-name`` / ``--license-link``) state the card's license and base model over what the checkpoint records
    (``model_card.render_model_card``).
    """
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    check_repo_id(repo_id)
    config = load_tiednorm_config(checkpoint)
    tokenizer_source = find_tokenizer(checkpoint, tokenizer, required=True)
    check_new_folder(output_dir, "upload folder", outside=checkpoint)
    check_no_token(checkpoint)
    check_tokenizer_files(tokenizer_source)
    unshipped = unshipped_head_mode(config.head_mode)
    if unshipped:
        raise ValueError(
            f"{checkpoint}: {unshipped}. Publish the plain export instead (tiednorm-push --plain, "
            "push_to_hub(plain=True): the head baked into its parent architecture, no remote code), or add the mode "
            "to hf_tiednorm/modeling/head/modes.py"
        )

    foreign = foreign_auto_map(getattr(config, "auto_map", None))
    if foreign:
        raise ValueError(
            f"{checkpoint / 'config.json'} maps Auto classes to remote code that is not hf_tiednorm's: {foreign}; "
            "the Hub would run it for trust_remote_code=True users. Remove those auto_map entries (a model trained "
            "by our scripts has none) and stage again"
        )
    auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto_class.from_pretrained(checkpoint, dtype="auto")
    left_out = sorted(path.name for path in checkpoint.glob("*.png") if path.name not in RUN_PLOTS)
    if left_out:
        logger.warning("not staged: %s in %s (only the plots a run writes are published: %s)",
                       ", ".join(left_out), checkpoint, ", ".join(RUN_PLOTS))
    # Staged beside the target and renamed into place at the end: a failure leaves no half-written folder (which
    # made the rerun refuse "not empty").
    with staged_folder(output_dir) as partial:
        # Re-saving (rather than copying) guarantees safetensors weights, the current code files and auto_map.
        model.save_pretrained(partial)
        staged_tokenizer = copy_tokenizer(tokenizer_source, partial)
        check_tokenizer_fits(staged_tokenizer, model, tokenizer_source, checkpoint)
        for name in RUN_PLOTS:
            if (checkpoint / name).is_file():
                shutil.copy2(checkpoint / name, partial / name)
        card_inputs = {"metrics": metrics, "dataset": dataset, "languages": languages, "training": training}
        if all(value is None for value in card_inputs.values()) and (checkpoint / "README.md").is_file():
            card = card_for_repo(checkpoint / "README.md", repo_id)
            state_provenance(card, license=license, base_model_id=base_model_id, license_name=license_name,
                             license_link=license_link)
            card.save(partial / "README.md")
        else:
            write_model_card(partial, repo_id=repo_id, license=license, base_model_id=base_model_id,
                             license_name=license_name, license_link=license_link, trained_in=checkpoint,
                             **card_inputs)
        check_staged_files(partial)
    return output_dir


def prepare_plain_upload_folder(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    repo_id: str,
    tokenizer: str | os.PathLike | None = None,
    **card_inputs,
) -> Path:
    """What ``tiednorm-push --plain`` uploads: the plain export of ``checkpoint`` with its card naming ``repo_id``.

    The export card describes the bake; the metrics/dataset/languages/training of an hf_tiednorm card are not
    rendered on it, so passing them is refused rather than dropped."""
    given = sorted(name for name, value in card_inputs.items() if value is not None)
    if given:
        raise ValueError(
            f"{given} are not shown on the card of a plain export; push the hf_tiednorm model without --plain to "
            "publish them, or leave them out"
        )
    checkpoint, output_dir = Path(checkpoint), Path(output_dir)
    check_new_folder(output_dir, "upload folder", outside=checkpoint)  # the same rule as without --plain (hub.py)
    check_no_token(checkpoint)  # the same publishing guards as the hf_tiednorm upload (hub.py)
    with staged_folder(output_dir) as partial:  # the card and the checks too: all or nothing
        result = export_plain(checkpoint, partial, tokenizer=tokenizer, write_card=False)
        write_export_card(partial, result, repo_id=repo_id, source=checkpoint)
        check_staged_files(partial)
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
    license_name: str | None = None,
    license_link: str | None = None,
) -> CommitInfo | Path:
    """Upload model + tokenizer + remote code + model card + plots of ``checkpoint`` to the Hub repo ``repo_id``.

    Returns the ``CommitInfo`` of the upload, or, with ``dry_run_dir``, the folder that would have been uploaded.
    The endpoint is huggingface_hub's (``HF_ENDPOINT``); the token is ``token``, else ``HF_TOKEN`` or the one saved
    by ``hf auth login``. With ``plain``, the upload is the plain export of ``checkpoint`` (``export.py``: the
    parent architecture, no remote code) with its own card. ``license`` / ``base_model_id`` / ``license_name`` /
    ``license_link``: the card's license (an ``other`` license's name and link) and base model over what the
    checkpoint records (CLI ``--license`` / ``--base-model`` / ``--license-name`` / ``--license-link``).
    """
    # The path first: a typo in it is the likelier mistake, and the token error would hide it.
    if not Path(checkpoint).is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {checkpoint}")
    check_repo_id(repo_id)
    card_inputs = {"metrics": metrics, "dataset": dataset, "languages": languages, "training": training}
    stated = {"license": license, "base_model_id": base_model_id, "license_name": license_name,
              "license_link": license_link}

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
        except (TransportError, OfflineModeIsEnabled) as err:
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
