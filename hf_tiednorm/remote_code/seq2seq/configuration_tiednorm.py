# configuration_tiednorm.py: GENERATED from the hf_tiednorm package by utils/generate_remote_code.py (--check: is it current?). Do not edit it.
# The remote code of a saved hf_tiednorm model (what `from_pretrained(..., trust_remote_code=True)` runs) of the family 'seq2seq': 7 package modules, in dependency order, each under a rule naming its file.
# ruff: noqa: E402, E501, I001

import dataclasses
import math
import warnings
from contextlib import nullcontext
from dataclasses import InitVar, dataclass, field
from typing import Literal, get_args

from huggingface_hub.dataclasses import as_validated_field, strict
from transformers import MarianConfig
from transformers.utils.type_validators import interval, positive_int_field


# ------------------------------ hf_tiednorm/modeling/code_writer.py ---------------------------------------------
"""How a saved folder gets its code: the package sets ``CODE_HOOKS`` when imported (conversion/saved_code.py: a save
writes the family's generated files, a load reports a folder whose own code does not run); in a folder's own code
they are None, and transformers copies that code as any remote code."""


CODE_HOOKS: dict = {"save": None, "load": None}  # (config or model, folder) -> context manager; (model, source) -> None


class SavesItsCode:
    """First among a config's or model's bases: its ``save_pretrained`` and ``from_pretrained`` run ``CODE_HOOKS``."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        with nullcontext() if CODE_HOOKS["save"] is None else CODE_HOOKS["save"](self, save_directory):
            return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        if CODE_HOOKS["load"] is not None:
            CODE_HOOKS["load"](loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path)
        return loaded


# ------------------------------ hf_tiednorm/modeling/head/settings.py -------------------------------------------
"""The head's settings as one value, ``HeadSettings``, checked once when made, and the registries of head modes and
learned terms, by name: what a configuration checks without torch."""


LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: "tuple[str, ...]" = get_args(LogitScale)
BUILTIN_HEAD_MODES = ("baseline", "l2", "square", "distance", "cosine")  # one meaning in every process
DEFAULT_HEAD_MODE = "baseline"  # plain tying: a converted model keeps its function
# name -> HeadMode and name -> HeadTerm, filled by the modeling code and hf_tiednorm.register_head_mode / _term.
HEAD_MODE_REGISTRY: "dict[str, object]" = {}
HEAD_TERMS: "dict[str, object]" = {}
# Old name -> new name (TRL, vLLM and Cohere read config.logit_scale as a float multiplier of the logits).
RENAMED_FIELDS = {"logit_scale": "logit_scale_kind"}


def head_mode_names() -> "tuple[str, ...]":
    """The head modes this process knows, built-in and registered."""
    return tuple(dict.fromkeys((*BUILTIN_HEAD_MODES, *HEAD_MODE_REGISTRY)))


def check_head_mode(name) -> "None":
    """``ValueError`` naming ``name`` and the modes this process knows, unless it is one of them."""
    if not isinstance(name, str) or name not in head_mode_names():
        raise ValueError(f"head_mode must be one of {head_mode_names()}, the modes this code defines; got {name!r}. A "
                         "model with a mode registered at runtime (register_head_mode) loads and saves only where it "
                         "is registered: register it")


def renamed_value(old: "str", value, current, given_as: "str", stacklevel: "int"):
    """``value`` given under a renamed field's old name (a FutureWarning ``stacklevel`` frames up, as a ``given_as``);
    ``ValueError`` for a value it never took (a float multiplier) or one contradicting the new field's ``current``."""
    new = RENAMED_FIELDS[old]
    if not (isinstance(value, str) and value in LOGIT_SCALES):
        raise ValueError(f"{old}={value!r}: hf_tiednorm's configs have no {old} field (TRL, vLLM and Cohere read "
                         f"config.{old} as a float multiplier of the logits, which this head would not apply); the "
                         f"head's scale is {new}, one of {LOGIT_SCALES}, with logit_scale_init for its value")
    if current not in ("none", value):
        raise ValueError(f"{old}={value!r} (the old name of {new}) contradicts {new}={current!r}: give {new} only")
    advice = f"Write {new}={value!r}" if given_as == "keyword argument" else "Save the config again to store it"
    warnings.warn(
        f"the {given_as} {old!r} is renamed {new!r} (TRL, vLLM and transformers read config.{old} as a float "
        f"multiplier of the logits); reading {old}={value!r} as {new}={value!r}. {advice}: the old name will stop "
        "working in a future release",
        FutureWarning,
        stacklevel=stacklevel + 1,
    )
    return value


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    """The head's settings as the config fields of the same names (``TiedNormHeadConfigMixin``) describe them;
    ``extra_terms``: registered head terms it learns too."""

    head_mode: "str" = DEFAULT_HEAD_MODE
    logit_scale_kind: "str" = "none"
    logit_scale_init: "float | None" = None
    logit_bias: "bool" = False
    norm_eps: "float" = 1e-6
    extra_terms: "tuple[str, ...]" = field(default=(), metadata={"registry": True})  # no config field of the package's
    logit_scale: "InitVar[str | None]" = None  # logit_scale_kind's old name (a FutureWarning)

    def __post_init__(self, logit_scale: "str | None" = None) -> "None":
        if logit_scale is not None:
            value = renamed_value("logit_scale", logit_scale, self.logit_scale_kind, "keyword argument", 3)
            object.__setattr__(self, "logit_scale_kind", value)
        extra = self.extra_terms
        if isinstance(extra, str) or not isinstance(extra, (tuple, list)) or not all(isinstance(n, str) for n in extra):
            raise ValueError(
                f"extra_terms must be a tuple of registered head term names, got {type(extra).__name__} {extra!r}"
                + (f"; write extra_terms=({extra!r},)" if isinstance(extra, str) else "")
            )
        if len(set(extra)) != len(extra):
            raise ValueError(f"extra_terms names a head term twice: {list(extra)}")
        object.__setattr__(self, "extra_terms", tuple(extra))  # a config.json's list, as the hashable tuple
        switched = sorted(name for name, term in HEAD_TERMS.items() if not term.config_fields)
        unknown = [name for name in self.extra_terms if name not in switched]
        if unknown:
            raise ValueError(f"head term(s) {unknown} are not registered in this process (registered: {switched}): the "
                             "model was trained with a head term registered at runtime (register_head_term); register "
                             "it before loading")
        check_head_mode(self.head_mode)
        if self.logit_scale_kind not in LOGIT_SCALES:
            raise ValueError(f"logit_scale_kind must be one of {LOGIT_SCALES}, got {self.logit_scale_kind!r}")
        if self.logit_scale_init is not None and not 0 < self.logit_scale_init < math.inf:
            raise ValueError(f"logit_scale_init must be > 0 and finite, got {self.logit_scale_init}")
        if self.logit_scale_init is not None and self.logit_scale_kind == "none":
            raise ValueError(f"logit_scale_init={self.logit_scale_init} is set but logit_scale_kind='none'; choose a "
                             "logit_scale_kind among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset")
        if not isinstance(self.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {self.logit_bias!r}")
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @classmethod
    def from_config(cls, config) -> "HeadSettings":
        """The settings a config (any hf_tiednorm config) holds."""
        extra = getattr(config, "extra_terms", None)
        fields = {name: getattr(config, name) for name in cls.field_names()}
        return cls(**fields, extra_terms=() if extra is None else extra)  # a string is refused, not split

    @classmethod
    def field_names(cls) -> "tuple[str, ...]":
        """The settings that are the package's config fields."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("registry"))

    def as_config_fields(self) -> "dict":
        """These settings as config fields; ``extra_terms`` only when one is on."""
        fields = dataclasses.asdict(self)
        if not self.extra_terms:
            del fields["extra_terms"]
        return fields


# ------------------------------ hf_tiednorm/modeling/families/config_fields.py ----------------------------------
"""The configs' field types and validators, which ``@strict`` runs whenever a field is set."""


LossImplementation = Literal["auto", "fused", "chunked", "plain"]  # loss/policy.LOSS_IMPLEMENTATIONS


@as_validated_field
def positive_finite_field(value: float | None) -> None:
    """> 0 and finite, or None (unset): an inf scale or eps makes the loss nan (inf · 0) or the softmax uniform."""
    if value is not None and not 0 < value < math.inf:
        raise ValueError(f"Value must be > 0 and finite, got {value}")


@as_validated_field
def non_negative_field(value: float | None) -> None:
    """>= 0, or None (unset)."""
    if value is not None and not value >= 0:
        raise ValueError(f"Value must be >= 0, got {value}")


head_mode_field = as_validated_field(check_head_mode)  # a registered head mode, or an error naming the known ones
# Widths and vocabularies must be >= 1 (a zero fails much later, e.g. with ZeroDivisionError), layer counts >= 0.
size_field = positive_int_field
layer_count_field = interval(min=0)


# ------------------------------ hf_tiednorm/modeling/families/configuration.py ----------------------------------
"""The configuration fields every hf_tiednorm model shares: the normalized tied head's (``TiedNormHeadConfigMixin``,
the wrapper's too) and the training techniques' (``TiedNormTechniquesConfigMixin``), listed before a family's HF parent
config. ``@strict`` checks each field's type and range when set, then the ``validate_*`` methods; the head mode's math
is checked where the model is built."""


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormHeadConfigMixin(SavesItsCode):
    """Fields of the normalized tied output head (docs/head.md): ``HeadSettings``' fields, the loss path, and whether
    a conversion started the head's terms losslessly."""

    # How the output layer scores token i against h: baseline w_i·h, l2, square, distance, cosine (head/modes.py).
    head_mode: str = head_mode_field(default=DEFAULT_HEAD_MODE)
    # A multiplier g on the logits: none, fixed (a constant), scalar or vector (learned, one g_i per token).
    logit_scale_kind: LogitScale = "none"
    # g for "fixed", the first g for "scalar"/"vector"; None: 1 when learned, sqrt(hidden size) when fixed.
    logit_scale_init: float | int | None = positive_finite_field(default=None)
    # A learned per-token bias b added to the scores (s_i = g·score_i + b_i), zero at first.
    logit_bias: bool = False
    # A row with norm <= norm_eps is dead: it scores 0 and gets no gradient through its norm.
    norm_eps: float = positive_finite_field(default=1e-6)
    # What computes the training loss: auto, fused, chunked or plain (loss/policy.py).
    loss_implementation: LossImplementation = "auto"
    # Set by a conversion's lossless start: g_i / b_i started from the rows' norms, and so are a resize's new tokens.
    lossless_start: bool = False

    def __post_init__(self, **kwargs):
        for old, new in RENAMED_FIELDS.items():  # config.json or a keyword under a field's old name
            if old in kwargs:
                setattr(self, new, renamed_value(old, kwargs.pop(old), getattr(self, new), "config field", 4))
        super().__post_init__(**kwargs)

    @property
    def head_settings(self) -> HeadSettings:
        """The head's settings as the one value a head is built from (head/settings.py)."""
        return HeadSettings.from_config(self)

    def validate_head_settings(self) -> None:
        HeadSettings.from_config(self)  # every check of the head's settings, once (head/settings.py)


# ------------------------------ hf_tiednorm/modeling/families/configuration_encoder_decoder.py ------------------
"""What both encoder-decoder families' configurations share: the tie topology and the small model's defaults."""


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


# ------------------------------ hf_tiednorm/modeling/families/configuration_techniques.py -----------------------
"""The fields of the training techniques the package's own families implement (docs/techniques.md)."""


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormTechniquesConfigMixin:
    """Fields of the techniques the own families implement in their forward and loss; a wrapped model refuses them."""

    # Output fields the Trainer's evaluation does not collect: the KV cache, the loss terms (regularizers.LOSS_TERMS).
    keys_to_ignore_at_inference = ["cache", "past_key_values", "cross_entropy", "projection_penalty",
                                   "weight_norm_penalty"]  # fmt: skip

    # Label smoothing of the model's own cross-entropy (kept beside the regularizer terms, unlike the Trainer's).
    label_smoothing: float | int = interval(min=0, max=1, exclude_max=True)(default=0.0)
    # Tokens per chunk of the chunked loss (it never holds the tokens × V logits); set, "auto" picks it.
    loss_chunk_size: int | None = positive_int_field(default=None)
    # Press & Wolf's projection P between the decoder output and the head, penalty λ·‖P‖_F (None: no P).
    projection_regularization: float | int | None = non_negative_field(default=None)
    # Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² over the output rows (0: off).
    weight_norm_regularization: float | int = non_negative_field(default=0.0)
    # ν, the row norm the weight-norm regularization pulls towards.
    weight_norm_target: float | int = positive_finite_field(default=2.0)
    # Std of a new model's token embeddings (None: the parent's init_std); the padding row stays zero.
    embedding_init_std: float | None = positive_finite_field(default=None)
    # σ of Herold et al.'s weight-norm initialization, recorded once a new model's rows got norm σ·log(count).
    weight_norm_init_sigma: float | int | None = positive_finite_field(default=None)
    # Adaptive input + tied adaptive softmax (Baevski & Auli): increasing token ids c_1 < ... < V splitting the bands.
    adaptive_cutoffs: list[int] | None = None
    # k of the adaptive bands: band i has width d // k**i.
    adaptive_div_value: float | int = interval(min=1)(default=4.0)
    # Tie each adaptive band's output projection to its input projection too (else only the band rows).
    adaptive_tie_projections: bool = True

    def validate_loss_chunk_size(self) -> None:
        # Refused, not ignored: the plain path and the adaptive softmax materialize the logits, never chunk.
        if self.loss_chunk_size is not None and (self.loss_implementation == "plain" or self.adaptive_cutoffs):
            reader = "the adaptive softmax" if self.adaptive_cutoffs else "loss_implementation='plain'"
            raise ValueError(f"loss_chunk_size={self.loss_chunk_size} (the chunks of the chunked loss of the plain "
                             f"head) does not apply to {reader} (which materializes the logits and never chunks): it "
                             "would be ignored; leave loss_chunk_size unset (null), or use loss_implementation "
                             "'chunked' / 'auto' without adaptive_cutoffs")

    def validate_adaptive_cutoffs(self) -> None:
        cutoffs, vocab_size = self.adaptive_cutoffs, self.vocab_size
        if cutoffs is None:
            return
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0 or cutoffs[-1] >= vocab_size:
            raise ValueError("adaptive_cutoffs must be strictly increasing ints in [1, vocab_size - 1] = [1, "
                             f"{vocab_size - 1}] so that the bands [0, c_1), ..., [c_n-1, {vocab_size}) are non-empty "
                             f"and cover the vocabulary exactly; got {cutoffs}")
        if int(self.hidden_size // self.adaptive_div_value ** len(cutoffs)) < 1:
            raise ValueError(f"the last of {len(cutoffs) + 1} adaptive bands would have width {self.hidden_size} // "
                             f"{self.adaptive_div_value}^{len(cutoffs)} < 1; use fewer adaptive_cutoffs or a smaller "
                             "adaptive_div_value")
        if self.adaptive_tie_projections and not self.tie_word_embeddings:
            raise ValueError("adaptive_tie_projections=True ties the output projections to the input ones, but the "
                             "output layer is untied from the input embedding; tie the embeddings or set "
                             "adaptive_tie_projections=False")
        if self.embedding_init_std is not None:
            raise ValueError("embedding_init_std initializes the plain token embedding; the adaptive bands keep their "
                             "own init: leave one of embedding_init_std / adaptive_cutoffs unset")
        if self.loss_implementation in ("fused", "chunked"):
            raise ValueError(f"loss_implementation={self.loss_implementation!r} (a fused loss of the plain head) does "
                             "not apply to the adaptive softmax; set loss_implementation='auto' or 'plain', or leave "
                             "adaptive_cutoffs unset")


# ------------------------------ hf_tiednorm/modeling/families/configuration_seq2seq.py --------------------------
"""The configuration of the Marian-style family: Marian's fields, the head's, the techniques', the tie topology's."""


@strict
class TiedNormSeq2SeqConfig(SmallEncoderDecoderConfigMixin, TieTopologyConfigMixin, TiedNormHeadConfigMixin,
                            TiedNormTechniquesConfigMixin, MarianConfig):  # fmt: skip
    """A Marian-style encoder-decoder (sinusoidal positions) whose output layer is the normalized tied head."""

    model_type = "tiednorm_seq2seq"

    scale_embedding: bool = True  # embeddings times sqrt(d), as in Vaswani et al.
