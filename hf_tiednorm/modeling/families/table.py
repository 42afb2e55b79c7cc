"""The model families of hf_tiednorm, described once: ``FAMILIES`` (ours, built from scratch) and ``ROWS`` (every
kind of hf_tiednorm model: the families and the wrapper around any tied transformers LM), keyed by ``model_type``.

Every per-family question is answered here, in both directions, and nowhere else compares a ``model_type`` or a
family class (tests/test_layout.py greps for it): the config and model classes and the Auto class that builds them
(the package's Auto registration, ``__init__.py``); the HF checkpoints that convert to a family 1:1 and its parent
architecture (``tiednorm-convert`` in, ``tiednorm-export`` out: the same class both ways); where the parent keeps a
per-token bias (``bias_slot``); what the export refuses and which config fields its parent does not have; the name
its model card gives it; the causal classes the training scripts build; and whether bf16 training on CPU swaps its
attention for the eager one (hf_tiednorm.training.precision). The embedding paths of the tie are declared by each
config class (``embedding_paths``, read by families/tie_topology.py).

A new family is one keyword ``ModelFamily(lm_class=..., source_class=...)`` row passed to ``register_family``
(which also registers it with the Auto classes); its config and LM classes subclass the package's public bases
(``TiedNormHeadConfigMixin``, ``TiedNormTechniquesConfigMixin``, ``TiedNormCausalLMMixin``) and an HF parent, in
the author's own file. The wrapper's answers depend on the wrapped config, so it is the ``WrappedFamily`` row.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartForConditionalGeneration,
    LlamaForCausalLM,
    MarianMTModel,
)

from ..translation_pipeline import TiedNormTranslationPipeline
from .bart import TiedNormBartForConditionalGeneration, TiedNormBartModel
from .causal import TiedNormCausalModel, TiedNormForCausalLM
from .causal_lm_names import recognise_as_causal_lm
from .configuration_wrapped import TiedNormWrappedConfig
from .seq2seq import TiedNormForConditionalGeneration, TiedNormSeq2SeqModel
from .wrapped import TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM, TiedNormWrappedModel

# The per-token bias slot a parent adds after its output layer (Marian, BART, mBART, Pegasus, Blenderbot, ...).
FINAL_LOGITS_BIAS = "final_logits_bias"


@dataclass(frozen=True, kw_only=True)
class ModelFamily:
    """One family, built with keywords; only ``lm_class`` is required, every other field that can be derived is.

    A new family subclasses the package's public base classes (``TiedNormHeadConfigMixin`` and
    ``TiedNormTechniquesConfigMixin`` before its HF parent config, ``TiedNormCausalLMMixin`` before its HF parent
    ``PreTrainedModel``) and is one row::

        register_family(ModelFamily(lm_class=MyForCausalLM, source_class=GPT2LMHeadModel))

    ``name`` is what the training scripts' ``--model_family`` and the tests call it (default: the ``model_type``
    without its ``tiednorm_`` prefix; ``aliases``: other names the recipes use for it)."""

    lm_class: type
    name: str = ""  # default: config_class.model_type without "tiednorm_"
    config_class: type | None = None  # default: lm_class.config_class
    base_model_class: type | None = None  # the bare body AutoModel builds, if the family has one
    auto_class: type | None = None  # default: AutoModelForSeq2SeqLM for an encoder-decoder config, else ...CausalLM
    # The HF class that checkpoints convert from 1:1 and the export writes (the same class both ways), its config
    # (default: source_class.config_class) and its model_type (default: that config's).
    source_class: type | None = None
    hf_parent_config: type | None = None
    source_model_type: str | None = None
    card_name: str = ""  # the architecture its model card names; default: "<source_model_type>-style ..."
    # bf16 on CPU: eager attention with an fp32 softmax instead of SDPA (training/precision.py).
    cpu_bf16_eager_attention: bool = True
    # Where the parent keeps a per-token bias after its output layer (None: it has none, a bias is refused).
    bias_slot: str | None = None
    # What the export refuses for a config (a sentence), and the config fields the parent class does not take.
    export_refusal: Callable[[object], str | None] | None = None
    export_dropped_fields: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    # The input-embedding state key the parent always has (BART's model.shared) and the lookup that fills it.
    parent_shared_key: tuple[str, str] | None = None
    extra_lm_classes: tuple[tuple[type, type], ...] = field(default=())
    # Whether the training scripts build it from a config (the wrapper is made by conversion only).
    from_scratch: bool = True
    # The pipeline an encoder-decoder's saved folder names in custom_pipelines, and whose code it carries.
    pipeline_class: type | None = None

    def __post_init__(self) -> None:
        config_class = self.config_class or getattr(self.lm_class, "config_class", None)
        if not isinstance(config_class, type) or not getattr(config_class, "model_type", ""):
            raise ValueError(
                f"ModelFamily(lm_class={getattr(self.lm_class, '__name__', self.lm_class)!r}): the LM class names no "
                "config class with a model_type; set config_class = YourConfig on the LM class (a config class "
                "with model_type = 'tiednorm_...') or pass config_class="
            )
        encoder_decoder = getattr(config_class, "is_encoder_decoder", False) is True
        derived = {"config_class": config_class}
        if self.auto_class is None:
            derived["auto_class"] = AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM
        parent = self.hf_parent_config or getattr(self.source_class, "config_class", None)
        derived["hf_parent_config"] = parent
        if self.source_model_type is None and parent is not None:
            derived["source_model_type"] = parent.model_type
        if not self.name:
            derived["name"] = config_class.model_type.removeprefix("tiednorm_")
        if not self.card_name:
            kind = "encoder-decoder" if encoder_decoder else "causal language model"
            source = derived.get("source_model_type", self.source_model_type)
            derived["card_name"] = f"{source}-style {kind}" if source else f"{config_class.model_type} {kind}"
        for key, value in derived.items():
            object.__setattr__(self, key, value)

    @property
    def model_type(self) -> str:
        return self.config_class.model_type

    @property
    def is_encoder_decoder(self) -> bool:
        return self.auto_class is AutoModelForSeq2SeqLM

    @property
    def lm_classes(self) -> tuple[tuple[type, type], ...]:
        """(LM class, the Auto class that builds it) of every LM this row has."""
        return ((self.lm_class, self.auto_class), *self.extra_lm_classes)

    def lm_class_for(self, encoder_decoder: bool) -> type:
        """This row's LM class for an encoder-decoder (``encoder_decoder``) or a causal model."""
        want = AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM
        return next(lm for lm, auto in self.lm_classes if auto is want)

    # Questions whose answer depends on the model's config (the wrapper overrides them).
    def architecture_text(self, config) -> str:
        """The architecture named on the model card."""
        return self.card_name

    def card_tags(self, config) -> list[str]:
        return []

    def head_hidden_size(self, config) -> int:
        """The width d of the head's rows (the default fixed logit scale is √d)."""
        return config.d_model if self.is_encoder_decoder else config.hidden_size

    def has_technique_fields(self, config) -> bool:
        """Whether the config may carry our techniques' fields (regularizers, ...), shown on the card."""
        return True

    def export_parts(self, model):
        """(body whose state dict becomes the parent's, path of the head in it, Press & Wolf's P or None)."""
        return model, "lm_head", getattr(model, "output_projection", None)

    def export_parent_class(self, body) -> type:
        return self.source_class

    def export_bias_slot(self, body) -> str | None:
        """Where the parent keeps a per-token bias after its output layer (``body``: the exported body)."""
        return self.bias_slot

    def export_parent_config(self, model, dropped: set[str]):
        """The parent's config of ``model`` (``dropped``: the fields no parent has)."""
        skip = dropped | set(self.export_dropped_fields)
        return self.hf_parent_config(**{k: v for k, v in model.config.to_dict().items() if k not in skip})


