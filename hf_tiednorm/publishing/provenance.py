"""Where a model came from, as a published card may say it: a Hub id and a license, never a path of this machine.

Fine-tuning or converting from a local folder wrote ``base_model: /abs/local/path`` into the card (an invalid Hub
``base_model`` and a leak of the machine's layout), and every card claimed ``apache-2.0`` whatever the source's
license. ``base_model_provenance`` turns the source given to a run into what can be published: its Hub id where
it is known (the source given as a repo id; a folder in the Hugging Face cache, ``models--owner--name/snapshots/``;
a config whose ``_name_or_path`` is a repo id), else nothing ("a local model"), and the source's license from its
own card (or config) where it states one. ``local_paths_in`` finds absolute paths of this machine in a text, for
staging to refuse.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from huggingface_hub import ModelCard
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

_CACHE_FOLDER = re.compile(r"models--([\w.-]+?)--([\w.-]+)(?:/|$)")
# Candidate absolute paths in a text: two or more components.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.:/~-])/[\w.@+-]+(?:/[\w.@+-]+)+")


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
    """(Hub id, license) of the model a run started from, each None where it is not known. A local folder's id comes
    from its place in the Hugging Face cache or its config's ``_name_or_path``; its license from its README.md front
    matter, else its config's ``license``."""
    if source is None:
        return None, None
    folder = Path(source)
    if not folder.is_dir():
        return hub_id(source), None
    repo_id = None
    match = _CACHE_FOLDER.search(folder.resolve().as_posix())
    if match:
        repo_id = hub_id(f"{match.group(1)}/{match.group(2)}")
    config = {}
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        pass
    repo_id = repo_id or hub_id(config.get("_name_or_path")) or hub_id(config.get("_model_name_or_path"))
    license_id = None
    if (folder / "README.md").is_file():
        try:
            license_id = ModelCard.load(folder / "README.md").data.license
        except Exception:  # noqa: BLE001  (an unreadable card states no license)
            license_id = None
    license_id = license_id or config.get("license")
    return repo_id, license_id if isinstance(license_id, str) else None


def local_paths_in(text: str) -> list[str]:
    """The absolute paths of this machine (that exist here) named in ``text``."""
    found = []
    for candidate in _ABSOLUTE_PATH.findall(text):
        path = candidate.rstrip(".,;:)")
        if os.path.exists(path) or os.path.exists(os.path.dirname(path)) and os.path.dirname(path) != "/":
            found.append(path)
    return sorted(set(found))


__all__ = ["base_model_provenance", "hub_id", "local_paths_in"]
