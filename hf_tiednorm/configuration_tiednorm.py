"""Configurations of the model families: Marian-style and BART-style encoder-decoders and a Llama-style causal LM.

Each inherits every architecture field from its HF parent and adds the fields of the normalized tied head; the two
encoder-decoders add the tie topology too. Defaults describe the small Multi30k model (joint 8k vocabulary,
d = 256). Invalid values and contradictory combinations raise ``ValueError`` at construction, naming the field and
the allowed values. The checks live in ``__post_init__`` rather than in huggingface_hub's ``@strict`` field or class
validators, which raise ``StrictDataclass*ValidationError`` (not a ``ValueError``); its type checks also skip string
annotations (huggingface_hub 1.x), which ``from __future__ import annotations`` makes of every field declared here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from huggingface_hub.dataclasses import strict
from transformers import BartConfig, LlamaConfig, MarianConfig

from .normalized_head import LOGIT_SCALES, check_head_mode
from .regularizers import LOSS_TERMS

TIE_TOPOLOGIES = ("untied", "decoder", "three_way")


@dataclass
class TiedNormHeadConfigMixin:
    """Fields of the normalized tied output head, shared by all model families."""

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
    # Opt-in: compute the training loss this many tokens at a time without materializing the (tokens x V)
    # logits (hf_tiednorm/chunked_loss.py); the forward then returns logits=None. None = the plain path.
    loss_chunk_size: int | None = None
    # Projection regularization (Press & Wolf, 2017): λ of the penalty λ·‖P‖_F on a matrix P (H×H, identity
    # init) inserted between the decoder output and the tied head; 0 keeps P unregularized; None = no P.
    # The paper uses λ = 0.15. See hf_tiednorm/regularizers.py.
    projection_regularization: float | None = None
    # Weight-norm regularization (Herold, Gao & Ney, 2018): ρ of ρ·Σ_k (‖w_k‖ − ν)² over the output embedding
    # rows; 0 disables it. The paper uses ρ = 1e-3.
    weight_norm_regularization: float = 0.0
    # ν, the row norm the weight-norm regularization pulls towards (paper: 2.0).
    weight_norm_target: float = 2.0
    # Std of a new model's token embeddings (every TiedNormEmbedding, and an untied output matrix); None = the
    # parent's init_std / initializer_range (0.02). The paper trained in fairseq, whose embeddings start at
    # N(0, d^-1/2): row norms ≈ 1 instead of 0.02·√d (0.32 at d = 256), which square mode (scores w·h/‖w‖²)
    # needs to train. The padding row stays zero.
    embedding_init_std: float | None = None
    # σ of the weight-norm initialization ‖w_k‖ = σ·log(c_k) that hf_tiednorm.weight_norm_init_ applied to this
    # model (it records it here); None = not applied.
    weight_norm_init_sigma: float | None = None
    # Adaptive input + tied adaptive softmax (Baevski & Auli, 2019): increasing token ids c_1 < … < c_{n-1} < V
    # that split the frequency-ordered vocabulary into bands [0, c_1), …, [c_{n-1}, V); None = plain embedding.
    adaptive_cutoffs: list[int] | None = None
    # k: band i has width d // k^i.
    adaptive_div_value: float = 4.0
    # Tie each band's output projection to its input projection too (else only the band rows are tied).
    adaptive_tie_projections: bool = True

    def _validate_sizes(self, positive: tuple[str, ...], counts: tuple[str, ...]) -> None:
        """Widths and vocabularies must be ints >= 1 (a zero fails much later, e.g. with ZeroDivisionError), layer
        counts ints >= 0; None (unset) is left to the parent config."""
        for name in positive + counts:
            value, low = getattr(self, name), 1 if name in positive else 0
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
                raise ValueError(f"{name} must be an int >= {low}, got {value!r}")

    def _validate_technique_fields(self, hidden_size: int, vocab_size: int, tied: bool) -> None:
        """The regularizer, initialization and adaptive fields (hf_tiednorm/regularizers.py, adaptive.py)."""
        if self.projection_regularization is not None and not self.projection_regularization >= 0:
            raise ValueError(
                f"projection_regularization must be >= 0 (paper: 0.15) or None, got {self.projection_regularization}"
            )
        if not self.weight_norm_regularization >= 0:
            raise ValueError(
                f"weight_norm_regularization must be >= 0 (paper: 1e-3), got {self.weight_norm_regularization}"
            )
        if not self.weight_norm_target > 0:
            raise ValueError(f"weight_norm_target must be > 0 (paper: 2.0), got {self.weight_norm_target}")
        if self.weight_norm_init_sigma is not None and not self.weight_norm_init_sigma > 0:
            raise ValueError(f"weight_norm_init_sigma must be > 0 or None, got {self.weight_norm_init_sigma}")
        if self.embedding_init_std is not None and not 0 < self.embedding_init_std < math.inf:
            raise ValueError(f"embedding_init_std must be > 0 and finite (fairseq: d**-0.5) or None, got "
                             f"{self.embedding_init_std}")
        if self.head_mode == "l2" and (self.weight_norm_regularization > 0 or self.weight_norm_init_sigma is not None):
            raise ValueError(
                "weight_norm_regularization / weight_norm_init_sigma act on row norms, which head_mode='l2' removes "
                "from both the input lookups and the scores; use another head_mode or leave them unset"
            )
        chunk = self.loss_chunk_size
        if chunk is not None and not (isinstance(chunk, int) and chunk > 0):
            raise ValueError(f"loss_chunk_size must be a positive int or None, got {self.loss_chunk_size}")
        if self.adaptive_cutoffs is None:
            return
        cutoffs = self.adaptive_cutoffs
        if (
            not isinstance(cutoffs, list | tuple)
            or not cutoffs
            or any(isinstance(c, bool) or not isinstance(c, int) for c in cutoffs)
            or cutoffs != sorted(set(cutoffs))
            or cutoffs[0] <= 0
            or cutoffs[-1] >= vocab_size
        ):
            raise ValueError(
                f"adaptive_cutoffs must be strictly increasing ints in [1, vocab_size - 1] = [1, {vocab_size - 1}] so "
                f"that the bands [0, c_1), ..., [c_n-1, {vocab_size}) are non-empty and cover the vocabulary exactly; "
                f"got {self.adaptive_cutoffs}"
            )
        if not self.adaptive_div_value >= 1:
            raise ValueError(f"adaptive_div_value must be >= 1, got {self.adaptive_div_value}")
        if int(hidden_size // self.adaptive_div_value ** len(cutoffs)) < 1:
            raise ValueError(
                f"the last of {len(cutoffs) + 1} adaptive bands would have width {hidden_size} // "
                f"{self.adaptive_div_value}^{len(cutoffs)} < 1; use fewer cutoffs or a smaller adaptive_div_value"
            )
        if self.adaptive_tie_projections and not tied:
            raise ValueError(
                "adaptive_tie_projections=True ties the output projections to the input ones, but the output layer "
                "is untied from the input embedding; tie the embeddings or set adaptive_tie_projections=False"
            )
        if self.embedding_init_std is not None:
            raise ValueError(
                "embedding_init_std initializes the plain token embedding; the adaptive bands keep their own init: "
                "leave one of embedding_init_std / adaptive_cutoffs unset"
            )
        if self.loss_chunk_size is not None:
            raise ValueError(
                "loss_chunk_size (the chunked loss of the plain head) does not apply to the adaptive softmax; "
                "leave one of loss_chunk_size / adaptive_cutoffs unset"
            )

    def _validate_head_fields(self) -> None:
        check_head_mode(self.head_mode, self.logit_scale)
        if self.logit_scale == "none" and self.logit_scale_init is not None:
            raise ValueError(
                f"logit_scale_init={self.logit_scale_init} is set but logit_scale='none'; "
                f"choose a logit_scale among {LOGIT_SCALES[1:]} or leave logit_scale_init unset"
            )
        # inf would make the loss nan (inf * 0) or the softmax uniform: finite values only.
        if self.logit_scale_init is not None and not 0 < self.logit_scale_init < math.inf:
            raise ValueError(f"logit_scale_init must be > 0 and finite, got {self.logit_scale_init}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")


@dataclass(init=False, repr=False, eq=False)
class TieTopologyConfigMixin:
    """Which embeddings of an encoder-decoder share one matrix (Press & Wolf, 2017, Section 5), for both
    encoder-decoder families:

      * ``"three_way"``: encoder input = decoder input = output embedding; needs one shared vocabulary;
      * ``"decoder"``: decoder input = output embedding, the encoder has its own (``decoder_vocab_size`` may differ);
      * ``"untied"``: three separate matrices (the head mode still applies to the output matrix).

    ``tie_word_embeddings`` and ``share_encoder_decoder_embeddings`` follow from ``tie_topology``; passing values
    that contradict it is an error. Listed *before* the HF parent config among the bases, so that these fields
    override the parent's (whose tying flags default to True); no dataclass methods, so the parent's are kept.
    """

    # Which embeddings share one matrix: one of TIE_TOPOLOGIES.
    tie_topology: str = "three_way"
    # Vocabulary of the decoder input and the output layer when it differs from the encoder's; None = vocab_size.
    decoder_vocab_size: int | None = None
    # Derived from tie_topology when left unset.
    tie_word_embeddings: bool | None = None
    share_encoder_decoder_embeddings: bool | None = None

    def _validate_seq2seq_fields(self) -> None:
        """Sizes, head fields, the tie topology (setting the flags it implies), then the technique fields."""
        self._validate_sizes(
            positive=("vocab_size", "decoder_vocab_size", "d_model", "encoder_ffn_dim", "decoder_ffn_dim",
                      "encoder_attention_heads", "decoder_attention_heads", "max_position_embeddings"),
            counts=("encoder_layers", "decoder_layers"),
        )
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
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        if self.adaptive_cutoffs is not None and self.tie_topology != "three_way":
            raise ValueError(
                f"adaptive_cutoffs needs tie_topology='three_way' (one adaptive embedding shared by encoder, decoder "
                f"and output layer), got tie_topology={self.tie_topology!r}"
            )
        self._validate_technique_fields(self.d_model, self.vocab_size, tied=self.tie_word_embeddings)


@strict
class TiedNormSeq2SeqConfig(TieTopologyConfigMixin, MarianConfig, TiedNormHeadConfigMixin):
    """A Marian-style encoder-decoder (sinusoidal positions) whose output layer is the normalized tied head.

    The tie topology is ``TieTopologyConfigMixin``'s.
    """

    model_type = "tiednorm_seq2seq"
    # The Trainer's evaluation collects every other output field as predictions; the loss terms are scalars.
    keys_to_ignore_at_inference = ["past_key_values", *LOSS_TERMS]

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

    def __post_init__(self, **kwargs):
        self._validate_seq2seq_fields()
        super().__post_init__(**kwargs)


@strict
class TiedNormBartConfig(TieTopologyConfigMixin, BartConfig, TiedNormHeadConfigMixin):
    """A BART-style encoder-decoder (learned positions, embedding LayerNorm) whose output layer is the normalized
    tied head; the family that BART checkpoints convert to. The tie topology is ``TieTopologyConfigMixin``'s.
    """

    model_type = "tiednorm_bart"
    # The Trainer's evaluation collects every other output field as predictions; the loss terms are scalars.
    keys_to_ignore_at_inference = ["past_key_values", *LOSS_TERMS]

    # Joint subword vocabulary, as TiedNormSeq2SeqConfig (BART: 50265, its byte-level BPE).
    vocab_size: int = 8000
    # Rows of the learned position tables (BART: 1024).
    max_position_embeddings: int = 256
    # The small model of TiedNormSeq2SeqConfig (BART-large: d = 1024, 12 + 12 layers, 16 heads, FFN 4096).
    d_model: int | None = 256
    encoder_layers: int | None = 3
    encoder_ffn_dim: int | None = 1024
    encoder_attention_heads: int | None = 4
    decoder_layers: int | None = 3
    decoder_ffn_dim: int | None = 1024
    decoder_attention_heads: int | None = 4
    # Special token ids of the tokenizer that hf_tiednorm trains: <pad>=0, <s>=1, </s>=2, <unk>=3 (BART: <s>=0,
    # <pad>=1, decoding starts with </s> and is forced to end with it).
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    forced_eos_token_id: int | list[int] | None = None

    def __post_init__(self, **kwargs):
        self._validate_seq2seq_fields()
        super().__post_init__(**kwargs)


@strict
class TiedNormCausalConfig(LlamaConfig, TiedNormHeadConfigMixin):
    """A Llama-style decoder-only LM whose output layer is the normalized tied head."""

    model_type = "tiednorm_causal"
    # The Trainer's evaluation collects every other output field as predictions; the loss terms are scalars.
    keys_to_ignore_at_inference = ["past_key_values", *LOSS_TERMS]

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
        self._validate_sizes(
            positive=("vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                      "max_position_embeddings"),
            counts=("num_hidden_layers",),
        )
        self._validate_head_fields()
        self._validate_technique_fields(self.hidden_size, self.vocab_size, tied=self.tie_word_embeddings)
        super().__post_init__(**kwargs)


__all__ = [
    "TIE_TOPOLOGIES",
    "TieTopologyConfigMixin",
    "TiedNormBartConfig",
    "TiedNormCausalConfig",
    "TiedNormHeadConfigMixin",
    "TiedNormSeq2SeqConfig",
]
