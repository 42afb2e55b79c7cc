"""The model outputs of the families: transformers' LM outputs plus the terms of the loss, and ``CACHE_FIELD``, the
KV cache's name in the installed transformers (a shim across its 5.24 rename)."""

from __future__ import annotations

from dataclasses import dataclass

from transformers.modeling_outputs import CausalLMOutputWithPast, Seq2SeqLMOutput

from ..loss.regularizers import LossTerms


# The loss terms come first among the bases so that their fields come last: to_tuple() still starts with loss, logits.
@dataclass
class TiedNormCausalLMOutput(LossTerms, CausalLMOutputWithPast):
    """``CausalLMOutputWithPast`` plus the terms of ``loss`` (``regularizers.LossTerms``), when labels are given."""


@dataclass
class TiedNormSeq2SeqLMOutput(LossTerms, Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus the terms of ``loss`` (``regularizers.LossTerms``), when labels are given."""


# The KV cache's name in forward arguments and model outputs: transformers 5.24 renamed ``past_key_values`` to
# ``cache`` (the old name stays a deprecated alias until 5.40). The families pass the cache on through ``**kwargs``
# and return it under the installed version's name, so either version's generate() finds it, without a warning.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


__all__ = ["CACHE_FIELD", "TiedNormCausalLMOutput", "TiedNormSeq2SeqLMOutput"]
