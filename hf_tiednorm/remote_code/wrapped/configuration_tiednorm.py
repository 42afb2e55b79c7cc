# configuration_tiednorm.py: GENERATED from the hf_tiednorm package by utils/generate_remote_code.py (--check: is it current?). Do not edit it.
# The remote code of a saved hf_tiednorm model (what `from_pretrained(..., trust_remote_code=True)` runs) of the family 'wrapped': 5 package modules, in dependency order, each under a rule naming its file.
# ruff: noqa: E402, E501, I001

import dataclasses
import math
import warnings
from contextlib import nullcontext
from dataclasses import InitVar, dataclass, field
from typing import Any, Literal, get_args

from huggingface_hub.dataclasses import as_validated_field, strict
from transformers import AutoConfig, PreTrainedConfig
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


# ------------------------------ hf_tiednorm/modeling/families/configuration_wrapped.py --------------------------
"""The wrapper's configuration: the wrapped model's own config as ``text_config`` (gpt2, qwen3, t5, ...) beside the
normalized head's fields; every other attribute is read from ``text_config``, so the wrapped architecture's code reads
the wrapper's config unchanged."""


try:  # transformers >= 5.20 declares a composite config's parts with SubConfigSpec
    from transformers.configuration_utils import SubConfigSpec
except ImportError:  # 5.17-5.19 (the lowest setup.cfg declares): a plain {name: config class} dict, `sub_configs`
    SubConfigSpec = None


# Fields of hf_tiednorm's own families that a wrapped model has no code for: it trains with the wrapped model's own
# loss and head, so accepting them would silently ignore them. Refused by name however they arrive: in config.json,
# as from_pretrained keyword arguments, or set as attributes.
OWN_FAMILY_FIELDS = (
    "label_smoothing", "loss_chunk_size", "projection_regularization", "weight_norm_regularization",
    "weight_norm_target", "embedding_init_std", "weight_norm_init_sigma", "adaptive_cutoffs", "adaptive_div_value",
    "adaptive_tie_projections", "tie_topology",
)  # fmt: skip  (TiedNormTechniquesConfigMixin's and tie_topology: test_config_validation.py)

# The settings of what a forward returns, defined by every PreTrainedConfig: set on the wrapper, they are set on the
# wrapped model's config too, whose forward reads them.
OUTPUT_SETTINGS = ("output_hidden_states", "output_attentions", "return_dict")


def drop_source_auto_map(text_config) -> None:
    """Remove ``auto_map`` from ``text_config`` (a config about to become the wrapper's ``text_config``) in place: a
    Hub config's entries (remote code of its own, or stale ones) would take the wrapper's own (the wrapper config
    delegates attributes to ``text_config``) and name someone else's code; the wrapped architecture is built in."""
    if isinstance(text_config, PreTrainedConfig):
        text_config.__dict__.pop("auto_map", None)


def refuse_own_family_fields(names, how: str) -> None:
    """``ValueError`` naming the own-family fields among ``names`` (``how``: where they were given)."""
    unsupported = sorted(set(names) & set(OWN_FAMILY_FIELDS))
    if unsupported:
        hint = (" (label smoothing: the Trainer's label_smoothing_factor / --label_smoothing_factor applies it to a "
                "wrapped model)" if "label_smoothing" in unsupported else "")
        raise ValueError(f"{unsupported} are fields of hf_tiednorm's own model families ({how}); a wrapped model (any "
                         "architecture, trained with its own loss) has no code for them, so they would be ignored: "
                         "drop them, or, for a marian/bart/llama source, convert without --generic to get the own "
                         f"family{hint}")


