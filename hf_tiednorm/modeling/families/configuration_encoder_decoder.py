"""What both encoder-decoder families' configurations share: the tie topology and the small model's defaults."""

from dataclasses import dataclass
from typing import Literal, get_args

from .config_fields import layer_count_field, size_field

TieTopology = Literal["untied", "decoder", "three_way"]
TIE_TOPOLOGIES: tuple[str, ...] = get_args(TieTopology)


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TieTopologyConfigMixin:
    """Which embeddings of an encoder-decoder share one matrix (Press & Wolf 2017, §5): ``three_way`` (encoder input =
    decoder input = output; one vocabulary), ``decoder`` (decoder input = output), ``untied``. ``tie_word_embeddings``
    and ``share_encoder_decoder_embeddings`` follow from it; values contradicting it are refused."""

    # Where the models keep their embeddings (module paths from the LM, read by families/tie_topology.py). No fields.
    shared_embedding_path = "model.shared"
    stack_embedding_paths = ("model.encoder.embed_tokens", "model.decoder.embed_tokens")

    tie_topology: TieTopology = "three_way"
    # Vocabulary of the decoder input and the output layer when it differs from the encoder's; None = vocab_size.
    decoder_vocab_size: int | None = size_field(default=None)
    # Derived from tie_topology when left unset (the HF parents default both to True).
    tie_word_embeddings: bool | None = None
    share_encoder_decoder_embeddings: bool | None = None

    def _implied_tie_flags(self) -> dict[str, bool]:
        tie = self.tie_topology
        return {"tie_word_embeddings": tie != "untied", "share_encoder_decoder_embeddings": tie == "three_way"}

    def __post_init__(self, **kwargs):
        for name, value in self._implied_tie_flags().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        super().__post_init__(**kwargs)

    def validate_tie_topology(self) -> None:
        for name, value in self._implied_tie_flags().items():
            if getattr(self, name) != value:
                raise ValueError(f"{name}={getattr(self, name)} contradicts tie_topology={self.tie_topology!r} (which "
                                 f"implies {value}); set tie_topology to one of {TIE_TOPOLOGIES} and leave {name} "
                                 "unset")
        if self.tie_topology == "three_way" and self.decoder_vocab_size != self.vocab_size:
            raise ValueError("tie_topology='three_way' needs one shared vocabulary, but "
                             f"decoder_vocab_size={self.decoder_vocab_size} != vocab_size={self.vocab_size}; use "
                             "tie_topology='decoder' or 'untied'")
        if self.adaptive_cutoffs is not None and self.tie_topology != "three_way":
            raise ValueError("adaptive_cutoffs needs tie_topology='three_way' (one adaptive embedding shared by "
                             f"encoder, decoder and output layer), got tie_topology={self.tie_topology!r}")


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class SmallEncoderDecoderConfigMixin:
    """The sizes and special tokens both encoder-decoder families default to: the small Multi30k model and the tokenizer
    hf_tiednorm trains."""

    # Joint subword vocabulary (source and target) of the encoder; the decoder's unless decoder_vocab_size is set.
    vocab_size: int = size_field(default=8000)
    # Longest sequence the position table covers (Marian's is sinusoidal, BART's learned).
    max_position_embeddings: int = size_field(default=256)
    # Model width d; also the embedding size, so embeddings and hidden states live in one space.
    d_model: int = size_field(default=256)
    encoder_layers: int = layer_count_field(default=3)  # layers, feed-forward width, heads of each stack
    encoder_ffn_dim: int = size_field(default=1024)
    encoder_attention_heads: int = size_field(default=4)
    decoder_layers: int = layer_count_field(default=3)
    decoder_ffn_dim: int = size_field(default=1024)
    decoder_attention_heads: int = size_field(default=4)
    # The special tokens of the tokenizer hf_tiednorm trains: <pad>=0, <s>=1, </s>=2, <unk>=3.
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    forced_eos_token_id: int | list[int] | None = None


__all__ = ["TIE_TOPOLOGIES", "SmallEncoderDecoderConfigMixin", "TieTopologyConfigMixin", "TieTopology"]
