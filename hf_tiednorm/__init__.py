"""hf_tiednorm: normalized input-output shared embeddings for HF Transformers text-generation models.

Importing the package registers the model families with the Auto classes, and marks them for
``register_for_auto_class`` so ``save_pretrained`` writes ``auto_map`` and the code files: a saved folder then
loads with ``trust_remote_code=True`` where this package is not installed.
"""

from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .configuration_tiednorm import TIE_TOPOLOGIES, TiedNormBartConfig, TiedNormCausalConfig, TiedNormSeq2SeqConfig
from .configuration_tiednorm_wrapped import TiedNormWrappedConfig
from .families import FAMILIES
from .head_modes import HeadMode, register_head_mode
from .head_options import HeadOptions
from .modeling_tiednorm_bart import TiedNormBartForConditionalGeneration, TiedNormBartModel
from .modeling_tiednorm_causal import TiedNormCausalModel, TiedNormForCausalLM
from .modeling_tiednorm_seq2seq import TiedNormForConditionalGeneration, TiedNormSeq2SeqModel
from .modeling_tiednorm_wrapped import TiedNormWrappedForCausalLM, TiedNormWrappedForSeq2SeqLM
from .normalized_head import HEAD_MODES, LOGIT_SCALES, TiedNormEmbedding, TiedNormHead
from .pipeline_translation import TiedNormTranslationPipeline

for family in FAMILIES.values():
    AutoConfig.register(family.model_type, family.config_class)
    AutoModel.register(family.config_class, family.base_model_class)
    family.auto_class.register(family.config_class, family.lm_class)
    family.config_class.register_for_auto_class()
    family.base_model_class.register_for_auto_class("AutoModel")
    family.lm_class.register_for_auto_class(family.auto_class.__name__)

# Any tied transformers LM with the normalized head (convert.normalize_tied_head): one config, two model classes.
AutoConfig.register(TiedNormWrappedConfig.model_type, TiedNormWrappedConfig)
TiedNormWrappedConfig.register_for_auto_class()
for lm_model, lm_auto in (
    (TiedNormWrappedForCausalLM, AutoModelForCausalLM),
    (TiedNormWrappedForSeq2SeqLM, AutoModelForSeq2SeqLM),
):
    lm_auto.register(TiedNormWrappedConfig, lm_model)
    lm_model.register_for_auto_class(lm_auto.__name__)

PIPELINE_REGISTRY.register_pipeline(
    "tiednorm-translation", pipeline_class=TiedNormTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__version__ = "0.1.0"
__all__ = [
    "FAMILIES",
    "HEAD_MODES",
    "HeadMode",
    "HeadOptions",
    "LOGIT_SCALES",
    "TIE_TOPOLOGIES",
    "TiedNormBartConfig",
    "TiedNormBartForConditionalGeneration",
    "TiedNormBartModel",
    "TiedNormCausalConfig",
    "TiedNormCausalModel",
    "TiedNormEmbedding",
    "TiedNormForCausalLM",
    "TiedNormForConditionalGeneration",
    "TiedNormHead",
    "TiedNormSeq2SeqConfig",
    "TiedNormSeq2SeqModel",
    "TiedNormTranslationPipeline",
    "TiedNormWrappedConfig",
    "TiedNormWrappedForCausalLM",
    "TiedNormWrappedForSeq2SeqLM",
    "register_head_mode",
]
