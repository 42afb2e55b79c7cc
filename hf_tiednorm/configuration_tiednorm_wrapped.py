"""Configuration of a normalized tied head around any transformers causal LM or encoder-decoder.

``TiedNormWrappedConfig`` holds the wrapped model's own config as ``text_config`` (a config of a native
``transformers`` model: gpt2, qwen3, gemma2, t5, m2m_100, ...) next to the fields of the normalized tied head. Every
attribute the wrapper config does not define itself (``vocab_size``, ``hidden_size``, ``max_position_embeddings``,
``decoder_start_token_id``, ``tie_word_embeddings``, ...) is read from ``text_config``, so code written for the
wrapped architecture reads the wrapper's config unchanged.
"""

from __future__ import annotations

from typing import Any

from transformers import AutoConfig, PreTrainedConfig

from .normalized_head import check_head_mode

# Fields of hf_tiednorm's own families (configuration_tiednorm.py) that a wrapped model has no code for: it trains with
# the wrapped model's own loss and head, so accepting them would silently ignore them.
OWN_FAMILY_FIELDS = (
    "label_smoothing", "loss_chunk_size", "projection_regularization", "weight_norm_regularization",
    "weight_norm_target", "weight_norm_init_sigma", "adaptive_cutoffs", "adaptive_div_value",
    "adaptive_tie_projections", "tie_topology",
)  # fmt: skip


class TiedNormWrappedConfig(PreTrainedConfig):
    r"""
    text_config (`dict` or `PreTrainedConfig`):
        The config of the wrapped model (its ``model_type`` selects the architecture); it must tie its output layer to
        its input embedding (``tie_word_embeddings=True``).
    head_mode (`str`, defaults to `"cosine"`):
        How the output layer scores token i against the final hidden state h: one of ``HEAD_MODES``
        (hf_tiednorm/normalized_head.py). ``"baseline"`` computes exactly the wrapped model's logits.
    logit_scale (`str`, defaults to `"none"`):
        Multiplier g on the scores: "none", "fixed", "scalar" or "vector".
    logit_scale_init (`float`, *optional*):
        g for "fixed", its initial value for "scalar"/"vector"; None means sqrt(hidden size).
    norm_eps (`float`, defaults to 1e-6):
        Floor on the row norms, so zero rows never divide by zero.
    """

    model_type = "tiednorm_wrapped"

    text_config: dict | PreTrainedConfig | None = None
    head_mode: str = "cosine"
    logit_scale: str = "none"
    logit_scale_init: float | None = None
    norm_eps: float = 1e-6

    def __post_init__(self, **kwargs):
        unsupported = sorted(set(kwargs) & set(OWN_FAMILY_FIELDS))
        if unsupported:
            raise ValueError(
                f"{unsupported} are fields of hf_tiednorm's own model families; a wrapped model (any architecture, "
                "trained with its own loss) has no code for them: drop them, or, for a marian/bart/llama source, "
                "convert without --generic to get the own family"
            )
        if self.text_config is None:
            raise ValueError("text_config is required: the config (or config dict) of the model to wrap")
        if isinstance(self.text_config, dict):
            fields = dict(self.text_config)
            if "model_type" not in fields:
                raise ValueError("text_config needs a model_type (e.g. 'gpt2', 't5') to choose the architecture")
            self.text_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        if self.text_config.model_type.startswith("tiednorm"):
            raise ValueError(
                f"text_config is already an hf_tiednorm config ({self.text_config.model_type!r}); its head is "
                "normalized already: set its head_mode instead of wrapping it"
            )
        # PreTrainedConfig defines is_encoder_decoder itself (default False), so it would not fall through.
        self.is_encoder_decoder = self.text_config.is_encoder_decoder
        super().__post_init__(**kwargs)
        check_head_mode(self.head_mode, self.logit_scale)
        if self.logit_scale == "none" and self.logit_scale_init is not None:
            raise ValueError(f"logit_scale_init={self.logit_scale_init} is set but logit_scale='none'")
        if self.logit_scale_init is not None and not 0 < self.logit_scale_init < float("inf"):
            raise ValueError(f"logit_scale_init must be finite and > 0, got {self.logit_scale_init}")
        if not 0 < self.norm_eps < float("inf"):
            raise ValueError(f"norm_eps must be finite and > 0, got {self.norm_eps}")

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
        # An attribute of the wrapped architecture (use_cache, vocab_size, ...) is set where its model reads it.
        text_config = self.__dict__.get("text_config")
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


__all__ = ["TiedNormWrappedConfig"]
