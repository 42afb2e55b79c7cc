"""The normalized tied head around any transformers causal LM or encoder-decoder, on its own code: the model
``AutoModelForCausalLM`` / ``AutoModelForSeq2SeqLM`` builds from ``config.text_config`` is held as ``self.model`` with
two changes, its output layer a ``TiedNormHead`` sharing the input embedding matrix (what the architecture does around
the head is kept: final norm, T5's rescale, soft-capping, ``final_logits_bias``) and, in l2 mode, unit-row lookups.
``head_mode="baseline"`` computes the wrapped model's logits exactly; ``generate`` runs on the wrapper.
(docs/code_notes.md)"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, GenerationMixin, PreTrainedModel
from transformers.models.auto.auto_factory import _get_model_class
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple

from ..code_writer import SavesItsCode
from ..engine_checks import EngineChecksMixin
from ..head.peft_guard import check_head_once
from ..head.scoring_guard import own_scoring
from ..load_checks import WeightChecksMixin
from ..loss.accumulated import share_of_accumulated_batch
from ..loss.policy import refuse_fused_loss_scored_outside
from .causal_lm_names import recognise_built_causal_lm
from .configuration_wrapped import TiedNormWrappedConfig
from .head_host import TiedNormHeadHostMixin
from .wrapped_head import install_normalized_head
from .wrapped_loss import fused_causal_lm_loss, judging_the_body


class _wrapped_class_flag:
    """A class flag of transformers' (``_supports_sdpa``, ``_is_stateful``, ...) that the wrapper takes from the class
    it wraps: read on a model, the wrapped model's class's value; read on the wrapper class, whose wrapped architecture
    is not known until a config is given, ``on_class``.

    transformers reads these flags on the model (the attention it may set, whether ``generate`` may compile or assist),
    so the model's values decide what runs. HF's tests and serving engines read them on the class first, to decide
    whether to try at all: there the wrapper says what it can do for an architecture that can (``True`` for a
    support flag, ``False`` for ``_is_stateful``: a property read on the class would be the property object itself,
    truthy, and a stateful-model skip would hide assisted decoding), and the model built from a config says the rest.
    """

    def __init__(self, on_class: bool):
        self.on_class = on_class

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, instance, owner):
        if instance is None:
            return self.on_class
        return getattr(instance._body_class(), self.name)


def slice_logits_to_keep(logits: torch.Tensor, logits_to_keep: int | torch.Tensor) -> torch.Tensor:
    """The positions of ``logits`` (batch, length, V) that ``logits_to_keep`` keeps: the last n for an int n, those a
    1-D tensor of positions names (transformers' rule for ``logits_to_keep``; its own helper is absent before 5.2x)."""
    if isinstance(logits_to_keep, int):
        return logits[:, slice(-logits_to_keep, None), :]
    return logits[:, logits_to_keep, :]


_FORWARD_NAMES: dict[type, frozenset[str]] = {}


def _forward_names(cls: type) -> frozenset[str]:
    """The argument names of ``cls.forward``."""
    if cls not in _FORWARD_NAMES:
        _FORWARD_NAMES[cls] = frozenset(inspect.signature(cls.forward).parameters)
    return _FORWARD_NAMES[cls]


class TiedNormWrappedPreTrainedModel(
    EngineChecksMixin, WeightChecksMixin, TiedNormHeadHostMixin, SavesItsCode, PreTrainedModel
):
    """Builds (or adopts) the wrapped model and delegates the embedding accessors, generation and resizing to it;
    hosting the head (new output layers, generation with frozen column terms, resizing, saving) is
    ``TiedNormHeadHostMixin``'s, as in hf_tiednorm's own families."""

    config_class = TiedNormWrappedConfig
    config: TiedNormWrappedConfig
    # ``base_model`` is the headless backbone, as in every HF ``*ForCausalLM`` (the ``backbone`` property below); the
    # wrapped model itself, head included, stays ``self.model``, so the state-dict keys are ``model.*`` as before.
    base_model_prefix = "backbone"
    supports_gradient_checkpointing = True
    # The Auto class that builds the wrapped model from config.text_config.
    body_auto_class: type = AutoModelForCausalLM

    def __init__(self, config: TiedNormWrappedConfig, body: PreTrainedModel | None = None):
        """``body``: an already loaded model of ``config.text_config`` to adopt with its weights (the in-memory
        conversion); None builds one (random weights, or on the meta device under ``from_pretrained``)."""
        # Checked first: building reads the wrapped class's attention support (_body_class).
        if config.is_encoder_decoder != (self.body_auto_class is AutoModelForSeq2SeqLM):
            other = "AutoModelForSeq2SeqLM" if config.is_encoder_decoder else "AutoModelForCausalLM"
            raise ValueError(f"{type(self).__name__} cannot wrap a {config.text_config.model_type} model; use {other}")
        super().__init__(config)
        if body is None:
            # Built in the dtype the wrapper is built in (from_pretrained(dtype=...) sets the default dtype).
            body = self.body_auto_class.from_config(config.text_config, dtype=torch.get_default_dtype())
        if not getattr(body.config, "tie_word_embeddings", True):
            raise ValueError(
                f"{type(self).__name__}: the wrapped {body.config.model_type} config says tie_word_embeddings=False, "
                "but the normalized head is tied: it scores with the input embedding matrix itself, so an untied "
                "output matrix would be dropped (docs/converting.md: untied checkpoints are refused). Wrap a model "
                "with tie_word_embeddings=True"
            )
        self.model = body
        self.generation_config = body.generation_config  # from_pretrained replaces it by the saved one
        config.text_config = body.config  # one config object, so that resizing or use_cache reach the body
        install_normalized_head(body, config)
        if not any(p.is_meta for p in body.parameters()):
            # An adopted or freshly built body is initialized already; post_init must not re-initialize the new head,
            # whose weight is the shared embedding.
            for module in body.modules():
                module._is_hf_initialized = True
        self.post_init()

    def post_init(self) -> None:
        super().post_init()  # the wrapped model declared its own tie when it was built
        self.finish_head_hosting()

    def _body_class(self) -> type[PreTrainedModel]:
        """The class of the wrapped model (the one ``body_auto_class`` builds from ``config.text_config``)."""
        try:
            return _get_model_class(self.config.text_config, self.body_auto_class._model_mapping)
        except KeyError:
            raise ValueError(
                f"{self.body_auto_class.__name__} has no class for a {self.config.text_config.model_type!r} model: "
                f"{type(self).__name__} cannot wrap it"
            ) from None

    # The attention implementations the wrapper supports are its wrapped model's: transformers checks them on the
    # wrapper when it is built or loaded (attn_implementation=...), and the choice reaches the wrapped model through
    # config.text_config, a sub-config. Whether generate may compile the forward as one graph, and whether the model
    # keeps a state that assisted decoding cannot roll back, are the wrapped class's too. _supports_attention_backend is
    # transformers' "efficient backend" flag (attention interface, kwargs passed through to the attention, logits
    # sliced by a tensor), which HF's tests read (engines ask is_backend_compatible(): it refuses, engine_checks.py).
    _supports_sdpa = _wrapped_class_flag(on_class=True)
    _supports_flash_attn = _wrapped_class_flag(on_class=True)
    _supports_flex_attn = _wrapped_class_flag(on_class=True)
    _can_compile_fullgraph = _wrapped_class_flag(on_class=True)
    _supports_attention_backend = _wrapped_class_flag(on_class=True)
    _is_stateful = _wrapped_class_flag(on_class=False)

    def _body_forward_names(self) -> frozenset[str]:
        """The argument names of the wrapped model's forward (read once per wrapped class)."""
        return _forward_names(type(self.model))

    @property
    def backbone(self) -> nn.Module:
        """The wrapped model's headless backbone (``LlamaModel``, ``GPT2Model``, ``Qwen3Model``, ``BartModel``, ...),
        i.e. the wrapped model's own ``base_model``: what HF's ``*ForCausalLM`` classes expose as ``base_model`` and
        callers such as TRL run to get ``last_hidden_state`` before an LM head. It is a module inside ``self.model``
        (keys ``model.<its prefix>.*``), not registered a second time. An architecture whose own ``base_model`` is
        itself (T5) gives the wrapped model, as transformers does for it."""
        return self.model.base_model

    @property
    def vocab_size(self) -> int:
        """The wrapped model's vocabulary size (``config.text_config.vocab_size``, kept by a resize)."""
        return self.config.get_text_config().vocab_size

    def get_input_embeddings(self) -> nn.Module:
        return self.model.get_input_embeddings()

    def set_input_embeddings(self, value: nn.Module) -> None:
        self.model.set_input_embeddings(value)

    def _output_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def _place_output_head(self, head: nn.Module) -> None:
        self.model.set_output_embeddings(head)

    def get_encoder(self) -> nn.Module:
        return self.model.get_encoder()

    def get_decoder(self) -> nn.Module:
        return self.model.get_decoder()

    def _resize_embeddings(
        self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None, mean_resizing: bool = True
    ) -> nn.Embedding:
        # The wrapped model resizes its embedding in place (and its final_logits_bias, if any) but replaces the
        # output layer by a plain nn.Linear; put the normalized head back on the resized shared matrix.
        head = self.get_output_embeddings()
        embeddings = self.model.resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.model.set_output_embeddings(head)
        head.weight = embeddings.weight
        return embeddings

    @own_scoring  # scores with the model's own head: what the scoring guard lets run (head/scoring_guard.py)
    @can_return_tuple  # return_dict=False (argument or config) gives the output's tuple, as HF's LMs do
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.LongTensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        logits_to_keep: int | torch.Tensor = 0,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """The wrapped model's forward (every argument it takes, e.g. ``decoder_input_ids``, ``cache``),
        returning its output: ``logits`` (batch, length, V) from the normalized head; for a causal LM whose loss a
        fused path computes (``config.loss_implementation``, families/wrapped_loss.py) the loss and ``logits=None``.

        The arguments named here are those transformers' ``generate`` looks for in a model's forward (position ids
        from a left-padded mask, ``logits_to_keep=1`` at each step); each goes to the wrapped model as it is.

        Args:
            input_ids: (batch, length) token ids, or ``inputs_embeds`` (batch, length, d) instead.
            attention_mask: (batch, length), 1 for tokens to attend to.
            position_ids: (batch, length) positions (a causal LM's; ``generate`` computes them from the mask).
            labels: (batch, length) target ids (a causal LM shifts them; ``shift_labels`` in ``kwargs`` are taken
                as already aligned).
            use_cache: whether to return the cache (None: the wrapped model's config).
            logits_to_keep: compute the logits of the last ``logits_to_keep`` positions only (0: all), or of the
                positions a tensor indexes; a wrapped model whose forward lacks it (BART, T5, Marian) computes them
                all, and the kept ones are returned.
        """
        check_head_once(self)
        if inputs_embeds is not None:
            kwargs["inputs_embeds"] = inputs_embeds
        if position_ids is not None:
            kwargs["position_ids"] = position_ids  # a TransformersKwargs entry: an architecture without it ignores it
        if use_cache is not None:
            kwargs["use_cache"] = use_cache
        sliced_here = False
        if not (isinstance(logits_to_keep, int) and logits_to_keep == 0):
            if "logits_to_keep" in self._body_forward_names():
                kwargs["logits_to_keep"] = logits_to_keep
            else:
                sliced_here = True
        kwargs["return_dict"] = True  # the wrapped model's output object; can_return_tuple makes the tuple
        # The Trainer's num_items_in_batch is applied here, for every architecture (loss/accumulated.py).
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        skip_logits = kwargs.pop("skip_logits", None)  # the Trainer's: a fused loss may serve evaluation too
        if self.training and labels is None and num_items_in_batch is not None:
            refuse_fused_loss_scored_outside(self.config)  # the Trainer scores the logits: no fused loss
        if labels is not None:  # a causal LM's fused loss (an encoder-decoder refuses a named one)
            fused = fused_causal_lm_loss(
                self, self.model, input_ids, attention_mask, labels, num_items_in_batch, skip_logits, kwargs
            )
            if fused is not None:  # the loss by a fused path, no logits
                return fused
        # A patched forward that computes the loss without the head is refused (liger's patches: wrapped_loss.py).
        with judging_the_body(self, self.model, computes_training_loss=self.training and labels is not None):
            outputs = self.model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **kwargs)
        if sliced_here and outputs.logits is not None:
            outputs.logits = slice_logits_to_keep(outputs.logits, logits_to_keep)
        shifted = not self.config.is_encoder_decoder
        return share_of_accumulated_batch(outputs, labels, num_items_in_batch, shifted, kwargs.get("shift_labels"))


