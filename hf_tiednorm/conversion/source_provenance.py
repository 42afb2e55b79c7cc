"""Where a converted model came from: its source's Hub id and license, recorded in the saved config.

A conversion reads what its source states about itself and writes it into the converted model's config as
``provenance = {"base_model": Hub id or None, "license": license id or None, "name": display name or None}``, plus,
where the source states them, ``license_name`` / ``license_link`` (a ``license: other``), and for a GGUF file
``gguf_file`` (its file name: what was converted is a GGUF file), ``quantization`` (the GGUF type its weights were
dequantized from, e.g. ``Q4_1``) and ``parent_models`` (the Hub ids its ``general.base_model.N.repo_url`` name):

* a folder: its Hub id from its place in the Hugging Face cache (``models--owner--name/snapshots/``) or its
  config's ``_name_or_path`` when that names a repository this machine downloaded (``cached_hub_id``: a name such as
  ``outputs/checkpoint-500`` is a local training path, not a Hub id, issue 48); its license (and a ``license: other``'s
  ``license_name`` / ``license_link``) from its README.md front matter, else its config's ``license``;
* a GGUF file: ``general.license`` (``general.license.name`` / ``general.license.link``), the file type
  (``general.file_type``) when it is quantized; the Hub id of the model it holds from the keys that name its own
  repository (``general.source.huggingface.repository``, a huggingface.co ``general.repo_url`` /
  ``general.source.repo_url`` / ``general.url`` / ``general.source.url``); ``general.name`` as the display name. The
  models it was made *from* (``general.base_model.N.repo_url``: a fine-tune's parent) are its ``parent_models``,
  never its ``base_model``: SmolLM2-135M-Instruct's file names only ``HuggingFaceTB/SmolLM2-135M`` there, and every
  card called the instruct model's conversion a conversion of the base model (issue 58);
* a model in memory: its ``name_or_path`` read as above;
* a source that carries a ``provenance`` itself (a plain export of ours) passes it on;
* the converter's ``--base-model`` / ``--license`` (``base_model=`` / ``license=``) override what was read.

``save_pretrained`` writes the field with the config and ``from_pretrained`` reads it back, so every later step
keeps it: a fine-tuning run saves it with its model, and every card rendered from any of these folders (the training
script's, ``tiednorm-card --metrics``, ``tiednorm-push``, the plain export's) names that base model and license. What
the source does not state stays None: a card then says the license is unknown, never a default.

A license the source states in words rather than as a Hub license id (a GGUF's ``general.license`` "Apache License
2.0") is recorded as ``other`` with those words as its ``license_name``; a ``--license`` given by the user must be a
license id (lowercase, e.g. ``apache-2.0``, ``cc-by-4.0``, ``other``), else it is refused by name (``check_license``).
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

PROVENANCE = "provenance"  # the config field
PROVENANCE_KEYS = ("base_model", "license", "name")
# Recorded only where the source states them.
OPTIONAL_KEYS = ("license_name", "license_link", "gguf_file", "quantization", "parent_models")
# The GGUF keys that name the repository of the model the file holds (general.base_model.N.* name its parents).
_GGUF_OWN_REPOSITORY_KEYS = ("general.source.huggingface.repository", "general.repo_url", "general.source.repo_url",
                             "general.url", "general.source.url")  # fmt: skip
# The form of a Hub license id (apache-2.0, mit, cc-by-nc-4.0, llama3.2, other, unknown).
_LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*")
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


def cached_hub_id(name: str) -> str | None:
    """``name`` when it is a Hub id (``portable_name_or_path``) of a repository in this machine's Hugging Face cache,
    else None. A config's ``_name_or_path`` records where a model was loaded from: ``outputs/checkpoint-500`` has a
    Hub id's form but is a training folder (issue 48); a model loaded by its Hub id was downloaded into the cache."""
    from huggingface_hub import try_to_load_from_cache

    name = portable_name_or_path(name)
    if not name:
        return None
    try:
        found = try_to_load_from_cache(name, "config.json")
    except Exception:  # noqa: BLE001  (a name the cache cannot hold is no downloaded repository)
        return None
    return name if isinstance(found, str) else None


