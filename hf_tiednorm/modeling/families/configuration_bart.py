"""The configuration of the BART-style family (``TiedNormBartConfig``): BART's fields, the normalized tied head's and
the techniques' (configuration.py), the tie topology and the small model's defaults."""

from huggingface_hub.dataclasses import strict
from transformers import BartConfig

from .configuration import TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin
from .configuration_encoder_decoder import SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin


@strict
class TiedNormBartConfig(
    SmallEncoderDecoderConfigMixin,
    TieTopologyConfigMixin,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    BartConfig,
):
    """A BART-style encoder-decoder (learned positions, embedding LayerNorm) whose output layer is the normalized
    tied head; the family that BART checkpoints convert to. ``scale_embedding`` keeps BART's default (False)."""

    model_type = "tiednorm_bart"


__all__ = ["TiedNormBartConfig"]
