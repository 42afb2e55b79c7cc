"""The ``auto_map`` of a wrapped model's saved folder is the wrapper's own, never the source's.

A Hub config often carries an ``auto_map`` under a built-in ``model_type`` (remote code of its own, or stale
entries). Kept inside the wrapper's ``text_config``, it (a) took the wrapper's own entries: ``register_for_auto_class``
reads and writes ``config.auto_map``, which the wrapper config delegates to ``text_config``, so the saved folder had
no top-level ``auto_map`` and did not load with ``trust_remote_code=True`` where hf_tiednorm is not installed; and
(b) named someone else's code (``"AutoModelForCausalLM": "org/repo--modeling.Model"``) that transformers would run to
build the wrapped model from ``text_config`` under ``trust_remote_code=True``. The wrapped architecture is a built-in
one, so its config needs no ``auto_map``: it is removed when the config becomes a wrapper's ``text_config``.
"""

from __future__ import annotations

from transformers import PreTrainedConfig


def drop_source_auto_map(text_config) -> None:
    """Remove ``auto_map`` from ``text_config`` (a ``PreTrainedConfig`` about to become a wrapper's ``text_config``)
    in place; a dict (converted later) or None is left alone."""
    if isinstance(text_config, PreTrainedConfig):
        text_config.__dict__.pop("auto_map", None)


__all__ = ["drop_source_auto_map"]
