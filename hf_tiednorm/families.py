"""The model families of hf_tiednorm, described once: ``FAMILIES``.

A family is one HF architecture given the normalized tied head: its config and model classes, the HF parent config
it inherits every architecture field from, the Auto class that builds it, the HF checkpoints that convert to it 1:1
(``tiednorm-convert``), the name its model card gives it, and whether bf16 training on CPU swaps its attention for the
eager one (hf_tiednorm.training.precision). The package's Auto registration (``__init__.py``), the converter, the
model card, the precision choice and the training scripts' ``--model_family`` read this table; the embedding paths of
the tie are declared by each config class (``embedding_paths``, read by tie_topology.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
)

from .configuration_tiednorm import TiedNormBartConfig, TiedNormCausalConfig, TiedNormSeq2SeqConfig
from .modeling_tiednorm_bart import TiedNormBartForConditionalGeneration, TiedNormBartModel
from .modeling_tiednorm_causal import TiedNormCausalModel, TiedNormForCausalLM
from .modeling_tiednorm_seq2seq import TiedNormForConditionalGeneration, TiedNormSeq2SeqModel


@dataclass(frozen=True)
class ModelFamily:
    """One family. ``name`` is what the training scripts' ``--model_family`` and the tests call it."""

    name: str
    config_class: type
    base_model_class: type
    lm_class: type
    auto_class: type
    hf_parent_config: type
    card_name: str
    # The HF checkpoints (model_type, model class) that map 1:1 onto this family.
    source_model_type: str
    source_class: type
    # bf16 on CPU: eager attention with an fp32 softmax instead of SDPA (training/precision.py).
    cpu_bf16_eager_attention: bool = True

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def is_encoder_decoder(self) -> bool:
        return self.auto_class is AutoModelForSeq2SeqLM


FAMILIES: dict[str, ModelFamily] = {
    family.name: family
    for family in (
        ModelFamily(
            "seq2seq", TiedNormSeq2SeqConfig, TiedNormSeq2SeqModel, TiedNormForConditionalGeneration,
            AutoModelForSeq2SeqLM, MarianConfig, "Marian-style encoder-decoder", "marian", MarianMTModel,
        ),
        ModelFamily(
            "bart", TiedNormBartConfig, TiedNormBartModel, TiedNormBartForConditionalGeneration,
            AutoModelForSeq2SeqLM, BartConfig, "BART-style encoder-decoder", "bart", BartForConditionalGeneration,
        ),
        ModelFamily(
            "causal", TiedNormCausalConfig, TiedNormCausalModel, TiedNormForCausalLM,
            AutoModelForCausalLM, LlamaConfig, "Llama-style causal language model", "llama", LlamaForCausalLM,
        ),
    )
}  # fmt: skip


def family_of_model_type(model_type: str) -> ModelFamily | None:
    """The family whose config has ``model_type`` (``tiednorm_bart``, ...), None for any other."""
    return next((family for family in FAMILIES.values() if family.model_type == model_type), None)


def family_of_source(model_type: str) -> ModelFamily | None:
    """The family an HF checkpoint of ``model_type`` (``marian``, ``bart``, ``llama``) converts to 1:1, or None."""
    return next((family for family in FAMILIES.values() if family.source_model_type == model_type), None)


def families(encoder_decoder: bool) -> tuple[str, ...]:
    """The names of the encoder-decoder families (``encoder_decoder``) or of the causal ones."""
    return tuple(name for name, family in FAMILIES.items() if family.is_encoder_decoder == encoder_decoder)


__all__ = ["FAMILIES", "ModelFamily", "families", "family_of_model_type", "family_of_source"]
