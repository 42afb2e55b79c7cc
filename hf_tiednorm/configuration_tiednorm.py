"""Configurations of the two model families: a Marian-style encoder-decoder and a Llama-style causal LM.

Both inherit every architecture field from their HF parent and add the fields of the normalized tied head.
Defaults describe the small Multi30k model (joint 8k vocabulary, d = 256). Invalid values and contradictory
combinations raise ``ValueError`` at construction, naming the field and the allowed values.
"""

from __future__ import annotations

from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import LlamaConfig, MarianConfig

from .normalized_head import HEAD_MODES, LOGIT_SCALES

TIE_TOPOLOGIES = ("untied", "decoder", "three_way")


@dataclass
class TiedNormHeadConfigMixin:
    """Fields of the normalized tied output head, shared by both model families."""

    # How the output layer scores token i against the decoder state h: one of HEAD_MODES
    # ("baseline", "l2", "square", "distance", "cosine"); see hf_tiednorm/normalized_head.py.
    head_mode: str = "cosine"
    # Multiplier g on the logits: "none", "fixed" (a constant), "scalar" or "vector" (learned, per token).
    logit_scale: str = "none"
    # g for "fixed", its initial value for "scalar"/"vector"; None means sqrt(hidden size).
    logit_scale_init: float | None = None
    # Floor on the row norms, so zero rows never divide by zero.
    norm_eps: float = 1e-6
    # Label smoothing of the model's own cross-entropy (set it here rather than in the Trainer, so that
    # regularizer terms added to the model's loss are kept).
    label_smoothing: float = 0.0

    def _validate_head_fields(self) -> None:
        if self.head_mode not in HEAD_MODES:
            raise ValueError(f"head_mode must be one of {HEAD_MODES}, got {self.head_mode!r}")
        if self.logit_scale not in LOGIT_SCALES:
            raise ValueError(f"logit_scale must be one of {LOGIT_SCALES}, got {self.logit_scale!r}")
        if self.logit_scale == "none" and self.logit_scale_init is not None:
            raise ValueError(
                f"logit_scale_init={self.logit_scale_init} is set but logit_scale='none'; "
                f"choose a logit_scale among {LOGIT_SCALES[1:]} or leave logit_scale_init unset"
            )
        if self.logit_scale_init is not None and not self.logit_scale_init > 0:
            raise ValueError(f"logit_scale_init must be > 0, got {self.logit_scale_init}")
        if not self.norm_eps > 0:
            raise ValueError(f"norm_eps must be > 0, got {self.norm_eps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


@strict
class TiedNormSeq2SeqConfig(MarianConfig, TiedNormHeadConfigMixin):
    """A Marian/BART-style encoder-decoder whose output layer is the normalized tied head.

    Tie topologies (Press & Wolf, 2017, Section 5):
      * ``"three_way"``: encoder input = decoder input = output embedding; needs one shared vocabulary;
      * ``"decoder"``: decoder input = output embedding, the encoder has its own (``decoder_vocab_size`` may differ);
      * ``"untied"``: three separate matrices (the head mode still applies to the output matrix).
    ``tie_word_embeddings`` and ``share_encoder_decoder_embeddings`` follow from ``tie_topology``; passing
    values that contradict it is an error.
    """

    model_type = "tiednorm_seq2seq"

    # Joint subword vocabulary (source and target) of the encoder; the decoder's unless decoder_vocab_size is set.
    vocab_size: int = 8000
    # Longest sequence the sinusoidal position table covers.
    max_position_embeddings: int = 256
    # Model width d; also the embedding size, so embeddings and hidden states live in one space.
    d_model: int = 256
    encoder_layers: int = 3
    encoder_ffn_dim: int = 1024
    encoder_attention_heads: int = 4
    decoder_layers: int = 3
    decoder_ffn_dim: int = 1024
    decoder_attention_heads: int = 4
    # Multiply embeddings by sqrt(d) as in Vaswani et al. (Marian's default for trained-from-scratch models).
    scale_embedding: bool = True
    # Special token ids of the tokenizer that hf_tiednorm trains: <pad>=0, <s>=1, </s>=2, <unk>=3.
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int = 1
    forced_eos_token_id: int | list[int] | None = None
    # Which embeddings share one matrix: one of TIE_TOPOLOGIES.
    tie_topology: str = "three_way"
    # Derived from tie_topology when left unset.
    tie_word_embeddings: bool | None = None
    share_encoder_decoder_embeddings: bool | None = None

    def __post_init__(self, **kwargs):
        self._validate_head_fields()
        if self.tie_topology not in TIE_TOPOLOGIES:
            raise ValueError(f"tie_topology must be one of {TIE_TOPOLOGIES}, got {self.tie_topology!r}")
        implied = {
            "tie_word_embeddings": self.tie_topology != "untied",
            "share_encoder_decoder_embeddings": self.tie_topology == "three_way",
        }
        for field, value in implied.items():
            given = getattr(self, field)
            if given is not None and given != value:
                raise ValueError(
                    f"{field}={given} contradicts tie_topology={self.tie_topology!r} (which implies {value}); "
                    f"set tie_topology to one of {TIE_TOPOLOGIES} and leave {field} unset"
                )
            setattr(self, field, value)
        if self.tie_topology == "three_way" and self.decoder_vocab_size not in (None, self.vocab_size):
            raise ValueError(
                f"tie_topology='three_way' needs one shared vocabulary, but decoder_vocab_size="
                f"{self.decoder_vocab_size} != vocab_size={self.vocab_size}; use tie_topology='decoder' or 'untied'"
            )
        super().__post_init__(**kwargs)


@strict
class TiedNormCausalConfig(LlamaConfig, TiedNormHeadConfigMixin):
    """A Llama-style decoder-only LM whose output layer is the normalized tied head."""

    model_type = "tiednorm_causal"

    vocab_size: int = 8000
    hidden_size: int = 256
    # Width of the SwiGLU feed-forward block.
    intermediate_size: int = 768
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    max_position_embeddings: int = 512
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    # Input embedding = output embedding (Press & Wolf, 2017). False gives the untied control.
    tie_word_embeddings: bool = True

    def __post_init__(self, **kwargs):
        self._validate_head_fields()
        super().__post_init__(**kwargs)


__all__ = ["TIE_TOPOLOGIES", "TiedNormCausalConfig", "TiedNormHeadConfigMixin", "TiedNormSeq2SeqConfig"]
