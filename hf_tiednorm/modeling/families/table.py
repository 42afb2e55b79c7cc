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

A new family is one ``ModelFamily(...)`` passed to ``register_family`` (its config and model classes live in their
own files); the wrapper's answers depend on the wrapped config, so it is the ``WrappedFamily`` row.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    BartConfig,
    BartForConditionalGeneration,
    LlamaConfig,
    LlamaForCausalLM,
    MarianConfig,
    MarianMTModel,
)

from .bart import TiedNormBartForConditionalGeneration, TiedNormBartModel
from .causal import TiedNormCausalModel, TiedNormForCausalLM
from .configuration import TiedNormBartConfig, TiedNormCausalConfig, TiedNormSeq2SeqConfig
from .configuration_wrapped import TiedNormWrappedConfig
from .seq2seq import TiedNormForConditionalGeneration, TiedNormSeq2SeqModel
from .wrapped import TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM

# The per-token bias slot a parent adds after its output layer (Marian, BART, mBART, Pegasus, Blenderbot, ...).
FINAL_LOGITS_BIAS = "final_logits_bias"


@dataclass(frozen=True)
class ModelFamily:
    """One family. ``name`` is what the training scripts' ``--model_family`` and the tests call it (``aliases``:
    other names the recipes use for it)."""

    name: str
    config_class: type
    base_model_class: type | None
    lm_class: type
    auto_class: type
    hf_parent_config: type | None
    card_name: str
    # The HF checkpoints (model_type, model class) that map 1:1 onto this family; the export writes the same class.
    source_model_type: str | None
    source_class: type | None
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
    """Add ``family`` to the table (``FAMILIES`` by name unless it is the wrapper, ``ROWS`` by model_type). The
    package's Auto registration (``__init__.py``) runs over the rows; a family registered later calls
    ``register_with_auto_classes`` itself."""
    for key, table in ((family.model_type, ROWS), *(((family.name, FAMILIES),) if family.from_scratch else ())):
        if key in table:
            raise ValueError(f"a model family {key!r} is registered already")
        table[key] = family
    for listener in _ROW_LISTENERS:
        listener(family)
    return family


def on_family_registered(listener: Callable[[ModelFamily], None]) -> None:
    """Call ``listener(row)`` for every row of the table now and for each row registered later."""
    _ROW_LISTENERS.append(listener)
    for row in list(ROWS.values()):
        listener(row)


def register_with_auto_classes(family: ModelFamily) -> None:
    """Register ``family``'s classes with transformers' Auto classes and mark them for ``register_for_auto_class``
    (``save_pretrained`` then writes ``auto_map`` and the two generated code files: modeling/auto_map.py)."""
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
        "seq2seq", TiedNormSeq2SeqConfig, TiedNormSeq2SeqModel, TiedNormForConditionalGeneration,
        AutoModelForSeq2SeqLM, MarianConfig, "Marian-style encoder-decoder", "marian", MarianMTModel,
        bias_slot=FINAL_LOGITS_BIAS, aliases=("tiednorm",),
    ),
    ModelFamily(
        "bart", TiedNormBartConfig, TiedNormBartModel, TiedNormBartForConditionalGeneration,
        AutoModelForSeq2SeqLM, BartConfig, "BART-style encoder-decoder", "bart", BartForConditionalGeneration,
        bias_slot=FINAL_LOGITS_BIAS, export_refusal=_bart_export_refusal,
        export_dropped_fields=("decoder_vocab_size", "share_encoder_decoder_embeddings"),
        parent_shared_key=("model.shared.weight", "model.encoder.embed_tokens.weight"),
    ),
    ModelFamily(
        "causal", TiedNormCausalConfig, TiedNormCausalModel, TiedNormForCausalLM,
        AutoModelForCausalLM, LlamaConfig, "Llama-style causal language model", "llama", LlamaForCausalLM,
    ),
    WrappedFamily(
        "wrapped", TiedNormWrappedConfig, None, TiedNormWrappedForCausalLM, AutoModelForCausalLM, None,
        "any tied transformers LM (transformers' own code)", None, None,
        cpu_bf16_eager_attention=False, from_scratch=False,
        extra_lm_classes=((TiedNormWrappedForSeq2SeqLM, AutoModelForSeq2SeqLM),),
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
    "public_classes",
    "register_family", "register_with_auto_classes",
]  # fmt: skip