@strict
class TiedNormWrappedConfig(TiedNormHeadConfigMixin, PreTrainedConfig):
    """text_config (`dict` or `PreTrainedConfig`):
    The config of the wrapped model (its ``model_type`` selects the architecture), which ties its output layer to its
    input embedding. The head's fields are ``TiedNormHeadConfigMixin``'s; ``head_mode="baseline"`` computes the
    wrapped model's logits exactly."""

    model_type = "tiednorm_wrapped"
    # The wrapped model's config is a sub-config, as in HF's composite models: get_text_config() returns it, and the
    # attention implementation chosen for the wrapper is set on it too (PreTrainedConfig's own propagation). Its class
    # follows text_config's model_type (AutoConfig); "llama" is only the spec's nominal default, never built: a
    # text_config without model_type is refused below.
    if SubConfigSpec is not None:
        sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="llama")}
    else:
        sub_configs = {"text_config": AutoConfig}

    text_config: dict | PreTrainedConfig | None = None
    # No config without a text_config: transformers 5.17-5.19's to_diff_dict (what repr() and from_dict's log line
    # run) builds the class with no arguments unless this says not to (so AutoConfig.from_pretrained failed there:
    # vLLM's venv); later versions read the declared defaults instead.
    has_no_defaults_at_init = True

    def __post_init__(self, **kwargs):
        refuse_own_family_fields(kwargs, "given to TiedNormWrappedConfig or read from its config.json")
        if self.text_config is None:
            raise ValueError("text_config is required: the config (or config dict) of the model to wrap")
        if isinstance(self.text_config, dict):
            fields = dict(self.text_config)
            if "model_type" not in fields:
                raise ValueError("text_config needs a model_type (e.g. 'gpt2', 't5') to choose the architecture")
            self.text_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        if self.text_config.model_type.startswith("tiednorm"):
            raise ValueError(f"text_config is already an hf_tiednorm config ({self.text_config.model_type!r}); its "
                             "head is normalized already: set its head_mode instead of wrapping it")
        # PreTrainedConfig defines is_encoder_decoder itself (default False), so it would not fall through.
        self.is_encoder_decoder = self.text_config.is_encoder_decoder
        inner_attention = self.text_config._attn_implementation  # that of an adopted model's live config
        super().__post_init__(**kwargs)
        if kwargs.get("attn_implementation") is None:  # PreTrainedConfig set None on every sub-config: restore it
            self._attn_implementation = inner_attention
        for name in OUTPUT_SETTINGS:  # what the wrapper was given reaches the wrapped model (a default is no choice)
            if getattr(self, name) != getattr(PreTrainedConfig, name, None):
                setattr(self.text_config, name, getattr(self, name))

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any):
        # from_pretrained(folder, loss_chunk_size=16) hands such keywords here; unknown to the config, they would
        # reach the model's __init__ as a bare TypeError.
        refuse_own_family_fields(kwargs, "from_pretrained keyword arguments")
        return super().from_dict(config_dict, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails: fall through to the wrapped model's config. Private names and
        # text_config itself (absent while the config is being built or copied) are never delegated.
        text_config = self.__dict__.get("text_config")
        if name.startswith("_") or text_config is None or isinstance(text_config, dict):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(text_config, name)

    def _get_generation_parameters(self) -> dict[str, Any]:
        # Only this config's own entries: the wrapped config's fields (BART's forced_eos_token_id) reach the check
        # through __getattr__ but are saved, legitimately, inside text_config.
        return {k: v for k, v in super()._get_generation_parameters().items() if k in self.__dict__}

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_own_family_fields([name], "set as an attribute")
        if name == "text_config":
            drop_source_auto_map(value)  # the folder's auto_map is the wrapper's own
        # An attribute of the wrapped architecture (use_cache, vocab_size, ...) is set where its model reads it; an
        # output setting both here and there (the wrapped model's forward reads its own config).
        text_config = self.__dict__.get("text_config")
        if name in OUTPUT_SETTINGS and isinstance(text_config, PreTrainedConfig):
            setattr(text_config, name, value)
        if (
            isinstance(text_config, PreTrainedConfig)
            and not name.startswith("_")
            and name not in self.__dataclass_fields__
            and not hasattr(type(self), name)
            and hasattr(text_config, name)
        ):
            setattr(text_config, name, value)
            return
        super().__setattr__(name, value)
