"""Let transformers' ``Trainer`` recognise this package's causal LMs as causal LMs, for its label smoothing.

With ``TrainingArguments(label_smoothing_factor=...)`` the Trainer takes the labels away from the model and scores
the logits itself (``LabelSmoother``); it shifts the labels (position t predicts token t+1) only when the model's
class name is one of ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values()``. That table lists transformers' own classes
only, and ``AutoModelForCausalLM.register`` does not add to it, so a causal LM of this package was scored against
unshifted labels: a smoothed loss of ~1 where the real one is ~6, and training towards copying the input. Adding the
class name to the table is the one way transformers offers a model class outside it to be shifted; the key is the
model's own ``model_type``, which is not in transformers' config table, so no Auto lookup ever resolves through it
(``_LazyAutoMapping`` reads only keys present in both tables).

A model registers its class when it is built (never on import), so a folder of an encoder-decoder adds nothing to the
table; the package registers every causal row of its family table.
"""

from __future__ import annotations

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES


def recognise_as_causal_lm(model_type: str, class_name: str) -> None:
    """Add ``class_name`` (a causal LM class whose loss shifts the labels) under ``model_type`` to transformers'
    causal-LM class names, which the Trainer's label smoother consults; a ``model_type`` already there is kept."""
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.setdefault(model_type, class_name)


__all__ = ["recognise_as_causal_lm"]
