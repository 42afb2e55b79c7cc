"""Where a model came from, as a published card may say it: a Hub id and a license, never a path of this machine.

Fine-tuning or converting from a local folder wrote ``base_model: /abs/local/path`` into the card (an invalid Hub
``base_model`` and a leak of the machine's layout), and every card claimed ``apache-2.0`` whatever the source's
license. ``base_model_provenance`` turns the source given to a run into what can be published: its Hub id where
it is known (the source given as a repo id; a conversion's recorded ``provenance``; a folder in the Hugging Face
cache, ``models--owner--name/snapshots/``; a config whose ``_name_or_path`` is a repo id), else nothing ("a local
model"), and the source's license from its provenance, card or config where one states it (never a default).

"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from ..conversion.source_provenance import (
    PROVENANCE,
    check_base_model_id,
    check_license,
    folder_provenance,
    source_text,
)

# Candidate absolute paths in a text: two or more components.


def hub_id(name: str | os.PathLike | None) -> str | None:
    """``name`` when it is a Hub repo id ("owner/name" or "name") and not a path of this machine, else None."""
    if name is None:
        return None
    text = str(name)
    if text.startswith(("/", ".", "~")) or os.path.exists(text) or "\\" in text:
        return None
    try:
        validate_repo_id(text)
    except HFValidationError:
        return None
    return text


def base_model_provenance(source: str | os.PathLike | None) -> tuple[str | None, str | None]:
    """(Hub id, license) of the model a run started from, each None where it is not known. A local folder's come
    from the provenance its config records (a conversion's source: source_provenance.py), else its place in the
    Hugging Face cache or its config's ``_name_or_path``, and its README.md front matter or its config's
    ``license``."""
    if source is None:
        return None, None
    if not Path(source).is_dir():
        return hub_id(source), None
    found = folder_provenance(source)
    return hub_id(found["base_model"]), found["license"] if isinstance(found["license"], str) else None


# The Hub's license id for "not stated"; the card's body says how to state it.
UNKNOWN_LICENSE = "unknown"
UNKNOWN_LICENSE_TEXT = ("unknown: the source states none (pass `--license` to tiednorm-convert, tiednorm-card or "
                        "tiednorm-push to state it)")


def license_text(license: str, details: dict[str, str] | None = None) -> str:
    """The card body's statement of ``license`` (``details``: an ``other`` license's name and link)."""
    if license == UNKNOWN_LICENSE:
        return UNKNOWN_LICENSE_TEXT
    details = details or {}
    named = ", ".join(value for value in (details.get("license_name"), details.get("license_link")) if value)
    return f"`{license}`" + (f" ({named})" if named else "")


def check_license_details(license: str, name: str | None, link: str | None) -> None:
    """``ValueError`` naming the flags when a license name or link (``--license-name`` / ``--license-link``) is given
    for a card whose license is not ``other``: they describe a license the Hub does not list, and beside ``mit``
    they would be published describing a license they are not."""
    if (name or link) and license != "other":
        given = " / ".join(flag for flag, value in (("--license-name", name), ("--license-link", link)) if value)
        raise ValueError(
            f"{given} describe a license the Hub does not list (license: other), but the card's license is "
            f"{license!r}: pass --license other with them, or leave them out"
        )


def license_details(config, license: str, name: str | None = None, link: str | None = None) -> dict[str, str]:
    """An ``other`` license's ``license_name`` / ``license_link`` for the card's front matter: the ones given
    (``--license-name`` / ``--license-link``), else those the folder records from its source (issue 48: they were
    dropped); {} for any other license (a name or link given for one is refused, ``check_license_details``)."""
    check_license_details(license, name, link)
    if license != "other":
        return {}
    recorded = getattr(config, PROVENANCE, None) or {}
    if recorded.get("license") == "other":
        name, link = name or recorded.get("license_name"), link or recorded.get("license_link")
    return {key: value for key, value in (("license_name", name), ("license_link", link)) if value}


def card_provenance(config, base_model: str | None, license: str | None) -> tuple[str | None, str, str | None]:
    """(Hub id of the base model, license, where the weights came from as every card names it,
    ``source_provenance.source_text``): from ``base_model`` (a run's start), else the folder's recorded provenance;
    the license ``unknown`` where nobody stated one."""
    check_license(license)
    recorded = getattr(config, PROVENANCE, None) or {}
    source_id, source_license = base_model_provenance(base_model)
    source_id = source_id or recorded.get("base_model")
    license = license or source_license or recorded.get("license") or UNKNOWN_LICENSE
    return source_id, license, source_text(recorded, source_id)


def state_provenance(
    card: ModelCard,
    *,
    license: str | None = None,
    base_model_id: str | None = None,
    license_name: str | None = None,
    license_link: str | None = None,
) -> None:
    """Set a rendered card's license (an ``other`` license's name and link too) and base model (CLI ``--license``,
    ``--license-name``, ``--license-link``, ``--base-model``) in its front matter and in the body line that states the
    license, in place; None keeps what the card says."""
    check_base_model_id(base_model_id)
    check_license(license)
    if license is not None or license_name or license_link:
        stated = license or getattr(card.data, "license", None) or UNKNOWN_LICENSE
        check_license_details(stated, license_name, license_link)
        details = {}
        if stated == "other":  # the card's own name and link where none is given and the license stays other
            kept = license is None or getattr(card.data, "license", None) == "other"
            for key, value in (("license_name", license_name), ("license_link", license_link)):
                value = value or (getattr(card.data, key, None) if kept else None)
                if value:
                    details[key] = value
        for key in ("license_name", "license_link"):
            setattr(card.data, key, details.get(key))
        card.text = re.sub(r"^License: .*$", lambda _: f"License: {license_text(stated, details)}.", card.text,
                           count=1, flags=re.MULTILINE)
        card.data.license = stated
    if base_model_id is not None:
        card.data.base_model = base_model_id


def add_provenance_arguments(parser: argparse.ArgumentParser) -> None:
    """--license, --license-name, --license-link, --base-model: what the card states about the model's license and
    source, over what the folder records."""
    parser.add_argument(
        "--license",
        help="license id for the card (default: the one the checkpoint's config records from its source, e.g. by "
        "tiednorm-convert; else unknown, never a default)",
    )
    parser.add_argument(
        "--license-name",
        help="with --license other (or a recorded `other` license): the license's name, e.g. my-license-1.0, for the "
        "card's license_name (default: the one the checkpoint records; refused with any other license)",
    )
    parser.add_argument(
        "--license-link",
        help="with --license other (or a recorded `other` license): a link to the license's text, e.g. LICENSE.md or "
        "https://example.com/LICENSE, for the card's license_link (default: the one the checkpoint records; refused "
        "with any other license)",
    )
    parser.add_argument(
        "--base-model",
        help="Hub id (owner/name) of the model this one is based on, for the card (default: the one the checkpoint's "
        "config records; else none)",
    )


def provenance_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The flags of ``add_provenance_arguments``, checked (a base model must be a Hub id, a license a license id)."""
    check_base_model_id(args.base_model)
    check_license(args.license)
    return {"license": args.license, "base_model_id": args.base_model, "license_name": args.license_name,
            "license_link": args.license_link}


__all__ = [
    "UNKNOWN_LICENSE", "add_provenance_arguments", "base_model_provenance", "card_provenance", "check_license_details",
    "hub_id", "license_details", "license_text", "provenance_from_args", "state_provenance",
]  # fmt: skip
