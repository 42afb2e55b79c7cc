"""Where a converted model came from: its source's Hub id and license, recorded in the saved config.

A conversion reads what its source states about itself and writes it into the converted model's config as
``provenance = {"base_model": Hub id or None, "license": license id or None, "name": display name or None}``:

* a folder: its Hub id from its place in the Hugging Face cache (``models--owner--name/snapshots/``) or its
  config's ``_name_or_path`` when that is a Hub id; its license from its README.md front matter, else its config's
  ``license``;
* a GGUF file: ``general.license``; a Hub id from ``general.source.huggingface.repository`` or a huggingface.co
  ``general.*repo_url``; ``general.name`` as the display name (a GGUF names no Hub id of its own);
* a model in memory: its ``name_or_path`` read as above;
* a source that carries a ``provenance`` itself (a plain export of ours) passes it on;
* the converter's ``--base-model`` / ``--license`` (``base_model=`` / ``license=``) override what was read.

``save_pretrained`` writes the field with the config and ``from_pretrained`` reads it back, so every later step
keeps it: a fine-tuning run saves it with its model, and every card rendered from any of these folders (the training
script's, ``tiednorm-card --metrics``, ``tiednorm-push``, the plain export's) names that base model and license. What
the source does not state stays None: a card then says the license is unknown, never a default.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

PROVENANCE = "provenance"  # the config field
PROVENANCE_KEYS = ("base_model", "license", "name")
# A Hub model id: "name" or "owner/name" of letters, digits, '-', '_', '.'.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")
_CACHE_FOLDER = re.compile(r"models--([\w.-]+?)--([\w.-]+)(?:/|$)")
_HUB_URL = re.compile(r"https?://(?:www\.)?huggingface\.co/([\w.-]+/[\w.-]+)/?$")


def portable_name_or_path(name: str) -> str:
    """``name`` (a config's ``_name_or_path``) if it is a Hub model id, else "" : an absolute path, or a path
    that exists on this machine, describes where the source lay here (e.g. a GGUF file in site-packages) and means
    nothing, or leaks a user's folder names, where the saved conversion is used."""
    if not name or os.path.isabs(name) or os.path.exists(name) or "\\" in name or not _HUB_ID.fullmatch(name):
        return ""
    return name


def _front_matter_license(readme: Path) -> str | None:
    from huggingface_hub import ModelCard

    try:
        value = ModelCard.load(readme).data.license
    except Exception:  # noqa: BLE001  (an unreadable card states no license)
        return None
    return value if isinstance(value, str) else None


def folder_provenance(folder: str | os.PathLike) -> dict[str, Any]:
    """What a source folder (or a Hub id) states about itself (module docstring); None where it states nothing."""
    text = str(folder)
    found = dict.fromkeys(PROVENANCE_KEYS)
    path = Path(text)
    if not path.is_dir():
        found["base_model"] = portable_name_or_path(text) or None
        return found
    match = _CACHE_FOLDER.search(path.resolve().as_posix())
    config = {}
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    recorded = config.get(PROVENANCE) if isinstance(config.get(PROVENANCE), dict) else {}
    found.update({key: recorded.get(key) for key in PROVENANCE_KEYS if recorded.get(key) is not None})
    if found["base_model"] is None:
        candidates = [f"{match.group(1)}/{match.group(2)}" if match else ""]
        candidates += [str(config.get("_name_or_path") or ""), str(config.get("_model_name_or_path") or "")]
        found["base_model"] = next((portable_name_or_path(c) for c in candidates if portable_name_or_path(c)), None)
    if found["license"] is None and (path / "README.md").is_file():
        found["license"] = _front_matter_license(path / "README.md")
    if found["license"] is None and isinstance(config.get("license"), str):
        found["license"] = config["license"]
    return found


def gguf_provenance(path: str | os.PathLike) -> dict[str, Any]:
    """What a GGUF file's ``general.*`` metadata states (module docstring); None where it states nothing, or when the
    ``gguf`` package is missing (transformers then says to install it)."""
    found = dict.fromkeys(PROVENANCE_KEYS)
    try:
        from gguf import GGUFReader
    except ImportError:
        return found
    fields = GGUFReader(path).fields

    def text(key: str) -> str | None:
        field = fields.get(key)
        value = field.contents() if field is not None else None
        return value.strip() if isinstance(value, str) and value.strip() else None

    found["license"] = text("general.license")
    found["name"] = text("general.name")
    repository = text("general.source.huggingface.repository")
    urls = [text(key) or "" for key in fields if key.startswith("general.") and key.endswith("repo_url")]
    ids = [repository or ""] + [m.group(1) for url in urls if (m := _HUB_URL.match(url))]
    found["base_model"] = next((portable_name_or_path(i) for i in ids if portable_name_or_path(i)), None)
    return found


def check_base_model_id(base_model: str | None, flag: str = "--base-model") -> None:
    """``ValueError`` naming ``flag`` when ``base_model`` is not a Hub model id (a card's ``base_model`` must be one;
    a local path would also leak this machine's layout)."""
    if base_model is not None and portable_name_or_path(base_model) != base_model:
        raise ValueError(f"{flag} {base_model!r} is not a Hub model id (owner/name); a card's base model must be one")


def record_provenance(
    model, found: dict[str, Any], *, base_model: str | None = None, license: str | None = None
) -> dict[str, Any]:
    """Write ``found`` (what the source states), with ``base_model`` / ``license`` overriding it, into
    ``model.config.provenance``; returns it."""
    check_base_model_id(base_model)
    provenance = {key: found.get(key) for key in PROVENANCE_KEYS}
    if base_model is not None:
        provenance["base_model"] = base_model
    if license is not None:
        provenance["license"] = license
    setattr(model.config, PROVENANCE, provenance)
    return provenance


def name_like_source(model, name_or_path: str):
    """``model`` named as its source was (``name_or_path``, which PEFT's ``adapter_config.json`` records as the base
    model): both conversion routes give the same name. Only the top-level name, which ``save_pretrained`` does not
    write (a saved config names its source by ``provenance`` and, in a wrapped ``text_config``, a Hub id only)."""
    model.name_or_path = name_or_path
    model.config._name_or_path = name_or_path
    return model


__all__ = [
    "PROVENANCE",
    "check_base_model_id",
    "folder_provenance",
    "gguf_provenance",
    "name_like_source",
    "portable_name_or_path",
    "record_provenance",
]
