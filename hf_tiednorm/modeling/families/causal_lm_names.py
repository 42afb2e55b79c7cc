"""The Trainer's label smoother shifts the labels only of causal LMs named in transformers'
``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``; a causal LM of the package adds its own model type there when it is built (never
on import), the one entry this code adds to transformers' tables. (docs/code_notes.md)"""

from __future__ import annotations

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def recognise_as_causal_lm(model_type: str, class_name: str) -> None:
    """Add ``class_name`` (a causal LM class whose loss shifts the labels) under ``model_type`` to transformers'
    causal-LM class names, which the Trainer's label smoother consults; a ``model_type`` already there is kept."""
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(model_type, class_name)


__all__ = ["recognise_as_causal_lm"]