def license_fields(license: str | None, name: str | None = None, link: str | None = None) -> dict[str, Any]:
    """``license`` (and an ``other`` license's ``name`` / ``link``) as provenance fields: a license stated in words
    rather than as a Hub license id becomes ``other`` named by those words."""
    if license is None:
        return {}
    license = license.strip()
    if not _LICENSE_ID.fullmatch(license):
        license, name = "other", name or license
    fields = {"license": license}
    if license == "other":
        fields.update({k: v for k, v in (("license_name", name), ("license_link", link)) if v})
    return fields


def check_license(license: str | None, flag: str = "--license") -> None:
    """``ValueError`` naming ``flag`` when ``license`` is not a Hub license id (``apache-2.0``, not "Apache License
    2.0"): the Hub reads only ids, and a card must not carry one that means nothing there."""
    if license is not None and not _LICENSE_ID.fullmatch(license):
        raise ValueError(
            f"{flag} {license!r} is not a license id: give the Hub's id (lowercase, e.g. apache-2.0, mit, "
            "cc-by-4.0), or `other` for a license the Hub does not list (its name and link, license_name and "
            "license_link in the source's README.md front matter, are recorded by tiednorm-convert and kept by every "
            "card)"
        )


def _front_matter_license(readme: Path) -> dict[str, Any]:
    from huggingface_hub import ModelCard

    try:
        data = ModelCard.load(readme).data
    except Exception:  # noqa: BLE001  (an unreadable card states no license)
        return {}
    if not isinstance(data.license, str):
        return {}
    name, link = (getattr(data, key, None) for key in ("license_name", "license_link"))
    text = [value if isinstance(value, str) else None for value in (name, link)]
    return license_fields(data.license, *text)


def folder_provenance(folder: str | os.PathLike) -> dict[str, Any]:
    """What a source folder (or a Hub id) states about itself (module docstring); None where it states nothing."""
    text = str(folder)
    found = dict.fromkeys(PROVENANCE_KEYS)
    path = Path(text)
    if not path.is_dir():  # a model in memory's name_or_path: a Hub id only where it was downloaded from the Hub
        found["base_model"] = cached_hub_id(text)
        return found
    match = _CACHE_FOLDER.search(path.resolve().as_posix())
    config = {}
    try:
        config = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        pass
    recorded = config.get(PROVENANCE) if isinstance(config.get(PROVENANCE), dict) else {}
    keys = PROVENANCE_KEYS + OPTIONAL_KEYS
    found.update({key: recorded.get(key) for key in keys if recorded.get(key) is not None})
    if found["base_model"] is None:
        cache = portable_name_or_path(f"{match.group(1)}/{match.group(2)}") if match else ""
        names = [str(config.get("_name_or_path") or ""), str(config.get("_model_name_or_path") or "")]
        found["base_model"] = cache or next((cached_hub_id(n) for n in names if cached_hub_id(n)), None)
    if found["license"] is None and (path / "README.md").is_file():
        found.update(_front_matter_license(path / "README.md"))
    if found["license"] is None and isinstance(config.get("license"), str):
        found.update(license_fields(config["license"]))
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

    found.update(license_fields(text("general.license"), text("general.license.name"), text("general.license.link")))
    found["name"] = text("general.name")
    file_type = fields.get("general.file_type")
    if file_type is not None:
        from gguf import LlamaFileType

        try:
            kind = LlamaFileType(int(file_type.contents())).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            kind = f"file type {file_type.contents()}"
        if kind not in ("F32", "F16", "BF16"):
            found["quantization"] = kind
    found["gguf_file"] = Path(path).name
    found["base_model"] = _first_hub_id(text(key) for key in _GGUF_OWN_REPOSITORY_KEYS)
    parents = [_first_hub_id([text(f"general.base_model.{index}.repo_url")]) for index in range(_count(fields))]
    if any(parents):
        found["parent_models"] = [parent for parent in parents if parent]
    return found


