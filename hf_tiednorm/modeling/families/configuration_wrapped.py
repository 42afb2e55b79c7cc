"""The wrapper's configuration: the wrapped model's own config as ``text_config`` (gpt2, qwen3, t5, ...) beside the
normalized head's fields; every other attribute is read from ``text_config``, so the wrapped architecture's code reads
the wrapper's config unchanged."""

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import AutoConfig, PreTrainedConfig

try:  # transformers >= 5.20 declares a composite config's parts with SubConfigSpec
    from transformers.configuration_utils import SubConfigSpec
except ImportError:  # 5.17-5.19 (the lowest setup.cfg declares): a plain {name: config class} dict, `sub_configs`
    SubConfigSpec = None

from .configuration import TiedNormHeadConfigMixin

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


__all__ = ["OWN_FAMILY_FIELDS", "TiedNormWrappedConfig", "refuse_own_family_fields"]
