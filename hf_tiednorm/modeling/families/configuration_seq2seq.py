"""The configuration of the Marian-style family: Marian's fields, the head's, the techniques', the tie topology's."""

from huggingface_hub.dataclasses import strict
from transformers import MarianConfig

from .configuration import TiedNormHeadConfigMixin
from .configuration_encoder_decoder import SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin
from .configuration_techniques import TiedNormTechniquesConfigMixin


@strict
class TiedNormSeq2SeqConfig(SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin, TiedNormHeadConfigMixin,
                            TiedNormTechniquesConfigMixin, MarianConfig):  # fmt: skip
    """A Marian-style encoder-decoder (sinusoidal positions) whose output layer is the normalized tied head."""

    model_type = "tiednorm_seq2seq"

    scale_embedding: bool = True  # embeddings times sqrt(d), as in Vaswani et al.


__all__ = ["TiedNormSeq2SeqConfig"]