def _bart_export_refusal(config) -> str | None:
    if config.decoder_vocab_size != config.vocab_size:
        return (
            f"decoder_vocab_size={config.decoder_vocab_size} != vocab_size={config.vocab_size}: the parent "
            "BartForConditionalGeneration has one vocabulary for encoder and decoder; only the Marian-style family "
            "exports two vocabularies"
        )
    return None


class WrappedFamily(ModelFamily):
    """The wrapper's row: the normalized head around any tied transformers LM (``normalize_tied_head``), whose
    architecture, parent and bias slot are the wrapped model's own."""

    def architecture_text(self, config) -> str:
        return f"`{config.text_config.model_type}` model (transformers' own code)"

    def card_tags(self, config) -> list[str]:
        return [config.text_config.model_type]

    def head_hidden_size(self, config) -> int:
        return config.hidden_size  # the wrapped config's (GPT-2's n_embd, T5's d_model, ...)

    def has_technique_fields(self, config) -> bool:
        return False  # the wrapper config refuses them: it trains with the wrapped model's own loss

    def export_parts(self, model):
        body = model.model
        head = body.get_output_embeddings()
        return body, next(name for name, module in body.named_modules() if module is head), None

    def export_parent_class(self, body) -> type:
        return type(body)

    def export_bias_slot(self, body) -> str | None:
        return FINAL_LOGITS_BIAS if isinstance(getattr(body, FINAL_LOGITS_BIAS, None), torch.Tensor) else None

    def export_parent_config(self, model, dropped: set[str]):
        parent = copy.deepcopy(model.model.config)
        for key in ("auto_map", "custom_pipelines"):
            parent.__dict__.pop(key, None)
        return parent


