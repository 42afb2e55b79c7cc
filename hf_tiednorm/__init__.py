"""hf_tiednorm: normalized input-output shared embeddings for HF Transformers text-generation models.

Importing the package registers every row of the family table (modeling/families/table.py: our families and the
wrapper around any tied transformers LM; ``register_family`` does it for each row) with the Auto classes, and marks
them for ``register_for_auto_class`` so ``save_pretrained`` writes ``auto_map`` and the two generated code files
(conversion/saved_code.py): a saved folder then loads with ``trust_remote_code=True`` where this package is not
installed. The config and model classes are the package's public names, taken from the same table.
"""

import warnings

from transformers import AutoModelForSeq2SeqLM
from transformers.pipelines import PIPELINE_REGISTRY

from .conversion.saved_code import install_code_writer
from .modeling.families.common import TiedNormCausalLMMixin, TiedNormLMMixin
from .modeling.families.configuration import TiedNormHeadConfigMixin
from .modeling.families.configuration_encoder_decoder import TIE_TOPOLOGIES
from .modeling.families.configuration_techniques import TiedNormTechniquesConfigMixin
from .modeling.families.table import FAMILIES, ROWS, ModelFamily, public_classes, register_family, unregister_family
from .modeling.head.layer import TiedNormEmbedding, TiedNormHead
from .modeling.head.modes import HeadMode
from .modeling.head.settings import HEAD_TERMS, LOGIT_SCALES, HeadSettings
from .modeling.head.terms import ExtraHeadTerm, HeadTerm
from .modeling.translation_pipeline import TiedNormTranslationPipeline
from .registration.head_modes import HEAD_MODES, register_head_mode, unregister_head_mode
from .registration.head_terms import register_head_term
from .training.liger import register_families_with_liger

# use_liger_kernel=True with a plain transformers.Trainer reaches the head's fused loss (training/liger.py).
register_families_with_liger()
install_code_writer()  # save_pretrained writes the family's two generated code files (conversion/saved_code.py)
globals().update(public_classes())  # TiedNormSeq2SeqConfig, TiedNormForCausalLM, TiedNormWrappedForCausalLM, ...

PIPELINE_REGISTRY.register_pipeline(
    "tiednorm-translation", pipeline_class=TiedNormTranslationPipeline, pt_model=AutoModelForSeq2SeqLM, type="text"
)

__version__ = "0.1.0"

# Names of 0.1, kept one release with a FutureWarning: the head's vocabulary is HeadSettings (a head's settings),
# HeadTerm (a learned term) and its registry HEAD_TERMS, ExtraHeadTerm (a term added from outside, register_head_term).
_RENAMED = {"HeadOptions": "HeadSettings", "HeadOption": "ExtraHeadTerm", "HEAD_OPTIONS": "HEAD_TERMS",
            "register_head_option": "register_head_term"}


def __getattr__(name: str):
    if name in _RENAMED:
        warnings.warn(f"hf_tiednorm.{name} is renamed hf_tiednorm.{_RENAMED[name]}; the old name will be removed in "
                      "the next release", FutureWarning, stacklevel=2)  # fmt: skip
        return globals()[_RENAMED[name]]
    raise AttributeError(f"module 'hf_tiednorm' has no attribute {name!r}")


# The public names. A new family subclasses TiedNormHeadConfigMixin + TiedNormTechniquesConfigMixin (its config)
# and TiedNormCausalLMMixin (its LM) with an HF parent, and is one keyword ModelFamily row given to register_family;
# a head mode is a HeadMode given to register_head_mode, a head term an ExtraHeadTerm given to register_head_term.
__all__ = [
    "FAMILIES",
    "HEAD_MODES",
    "HEAD_TERMS",
    "ExtraHeadTerm",
    "HeadMode",
    "HeadSettings",
    "HeadTerm",
    "LOGIT_SCALES",
    "ModelFamily",
    "ROWS",
    "TIE_TOPOLOGIES",
    "TiedNormCausalLMMixin",
    "TiedNormEmbedding",
    "TiedNormHead",
    "TiedNormHeadConfigMixin",
    "TiedNormLMMixin",
    "TiedNormTechniquesConfigMixin",
    "TiedNormTranslationPipeline",
    "register_family",
    "register_head_mode",
    "register_head_term",
    "unregister_family",
    "unregister_head_mode",
    *sorted(public_classes()),
]