class TiedNormWrappedModel(TiedNormWrappedPreTrainedModel):
    """The wrapper's base model, what ``AutoModel`` builds from a wrapper's folder: the wrapped model's headless
    backbone output (``last_hidden_state``, ...), as ``AutoModel`` gives the body of any HF checkpoint (feature
    extraction, sentence embeddings). It holds the whole wrapped model, so that the folder's weights load into it as
    they are (``model.*``) and an l2 head's unit input lookups stay, and runs it to ``backbone`` (``LlamaModel``,
    ``BartModel``, ...; an architecture whose own ``base_model`` is itself, T5, runs whole).

    A serving engine that rebuilds a model around its base model (vLLM's Transformers backend) builds this class: it
    refuses to be built so (modeling/engine_checks.py), where without an ``AutoModel`` entry in ``auto_map`` the
    engine stopped at transformers' "Unrecognized configuration class" instead of saying why and what to serve."""

    def __init__(self, config: TiedNormWrappedConfig, body: PreTrainedModel | None = None):
        # a causal or an encoder-decoder body, as the config says (the LM classes fix theirs)
        self.body_auto_class = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
        super().__init__(config, body)

    # The model's own forward to the scoring guard (head/scoring_guard.py): it scores nothing, it returns the states the
    # head scores, as calling the backbone directly does; unmarked, the guard took it for a foreign forward.
    @own_scoring
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Unpack[TransformersKwargs],
    ):
        """The backbone's forward (every argument it takes: ``position_ids``, ``decoder_input_ids``, the cache, ...)
        and its output: ``last_hidden_state`` (batch, length, d), the states the normalized head scores.

        Args:
            input_ids: (batch, length) token ids, or ``inputs_embeds`` (batch, length, d) instead.
            attention_mask: (batch, length), 1 for tokens to attend to.
        """
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds,
                             **kwargs)