FAMILIES: dict[str, ModelFamily] = {}
ROWS: dict[str, ModelFamily] = {}  # model_type -> row: the families and the wrapper
# Called with each row registered, past and future (on_family_registered): how a layer above the model (the
# training layer's liger-kernel table) learns of every family without the model layer importing it.
_ROW_LISTENERS: list[Callable[[ModelFamily], None]] = []


def register_family(family: ModelFamily) -> ModelFamily:
    """Add ``family`` to the table (``FAMILIES`` by name unless it is the wrapper, ``ROWS`` by model_type), register
    its classes with transformers' Auto classes (``register_with_auto_classes``) and make a causal LM known to the
    Trainer's label smoother; returns the row. A family registered twice is refused by name, except the same classes
    again (a module imported a second time, as remote code loading a copy of it does: the first row is kept)."""
    if not isinstance(family, ModelFamily):
        raise TypeError(f"register_family takes a ModelFamily row, got {type(family).__name__}")
    keys = ((family.model_type, ROWS), *(((family.name, FAMILIES),) if family.from_scratch else ()))
    for key, table in keys:
        if key in table and _same_classes(table[key], family):
            return table[key]
        if key in table:
            raise ValueError(
                f"a model family {key!r} is registered already ({table[key].lm_class.__qualname__}); give the new "
                "one another name= and its config class another model_type"
            )
    for key, table in keys:
        table[key] = family
    register_with_auto_classes(family)
    for lm_class, auto_class in family.lm_classes:
        if auto_class is AutoModelForCausalLM:
            recognise_as_causal_lm(family.model_type, lm_class.__name__)
    for listener in _ROW_LISTENERS:
        listener(family)
    return family


def _same_classes(old: ModelFamily, new: ModelFamily) -> bool:
    """Whether ``new`` holds the classes of ``old`` again: the same module name and qualified names (a module
    imported a second time, such as remote code's copy of the module that defines them)."""
    return all(
        (a.__module__.rsplit(".", 1)[-1], a.__qualname__) == (b.__module__.rsplit(".", 1)[-1], b.__qualname__)
        for a, b in ((old.lm_class, new.lm_class), (old.config_class, new.config_class))
    )


def unregister_family(name: str) -> ModelFamily:
    """Remove the family called ``name`` (a test's, say) from the table and from transformers' Auto classes; returns
    its row. ``KeyError`` naming the registered families when there is none. (A listener of ``on_family_registered``
    keeps what it did: liger-kernel's table entry of the model_type is harmless without the family.)"""
    if name not in FAMILIES:
        raise KeyError(f"no model family {name!r} is registered; registered: {sorted(FAMILIES)}")
    family = FAMILIES.pop(name)
    ROWS.pop(family.model_type, None)
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING

    CONFIG_MAPPING._extra_content.pop(family.model_type, None)
    for mapping in (MODEL_MAPPING, *(auto._model_mapping for _, auto in family.lm_classes)):
        mapping._extra_content.pop(family.config_class, None)
    if MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(family.model_type) in {lm.__name__ for lm, _ in family.lm_classes}:
        del MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[family.model_type]
    return family


def on_family_registered(listener: Callable[[ModelFamily], None]) -> None:
    """Call ``listener(row)`` for every row of the table now and for each row registered later."""
    _ROW_LISTENERS.append(listener)
    for row in list(ROWS.values()):
        listener(row)


