"""Every ``auto_map`` rule in one place: a wrapped model's saved folder has the wrapper's own, never the source's
(``drop_source_auto_map``); and which entries of a config are ours (``foreign_auto_map``).

A Hub config often carries an ``auto_map`` under a built-in ``model_type`` (remote code of its own, or stale
entries). Kept inside the wrapper's ``text_config``, it (a) took the wrapper's own entries: ``register_for_auto_class``
reads and writes ``config.auto_map``, which the wrapper config delegates to ``text_config``, so the saved folder had
no top-level ``auto_map`` and did not load with ``trust_remote_code=True`` where hf_tiednorm is not installed; and
(b) named someone else's code (``"AutoModelForCausalLM": "org/repo--modeling.Model"``) that transformers would run to
build the wrapped model from ``text_config`` under ``trust_remote_code=True``. The wrapped architecture is a built-in
one, so its config needs no ``auto_map``: it is removed when the config becomes a wrapper's ``text_config``.

Ours are the only remote code a saved or published model may name.
``auto_map`` tells ``from_pretrained(..., trust_remote_code=True)`` which code to download and run. A base model's
config can carry entries pointing elsewhere (``"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"``), and
``save_pretrained`` keeps the config's entries it does not overwrite, so they would survive fine-tuning and be
uploaded. Our entries name a module of the model wing (``hf_tiednorm/*.py``, copied beside the weights) without a
``repo--`` prefix; ``foreign_auto_map`` returns every other one, for the training wing to drop and for staging to
refuse.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import PreTrainedConfig


def drop_source_auto_map(text_config) -> None:
    """Remove ``auto_map`` from ``text_config`` (a ``PreTrainedConfig`` about to become a wrapper's ``text_config``)
    in place; a dict (converted later) or None is left alone."""
    if isinstance(text_config, PreTrainedConfig):
        text_config.__dict__.pop("auto_map", None)


# The model wing's module names (hf_tiednorm/*.py without .py): what save_pretrained copies as remote code.
MODEL_WING_MODULES = frozenset(path.stem for path in Path(__file__).resolve().parent.glob("*.py"))


def _is_ours(reference: Any) -> bool:
    if reference is None:
        return True
    if isinstance(reference, (list, tuple)):  # a tokenizer's [slow, fast] pair
        return all(_is_ours(item) for item in reference)
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return False
    return reference.rsplit(".", 1)[0] in MODEL_WING_MODULES


def foreign_auto_map(auto_map: dict[str, Any] | None) -> dict[str, Any]:
    """The entries of ``auto_map`` (a config's) that do not name our model wing's code: another repository's
    (``owner/repo--module.Class``) or a module that is not ours. {} when every entry is ours."""
    return {key: value for key, value in (auto_map or {}).items() if not _is_ours(value)}


__all__ = ["MODEL_WING_MODULES", "drop_source_auto_map", "foreign_auto_map"]
