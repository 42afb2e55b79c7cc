"""The configuration of the Marian-style family (``TiedNormSeq2SeqConfig``): Marian's fields, the normalized tied
head's and the techniques' (configuration.py), the tie topology and the small model's defaults."""

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig

from .configuration import TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin
from .configuration_encoder_decoder import SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin


@strict
class TiedNormSeq2SeqConfig(
    SmallEncoderDecoderConfigMixin,
    TieTopologyConfigMixin,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    MarianConfig,
):
    """A Marian-style encoder-decoder (sinusoidal positions) whose output layer is the normalized tied head."""

    model_type = "tiednorm_seq2seq"

    # Multiply embeddings by sqrt(d) as in Vaswani et al. (Marian's default for trained-from-scratch models).
    scale_embedding: bool = True


__all__ = ["TiedNormSeq2SeqConfig"]
