"""Convert a tied checkpoint of a native ``transformers`` model into an hf_tiednorm model with a chosen head mode.

Supported sources (local folders written by ``save_pretrained``):

* ``MarianMTModel`` (``model_type="marian"``) with tied output embeddings, encoder and decoder sharing one vocabulary
  (three-way tying) or not (decoder tying) -> ``TiedNormForConditionalGeneration``. Our seq2seq model *is* Marian's
  architecture, so every weight maps 1:1 under the same name. Marian's ``final_logits_bias`` has no counterpart
  (our head has no free bias); it is zero in released Marian models and a non-zero one is refused.
* ``BartForConditionalGeneration`` (``model_type="bart"``) with tied output embeddings -> the BART-based
  ``TiedNormBartForConditionalGeneration`` with ``tie_topology="three_way"`` (BART's encoder and decoder always share
  one vocabulary): same architecture (learned positions, ``layernorm_embedding``, in-module embedding scale), same
  weight names, and the same rule for ``final_logits_bias`` as Marian.
* ``LlamaForCausalLM`` (``model_type="llama"``) with ``tie_word_embeddings=True`` -> ``TiedNormForCausalLM``, again a
  1:1 mapping of identically named weights.

With ``head_mode="baseline"`` the converted model computes exactly the source's logits. Other modes keep every
weight as it is and change only how the output layer scores tokens (the model then needs fine-tuning).

Refused with an explanation: untied sources, a non-zero ``final_logits_bias``, and any other ``model_type``.
The source folder is only read.

CLI::

    python -m hf_tiednorm.convert path/to/opus-mt-de-en converted/ --head-mode cosine
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from transformers import AutoConfig, BartForConditionalGeneration, LlamaForCausalLM, MarianMTModel, PreTrainedModel

from .configuration_tiednorm import TiedNormBartConfig, TiedNormCausalConfig, TiedNormSeq2SeqConfig
from .hub import copy_tokenizer
from .modeling_tiednorm_bart import TiedNormBartForConditionalGeneration
from .modeling_tiednorm_causal import TiedNormForCausalLM
from .modeling_tiednorm_seq2seq import TiedNormForConditionalGeneration
from .normalized_head import HEAD_MODES, LOGIT_SCALES

# model_type -> (source class, target config class, target model class)
SUPPORTED_SOURCES = {
    "marian": (MarianMTModel, TiedNormSeq2SeqConfig, TiedNormForConditionalGeneration),
    "bart": (BartForConditionalGeneration, TiedNormBartConfig, TiedNormBartForConditionalGeneration),
    "llama": (LlamaForCausalLM, TiedNormCausalConfig, TiedNormForCausalLM),
}
_SUPPORTED_TEXT = (
    "MarianMTModel (model_type 'marian'), BartForConditionalGeneration (model_type 'bart') and LlamaForCausalLM "
    "(model_type 'llama'), with tied embeddings"
)
# Config entries describing the source checkpoint or derived by our configs (tie_topology sets the tying flags).
_DROPPED_CONFIG_KEYS = (
    "model_type", "architectures", "transformers_version", "_name_or_path", "auto_map",
    "tie_word_embeddings", "share_encoder_decoder_embeddings",
)  # fmt: skip
# Keys that exist on only one side of the mapping: Marian's and BART's (zero) output bias, and the learned logit scale
# that only the logit_scale options "scalar"/"vector" add (initialized by the model).
_SOURCE_ONLY_KEYS = {"final_logits_bias"}
_TARGET_ONLY_KEYS = {"lm_head.logit_scale"}


def _target_config(source_config, head_mode: str, logit_scale: str, logit_scale_init: float | None):
    model_type = source_config.model_type
    if model_type not in SUPPORTED_SOURCES:
        raise ValueError(
            f"cannot convert this checkpoint: model_type {model_type!r} is not supported. Supported sources: "
            f"{_SUPPORTED_TEXT}."
        )
    if not source_config.tie_word_embeddings:
        raise ValueError(
            f"the {model_type} checkpoint has untied output embeddings (tie_word_embeddings=False): the normalized "
            f"head scores tokens with the shared input embedding, so only tied checkpoints convert. Supported: "
            f"{_SUPPORTED_TEXT}."
        )
    fields = {k: v for k, v in source_config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    head_fields = {"head_mode": head_mode, "logit_scale": logit_scale, "logit_scale_init": logit_scale_init}
    if model_type == "marian":
        head_fields["tie_topology"] = "three_way" if source_config.share_encoder_decoder_embeddings else "decoder"
    elif model_type == "bart":  # BART's encoder and decoder always share model.shared
        head_fields["tie_topology"] = "three_way"
    return SUPPORTED_SOURCES[model_type][1](**fields, **head_fields)


def convert_checkpoint(
    source: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    head_mode: str = "baseline",
    logit_scale: str = "none",
    logit_scale_init: float | None = None,
) -> PreTrainedModel:
    """Load the tied checkpoint in ``source`` as the matching hf_tiednorm model with ``head_mode``.

    With ``output_dir`` (new or empty, outside ``source``), the converted model is saved there with its remote code,
    and the source's tokenizer if it has one. Returns the converted model in eval mode.
    """
    source = Path(source)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} has no config.json; pass a local folder written by save_pretrained")
    if head_mode not in HEAD_MODES:
        raise ValueError(f"head_mode must be one of {HEAD_MODES}, got {head_mode!r}")
    if logit_scale not in LOGIT_SCALES:
        raise ValueError(f"logit_scale must be one of {LOGIT_SCALES}, got {logit_scale!r}")
    if output_dir is not None:
        output_dir = Path(output_dir)
        if output_dir.resolve() == source.resolve() or source.resolve() in output_dir.resolve().parents:
            raise ValueError(f"output_dir {output_dir} must lie outside the source checkpoint {source}")
        if output_dir.exists() and any(output_dir.iterdir()):
            raise FileExistsError(f"{output_dir} is not empty; choose a new folder for the converted model")

    source_config = AutoConfig.from_pretrained(source)
    config = _target_config(source_config, head_mode, logit_scale, logit_scale_init)
    source_class, _, target_class = SUPPORTED_SOURCES[source_config.model_type]
    source_model = source_class.from_pretrained(source, dtype="auto")
    state = source_model.state_dict()
    if "final_logits_bias" in state and state["final_logits_bias"].count_nonzero() > 0:
        raise ValueError(
            f"{source} has a non-zero final_logits_bias, which hf_tiednorm's head has no parameter for (the distance "
            "mode derives its bias from W); converting would change the logits"
        )

    model = target_class(config).to(source_model.dtype)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - _TARGET_ONLY_KEYS
    unexpected = set(unexpected) - _SOURCE_ONLY_KEYS
    if missing or unexpected:  # the architectures differ: a 1:1 mapping would be wrong
        raise ValueError(
            f"weights of {source} do not map 1:1 onto {target_class.__name__}: missing {sorted(missing)}, "
            f"unexpected {sorted(unexpected)}"
        )
    model.generation_config = source_model.generation_config
    model.eval()

    if output_dir is not None:
        model.save_pretrained(output_dir)
        if (source / "tokenizer_config.json").is_file() or (source / "tokenizer.json").is_file():
            copy_tokenizer(source, output_dir)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=f"Convert a tied checkpoint ({_SUPPORTED_TEXT}) to hf_tiednorm.")
    parser.add_argument("source", help="local folder of the source checkpoint")
    parser.add_argument("output_dir", help="new or empty folder for the converted model")
    parser.add_argument("--head-mode", default="baseline", choices=HEAD_MODES)
    parser.add_argument("--logit-scale", default="none", choices=LOGIT_SCALES)
    parser.add_argument("--logit-scale-init", type=float, help="g for 'fixed', initial g for 'scalar'/'vector'")
    args = parser.parse_args(argv)
    convert_checkpoint(
        args.source,
        args.output_dir,
        head_mode=args.head_mode,
        logit_scale=args.logit_scale,
        logit_scale_init=args.logit_scale_init,
    )
    print(f"wrote {args.output_dir}")


if __name__ == "__main__":
    main()
