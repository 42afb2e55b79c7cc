"""Which ``auto_map`` entries of a config are ours: the only remote code a saved or published model may name.

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

# The model wing's module names (hf_tiednorm/*.py without .py): what save_pretrained copies as remote code.
MODEL_WING_MODULES = frozenset(path.stem for path in Path(__file__).resolve().parents[1].glob("*.py"))


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


__all__ = ["MODEL_WING_MODULES", "foreign_auto_map"]
