"""Configurations of the model families: Marian-style and BART-style encoder-decoders and a Llama-style causal LM.

Each inherits every architecture field from its HF parent and adds, from mixins listed before the parent (their
fields override the parent's), the fields of the normalized tied head, of the training techniques and, for the two
encoder-decoders, the tie topology and the small model's defaults (the small Multi30k model: joint 8k vocabulary,
d = 256). Validation is transformers 5's: ``@strict`` checks every field's type (``Literal`` choices included) and
range (``validated_field``) whenever it is set, then runs the ``validate_*`` methods on the whole config; a bad value
raises a ``StrictDataclass*ValidationError`` naming the field or validator and the cause.
"""

import warnings
from dataclasses import dataclass, field

from huggingface_hub.dataclasses import strict
from transformers import BartConfig, LlamaConfig, MarianConfig
from transformers.utils.type_validators import interval, positive_int_field

from ..auto_map import TwoFileRemoteCodeMixin
from ..head.lossless_start import check_lossless_settings
from ..head.modes import DEFAULT_HEAD_MODE, HEAD_MODES, get_head_mode, head_mode_summaries
from ..head.settings import HeadSettings, LogitScale, renamed_fields_set
from ..head.terms import BUILTIN_TERMS  # noqa: F401 (the built-in head terms every HeadSettings check asks)
from ..loss.regularizers import LOSS_TERMS
from .config_fields import (
    TIE_TOPOLOGIES,
    LossImplementation,
    TieTopology,
    head_mode_field,
    layer_count_field,
    non_negative_field,
    positive_finite_field,
    script_flag,
    size_field,
)


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormHeadConfigMixin(TwoFileRemoteCodeMixin):
    """Fields of the normalized tied output head: every hf_tiednorm config has them (TiedNormWrappedConfig too)."""

    head_mode: str = head_mode_field(
        default=DEFAULT_HEAD_MODE,
        metadata=script_flag(
            "how the output layer scores token i against the decoder state h (hf_tiednorm/modeling/head/modes.py): "
            f"{head_mode_summaries()}",
            choices=HEAD_MODES,
        ),
    )
    logit_scale_kind: LogitScale = field(default="none", metadata=script_flag(
        "multiplier g on the logits: none, fixed (a constant), scalar or vector (learned, one g per token)"))
    logit_scale_init: float | int | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "g for logit_scale_kind fixed, its initial value for scalar/vector; None: 1 for scalar/vector (the "
            "scale-free head at step 0), sqrt(hidden size) for fixed"
        ),
    )
    logit_bias: bool = field(
        default=False,
        metadata=script_flag(
            "a learned per-token bias b added to the scores, zero at initialization (s_i = g·score_i + b_i): where a "
            "normalized head can keep the unigram prior that the row norms carried"
        ),
    )
    norm_eps: float = positive_finite_field(
        default=1e-6,
        metadata=script_flag("lower bound on the row norms: a row with norm <= norm_eps is dead (score 0, no gradient "
                             "through its norm), so zero rows never divide by zero"),
    )
    loss_implementation: LossImplementation = field(
        default="auto",
        metadata=script_flag(
            "what computes the head's training loss (hf_tiednorm/modeling/loss/policy.py): auto (the fastest "
            "path correct for "
            "the device, dtype and options: a fused linear cross-entropy on the folded weight — liger-kernel on CUDA, "
            "torch's where exact, else the chunked loop — once the logits are large, else the plain one), fused "
            "(always a fused path), chunked (the chunked loop) or plain (the materialized logits). A fused path "
            "returns logits=None in training",
            finetune=True,
        ),
    )
    # Set by a conversion's lossless start (head/lossless_start.py): the per-token g_i / b_i started from the rows'
    # norms (not from logit_scale_init / 0), and tokens added by resize_token_embeddings start the same way.
    lossless_start: bool = False

    def __post_init__(self, **kwargs):  # logit_scale, the old name of logit_scale_kind (TRL reads it as a float)
        super().__post_init__(**renamed_fields_set(self, kwargs))

    def validate_lossless_start(self) -> None:
        if self.lossless_start:
            check_lossless_settings(self)  # the head terms a lossless start of head_mode sets (lossless_start.py)

    @property
    def head_settings(self) -> HeadSettings:
        """The head's settings as the one value a head is built from (head/settings.py)."""
        return HeadSettings.from_config(self)

    @property
    def head_options(self) -> HeadSettings:
        """``head_settings`` under its name in 0.1 (a FutureWarning; removed in the next release)."""
        warnings.warn("config.head_options is renamed config.head_settings", FutureWarning, stacklevel=2)
        return self.head_settings

    def validate_head_settings(self) -> None:
        HeadSettings.from_config(self)  # every check of the head's settings, once (head/settings.py)


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormTechniquesConfigMixin:
    """Fields of the training techniques that hf_tiednorm's own families implement in their forward and loss
    (label smoothing, the chunked loss, both regularizers, the initializations, adaptive input/softmax). A wrapped
    model (TiedNormWrappedConfig) trains with its architecture's own loss and refuses them."""

    # The Trainer's evaluation collects every other output field as predictions; the loss terms are scalars.
    keys_to_ignore_at_inference = ["cache", "past_key_values", *LOSS_TERMS]  # the KV cache's names since / before 5.24

    label_smoothing: float | int = interval(min=0, max=1, exclude_max=True)(
        default=0.0,
        metadata=script_flag(
            "label smoothing of the model's own cross-entropy (set here rather than in the Trainer's "
            "--label_smoothing_factor, so that the regularizer terms of the model's loss are kept)",
            finetune=True,
        ),
    )
    loss_chunk_size: int | None = positive_int_field(
        default=None,
        metadata=script_flag(
            "tokens per chunk of the chunked training loss, which never materializes the (tokens × V) logits "
            "(hf_tiednorm/modeling/loss/chunked.py; the forward then returns logits=None): set, it picks the "
            "chunked loop "
            "under loss_implementation auto; None: the chunked loop's default size",
            finetune=True,
        ),
    )
    projection_regularization: float | int | None = non_negative_field(
        default=None,
        metadata=script_flag(
            "Press & Wolf's projection P (H×H, identity init) between the decoder output and the tied head, with "
            "penalty λ·‖P‖_F (paper: λ = 0.15; 0: P unregularized; None: no P; "
            "hf_tiednorm/modeling/loss/regularizers.py). "
            "Fine-tuning may change λ of a model trained with P, never add P",
            finetune=True,
        ),
    )
    weight_norm_regularization: float | int = non_negative_field(
        default=0.0,
        metadata=script_flag(
            "Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² over the output embedding rows "
            "(paper: ρ = 1e-3; 0: off)",
            finetune=True,
        ),
    )
    weight_norm_target: float | int = positive_finite_field(
        default=2.0,
        metadata=script_flag("ν, the row norm the weight-norm regularization pulls towards (paper: 2)", finetune=True),
    )
    embedding_init_std: float | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "std of a new model's token embeddings (and untied output matrix); None: the parent's init_std (0.02). "
            "The paper's fairseq init is d**-0.5 (row norms ≈ 1 instead of 0.02·√d), e.g. 0.0625 at d = 256; "
            "square mode (scores w·h/‖w‖²) needs it. The padding row stays zero"
        ),
    )
    # The config records σ once hf_tiednorm.training.weight_norm_init_ has rescaled the embedding (None: not applied).
    weight_norm_init_sigma: float | int | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "Herold et al.'s weight-norm initialization: a new model's embedding rows get norm σ·log(count), counts "
            "from the tokenized training data; None: HF's random init",
            new_model_only=True,
        ),
    )
    adaptive_cutoffs: list[int] | None = field(
        default=None,
        metadata=script_flag(
            "adaptive input + tied adaptive softmax (Baevski & Auli, 2019): increasing token ids c_1 < … < c_n-1 < V "
            "that split the frequency-ordered vocabulary into bands, such as 2000 6000 (encoder-decoders: "
            "tie_topology three_way); None: plain embedding"
        ),
    )
    adaptive_div_value: float | int = interval(min=1)(
        default=4.0, metadata=script_flag("k of the adaptive bands: band i has width d // k**i")
    )
    adaptive_tie_projections: bool = field(
        default=True,
        metadata=script_flag(
            "tie each adaptive band's output projection to its input projection too (else only the band rows)"
        ),
    )

    def validate_loss_chunk_size(self) -> None:
        # Refused, not ignored (issue 48): the plain path and the adaptive softmax materialize the logits, never chunk.
        if self.loss_chunk_size is not None and (self.loss_implementation == "plain" or self.adaptive_cutoffs):
            reader = "the adaptive softmax" if self.adaptive_cutoffs else "loss_implementation='plain'"
            raise ValueError(
                f"loss_chunk_size={self.loss_chunk_size} (the chunks of the chunked loss of the plain head) does not "
                f"apply to {reader} (which materializes the logits and never chunks): it would be ignored; leave "
                "loss_chunk_size unset (null), or use loss_implementation 'chunked' / 'auto' without adaptive_cutoffs"
            )

    def validate_row_norm_techniques(self) -> None:
        uses_row_norms = self.weight_norm_regularization > 0 or self.weight_norm_init_sigma is not None
        if uses_row_norms and not get_head_mode(self.head_mode).keeps_row_norms:
            raise ValueError(
                "weight_norm_regularization / weight_norm_init_sigma act on row norms, which "
                f"head_mode={self.head_mode!r} removes from both the input lookups and the scores; use another "
                "head_mode or leave them unset"
            )

    def validate_adaptive_cutoffs(self) -> None:
        cutoffs, vocab_size = self.adaptive_cutoffs, self.vocab_size
        if cutoffs is None:
            return
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0 or cutoffs[-1] >= vocab_size:
            raise ValueError(
                f"adaptive_cutoffs must be strictly increasing ints in [1, vocab_size - 1] = [1, {vocab_size - 1}] so "
                f"that the bands [0, c_1), ..., [c_n-1, {vocab_size}) are non-empty and cover the vocabulary exactly; "
                f"got {cutoffs}"
            )
        if int(self.hidden_size // self.adaptive_div_value ** len(cutoffs)) < 1:
            raise ValueError(
                f"the last of {len(cutoffs) + 1} adaptive bands would have width {self.hidden_size} // "
                f"{self.adaptive_div_value}^{len(cutoffs)} < 1; use fewer adaptive_cutoffs or a smaller "
                "adaptive_div_value"
            )
        if self.adaptive_tie_projections and not self.tie_word_embeddings:
            raise ValueError(
                "adaptive_tie_projections=True ties the output projections to the input ones, but the output layer "
                "is untied from the input embedding; tie the embeddings or set adaptive_tie_projections=False"
            )
        if self.embedding_init_std is not None:
            raise ValueError(
                "embedding_init_std initializes the plain token embedding; the adaptive bands keep their own init: "
                "leave one of embedding_init_std / adaptive_cutoffs unset"
            )
        if self.loss_implementation in ("fused", "chunked"):
            raise ValueError(
                f"loss_implementation={self.loss_implementation!r} (a fused loss of the plain head) does not apply to "
                "the adaptive softmax; set loss_implementation='auto' or 'plain', or leave adaptive_cutoffs unset"
            )


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TieTopologyConfigMixin:
    """Which embeddings of an encoder-decoder share one matrix (Press & Wolf, 2017, Section 5), for both
    encoder-decoder families:

      * ``"three_way"``: encoder input = decoder input = output embedding; needs one shared vocabulary;
      * ``"decoder"``: decoder input = output embedding, the encoder has its own (``decoder_vocab_size`` may differ);
      * ``"untied"``: three separate matrices (the head mode still applies to the output matrix).

    ``tie_word_embeddings`` and ``share_encoder_decoder_embeddings`` follow from ``tie_topology``; passing values
    that contradict it is an error.
    """

    # Where the family's models keep their embeddings (module paths from the LM; families/tie_topology.py reads them):
    # the shared matrix of a three-way tie, and the encoder's and decoder's token embeddings. Class attributes, no
    # fields.
    shared_embedding_path = "model.shared"
    stack_embedding_paths = ("model.encoder.embed_tokens", "model.decoder.embed_tokens")

    # Which embeddings share one matrix: one of TIE_TOPOLOGIES.
    tie_topology: TieTopology = "three_way"
    # Vocabulary of the decoder input and the output layer when it differs from the encoder's; None = vocab_size.
    decoder_vocab_size: int | None = size_field(default=None)
    # Derived from tie_topology when left unset (the HF parents default both to True).
    tie_word_embeddings: bool | None = None
    share_encoder_decoder_embeddings: bool | None = None

    def _implied_tie_flags(self) -> dict[str, bool]:
        return {
            "tie_word_embeddings": self.tie_topology != "untied",
            "share_encoder_decoder_embeddings": self.tie_topology == "three_way",
        }

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
                raise ValueError(
                    f"{name}={getattr(self, name)} contradicts tie_topology={self.tie_topology!r} (which implies "
                    f"{value}); set tie_topology to one of {TIE_TOPOLOGIES} and leave {name} unset"
                )
        if self.tie_topology == "three_way" and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"tie_topology='three_way' needs one shared vocabulary, but decoder_vocab_size="
                f"{self.decoder_vocab_size} != vocab_size={self.vocab_size}; use tie_topology='decoder' or 'untied'"
            )
        if self.adaptive_cutoffs is not None and self.tie_topology != "three_way":
            raise ValueError(
                f"adaptive_cutoffs needs tie_topology='three_way' (one adaptive embedding shared by encoder, decoder "
                f"and output layer), got tie_topology={self.tie_topology!r}"
            )


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class SmallEncoderDecoderConfigMixin:
    """The sizes and special tokens both encoder-decoder families default to: the small Multi30k model and the
    tokenizer hf_tiednorm trains (BART-large instead: d = 1024, 12 + 12 layers, 16 heads, FFN 4096, 50265 tokens)."""

    # Joint subword vocabulary (source and target) of the encoder; the decoder's unless decoder_vocab_size is set.
    vocab_size: int = size_field(default=8000)
    # Longest sequence the position table covers (Marian's is sinusoidal, BART's learned).
    max_position_embeddings: int = size_field(default=256)
    # Model width d; also the embedding size, so embeddings and hidden states live in one space.
    d_model: int = size_field(default=256)
    encoder_layers: int = layer_count_field(default=3)
    encoder_ffn_dim: int = size_field(default=1024)
    encoder_attention_heads: int = size_field(default=4)
    decoder_layers: int = layer_count_field(default=3)
    decoder_ffn_dim: int = size_field(default=1024)
    decoder_attention_heads: int = size_field(default=4)
    # Special token ids of the tokenizer that hf_tiednorm trains: <pad>=0, <s>=1, </s>=2, <unk>=3 (BART's own: <s>=0,
    # <pad>=1, decoding starts with </s> and is forced to end with it).
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    forced_eos_token_id: int | list[int] | None = None


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


@strict
class TiedNormCausalConfig(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, LlamaConfig):
    """A Llama-style decoder-only LM whose output layer is the normalized tied head."""

    model_type = "tiednorm_causal"
    # Where its models keep the token embedding (module path from the LM; families/tie_topology.py reads it). No field.
    input_embedding_path = "model.embed_tokens"

    vocab_size: int = size_field(default=8000)
    hidden_size: int = size_field(default=256)
    # Width of the SwiGLU feed-forward block.
    intermediate_size: int = size_field(default=768)
    num_hidden_layers: int = layer_count_field(default=4)
    num_attention_heads: int = size_field(default=4)
    max_position_embeddings: int = size_field(default=512)
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    # Input embedding = output embedding (Press & Wolf, 2017). False gives the untied control.
    tie_word_embeddings: bool = True


__all__ = [
    "TIE_TOPOLOGIES",
    "SmallEncoderDecoderConfigMixin",
    "TieTopologyConfigMixin",
    "TiedNormBartConfig",
    "TiedNormCausalConfig",
    "TiedNormHeadConfigMixin",
    "TiedNormSeq2SeqConfig",
    "TiedNormTechniquesConfigMixin",
    "script_flag",
]