def register_with_auto_classes(family: ModelFamily) -> None:
    """Register ``family``'s classes with transformers' Auto classes and mark them for ``register_for_auto_class``
    (``save_pretrained`` then writes ``auto_map`` and the two generated code files: conversion/saved_code.py)."""
    from transformers import AutoConfig, AutoModel

    AutoConfig.register(family.model_type, family.config_class, exist_ok=True)
    family.config_class.register_for_auto_class()
    if family.base_model_class is not None:
        AutoModel.register(family.config_class, family.base_model_class, exist_ok=True)
        family.base_model_class.register_for_auto_class("AutoModel")
    for lm_class, auto_class in family.lm_classes:
        auto_class.register(family.config_class, lm_class, exist_ok=True)
        lm_class.register_for_auto_class(auto_class.__name__)


for _row in (
    ModelFamily(
        lm_class=TiedNormForConditionalGeneration, base_model_class=TiedNormSeq2SeqModel, source_class=MarianMTModel,
        card_name="Marian-style encoder-decoder", bias_slot=FINAL_LOGITS_BIAS, aliases=("tiednorm",),
        pipeline_class=TiedNormTranslationPipeline,
    ),
    ModelFamily(
        lm_class=TiedNormBartForConditionalGeneration, base_model_class=TiedNormBartModel,
        source_class=BartForConditionalGeneration, card_name="BART-style encoder-decoder", bias_slot=FINAL_LOGITS_BIAS,
        export_refusal=_bart_export_refusal,
        export_dropped_fields=("decoder_vocab_size", "share_encoder_decoder_embeddings"),
        parent_shared_key=("model.shared.weight", "model.encoder.embed_tokens.weight"),
        pipeline_class=TiedNormTranslationPipeline,
    ),
    ModelFamily(
        lm_class=TiedNormForCausalLM, base_model_class=TiedNormCausalModel, source_class=LlamaForCausalLM,
        card_name="Llama-style causal language model",
    ),
    WrappedFamily(
        lm_class=TiedNormWrappedForCausalLM, config_class=TiedNormWrappedConfig, auto_class=AutoModelForCausalLM,
        base_model_class=TiedNormWrappedModel,
        card_name="any tied transformers LM (transformers' own code)", cpu_bf16_eager_attention=False,
        from_scratch=False, extra_lm_classes=((TiedNormWrappedForSeq2SeqLM, AutoModelForSeq2SeqLM),),
        pipeline_class=TiedNormTranslationPipeline,
    ),
):
    register_family(_row)
WRAPPED = ROWS[TiedNormWrappedConfig.model_type]


def family_of_model_type(model_type: str | None) -> ModelFamily | None:
    """The row whose config has ``model_type`` (``tiednorm_bart``, ``tiednorm_wrapped``, ...), None for any other."""
    return ROWS.get(model_type)


def family_of_config(config) -> ModelFamily | None:
    """The row of ``config`` (any config), None when it is no hf_tiednorm model."""
    return family_of_model_type(getattr(config, "model_type", None))


def family_of_source(model_type: str) -> ModelFamily | None:
    """The family an HF checkpoint of ``model_type`` (``marian``, ``bart``, ``llama``) converts to 1:1, or None."""
    return next((family for family in FAMILIES.values() if family.source_model_type == model_type), None)


def family_named(name: str, encoder_decoder: bool | None = None) -> ModelFamily | None:
    """The family called ``name`` or one of its ``aliases`` (``--model_family``), of the encoder-decoders or of the
    causal families when ``encoder_decoder`` says which, or None."""
    return next((f for f in FAMILIES.values() if (name == f.name or name in f.aliases)
                 and encoder_decoder in (None, f.is_encoder_decoder)), None)  # fmt: skip


def families(encoder_decoder: bool) -> tuple[str, ...]:
    """The names of the encoder-decoder families (``encoder_decoder``) or of the causal ones."""
    return tuple(name for name, family in FAMILIES.items() if family.is_encoder_decoder == encoder_decoder)


def public_classes() -> dict[str, type]:
    """Every config and model class of the table by class name (the package's public names, ``__init__.py``)."""
    classes = {}
    for row in ROWS.values():
        row_classes = [row.config_class, row.base_model_class, *(lm for lm, _ in row.lm_classes)]
        classes |= {cls.__name__: cls for cls in row_classes if cls is not None}
    return classes


__all__ = [
    "FAMILIES", "FINAL_LOGITS_BIAS", "ROWS", "WRAPPED", "ModelFamily", "WrappedFamily", "families",
    "family_named", "family_of_config", "family_of_model_type", "family_of_source", "on_family_registered",
    "public_classes", "register_family", "register_with_auto_classes", "unregister_family",
]  # fmt: skip
