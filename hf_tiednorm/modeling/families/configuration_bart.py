"""The configuration of the BART-style family: BART's fields, the head's, the techniques', the tie topology's."""

from huggingface_hub.dataclasses import strict
from transformers import BartConfig

from .configuration import TiedNormHeadConfigMixin
from .configuration_encoder_decoder import SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin
from .configuration_techniques import TiedNormTechniquesConfigMixin


@strict
class TiedNormBartConfig(SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin, TiedNormHeadConfigMixin,
                         TiedNormTechniquesConfigMixin, BartConfig):  # fmt: skip
    """A BART-style encoder-decoder (learned positions, embedding LayerNorm) whose output layer is the normalized tied
    head; ``scale_embedding`` keeps BART's default (False)."""

    model_type = "tiednorm_bart"


__all__ = ["TiedNormBartConfig"]