def _count(fields) -> int:
    """How many ``general.base_model.N`` entries a GGUF file's ``fields`` hold (``general.base_model.count``, else
    those present)."""
    count = fields.get("general.base_model.count")
    if count is not None:
        return int(count.contents())
    return sum(1 for key in fields if re.fullmatch(r"general\.base_model\.\d+\.repo_url", key))


def _first_hub_id(values) -> str | None:
    """The first of ``values`` that is a Hub id, or a huggingface.co URL of one, as the Hub id; None if none is."""
    for value in values:
        match = _HUB_URL.match(value or "")
        candidate = portable_name_or_path(match.group(1) if match else value or "")
        if candidate and (match or "/" in candidate):
            return candidate
    return None


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
    check_license(license)
    provenance = {key: found.get(key) for key in PROVENANCE_KEYS}
    provenance.update({key: found[key] for key in OPTIONAL_KEYS if found.get(key) is not None})
    if base_model is not None:
        provenance["base_model"] = base_model
    if license is not None:
        provenance["license"] = license
        if license != "other":  # the source's name and link of its own "other" license no longer apply
            provenance.pop("license_name", None)
            provenance.pop("license_link", None)
    setattr(model.config, PROVENANCE, provenance)
    return provenance


def source_text(provenance: dict[str, Any] | None, source_id: str | None = None) -> str | None:
    """How every card names where the weights came from: the Hub id (``source_id``, else the recorded one), else
    the source's own name; for a GGUF file, that it was one (its file name) and the quantization its weights were
    dequantized from; and the parent models the source names (a GGUF's ``general.base_model``), as its parents, never
    as the model converted. None when nothing is recorded."""
    provenance = provenance or {}
    source_id = source_id or provenance.get("base_model")
    name = provenance.get("name")
    text = f"`{source_id}`" if source_id else f"{name} (no Hub id recorded)" if name else None
    gguf_file, quantization = provenance.get("gguf_file"), provenance.get("quantization")
    if quantization:
        file = f"the {quantization} GGUF file `{gguf_file}`" if gguf_file else f"a {quantization} GGUF file"
        rounding = "(the quantization's rounding is in them)"
        text = f"{text or 'a local model'}, its weights dequantized from {file} {rounding}"
    elif gguf_file:
        text = f"{text or 'a local model'}, converted from the GGUF file `{gguf_file}`"
    parents = provenance.get("parent_models") or []
    if parents and text:
        named = ", ".join(f"`{parent}`" for parent in parents)
        text += f"; the source names {named} as its parent model{'s' if len(parents) > 1 else ''}"
    return text


def name_like_source(model, name_or_path: str, same_logits: bool = True):
    """``model`` named as its source was (``name_or_path``, which PEFT's ``adapter_config.json`` records as the base
    model): both conversion routes give the same name. Only the top-level name, which ``save_pretrained`` does not
    write (a saved config names its source by ``provenance`` and, in a wrapped ``text_config``, a Hub id only).

    ``same_logits`` False (a conversion that changes the scores: no lossless start): the config's ``_name_or_path``
    stays empty, as a model built in memory has it. Reloads read it as where *this* model lies: TRL's trainers rebuild
    their reference model from it, and got the unconverted source, whose log-probabilities differ (a DPO margin of
    -0.49 at step 0 instead of 0, silently); with no name they stop at once."""
    model.name_or_path = name_or_path
    model.config._name_or_path = name_or_path if same_logits else ""
    return model



def stated_provenance(source: Path, gguf_file: str | None) -> dict:
    """What the source states about itself: a GGUF file's metadata first, then its folder (source_provenance.py)."""
    found = folder_provenance(source)
    if gguf_file is not None:
        found = {key: value or found[key] for key, value in gguf_provenance(source / gguf_file).items()}
    return found


__all__ = [
    "stated_provenance",
    "OPTIONAL_KEYS",
    "PROVENANCE",
    "cached_hub_id",
    "check_base_model_id",
    "check_license",
    "folder_provenance",
    "gguf_provenance",
    "license_fields",
    "name_like_source",
    "portable_name_or_path",
    "record_provenance",
    "source_text",
]