class TiedNormWrappedGenerationMixin(GenerationMixin):
    """transformers' ``generate``, run on the wrapper's LM classes as on any HF model; what depends on the architecture
    is asked of the wrapped model: each step's inputs (its cache layout, its masks), and which arguments ``generate``
    accepts. (Not on the base model, which does not generate.)"""

    def prepare_inputs_for_generation(self, *args, **kwargs) -> dict[str, Any]:
        return self.model.prepare_inputs_for_generation(*args, **kwargs)

    # generate reads the arguments it may pass (inputs_embeds) from this signature: transformers' own.
    prepare_inputs_for_generation.__signature__ = inspect.signature(GenerationMixin.prepare_inputs_for_generation)

    def _validate_model_kwargs(self, model_kwargs: dict[str, Any]) -> None:
        # logits_to_keep is this forward's own (sliced here where the wrapped forward lacks it): valid whatever the
        # wrapped model takes.
        self.model._validate_model_kwargs({k: v for k, v in model_kwargs.items() if k != "logits_to_keep"})


class TiedNormWrappedForCausalLM(TiedNormWrappedPreTrainedModel, TiedNormWrappedGenerationMixin):
    """A causal LM of any tied architecture (``config.text_config``) scoring with the normalized tied head."""

    body_auto_class = AutoModelForCausalLM

    def __init__(self, config: TiedNormWrappedConfig, body: PreTrainedModel | None = None):
        super().__init__(config, body)
        recognise_built_causal_lm(self)  # the label smoother shifts its labels; TRL reloads the reference


class TiedNormWrappedForSeq2SeqLM(TiedNormWrappedPreTrainedModel, TiedNormWrappedGenerationMixin):
    """An encoder-decoder of any tied architecture (``config.text_config``) scoring with the normalized tied head."""

    body_auto_class = AutoModelForSeq2SeqLM

    @property
    def prepare_decoder_input_ids_from_labels(self):
        # DataCollatorForSeq2Seq builds decoder inputs with it when the model has it: present exactly when the wrapped
        # model has it (M2M100 has none and shifts the labels in its forward), raising AttributeError otherwise.
        return self.model.prepare_decoder_input_ids_from_labels


__all__ = [
    "TiedNormWrappedForCausalLM",
    "TiedNormWrappedForSeq2SeqLM",
    "TiedNormWrappedModel",
    "TiedNormWrappedPreTrainedModel",
]
