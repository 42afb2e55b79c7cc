"""Give a tied checkpoint of any ``transformers`` causal LM or encoder-decoder the normalized tied head.

Two targets, chosen by the source's ``model_type``:

* ``marian``, ``bart`` and ``llama`` map 1:1 onto hf_tiednorm's own families (``TiedNormForConditionalGeneration``,
  ``TiedNormBartForConditionalGeneration``, ``TiedNormForCausalLM``), which add the technique fields (adaptive
  softmax, regularizers, chunked loss). Marian's / BART's ``final_logits_bias`` has no counterpart there (it is zero in
  released models; a non-zero one is refused: convert with ``generic=True`` to keep it).
* Every other tied causal LM or encoder-decoder (GPT-2, Qwen2/3, Gemma 2/3, Mistral, Phi-3, T5, mBART, M2M100/NLLB,
  ...), and those three with ``generic=True``, is wrapped as it is: ``TiedNormWrappedForCausalLM`` /
  ``TiedNormWrappedForSeq2SeqLM`` (modeling_tiednorm_wrapped.py) keep transformers' own model and replace only its
  output layer (and, in l2 mode, its lookups), so what the architecture does around the head is kept.

With ``head_mode="baseline"`` the converted model computes exactly the source's logits. Other modes keep every
weight and change only how the output layer scores tokens (and, in l2 mode, the input lookups); the model then needs
fine-tuning. Untied sources are refused: the normalized head scores with the input embedding, so a separate output
matrix would be dropped. A checkpoint whose config claims ``tie_word_embeddings=True`` but stores a different output
matrix is refused too. The source folder is only read.

``normalize_tied_head`` does the same for a model already loaded in memory.

CLI::

    python -m hf_tiednorm.convert path/to/gpt2 converted/ --head-mode cosine
"""

from __future__ import annotations

import argparse
import copy
import os
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    BartForConditionalGeneration,
    LlamaForCausalLM,
    MarianMTModel,
    PreTrainedModel,
)

from .configuration_tiednorm import TiedNormBartConfig, TiedNormCausalConfig, TiedNormSeq2SeqConfig
from .configuration_tiednorm_wrapped import TiedNormWrappedConfig
from .modeling_tiednorm_bart import TiedNormBartForConditionalGeneration
from .modeling_tiednorm_causal import TiedNormForCausalLM
from .modeling_tiednorm_seq2seq import TiedNormForConditionalGeneration
from .modeling_tiednorm_wrapped import (
    TiedNormWrappedForCausalLM,
    TiedNormWrappedForSeq2SeqLM,
    TiedNormWrappedPreTrainedModel,
    shared_embedding_modules,
    unit_lookups,
)
from .normalized_head import HEAD_MODES, LOGIT_SCALES, TiedNormHead, check_head_mode, unit_rows

# model_type -> (source class, target config class, target model class): the 1:1 mappings onto our own families.
SUPPORTED_SOURCES = {
    "marian": (MarianMTModel, TiedNormSeq2SeqConfig, TiedNormForConditionalGeneration),
    "bart": (BartForConditionalGeneration, TiedNormBartConfig, TiedNormBartForConditionalGeneration),
    "llama": (LlamaForCausalLM, TiedNormCausalConfig, TiedNormForCausalLM),
}
_SUPPORTED_TEXT = (
    "any transformers causal LM (AutoModelForCausalLM) or encoder-decoder (AutoModelForSeq2SeqLM) whose output layer "
    "is tied to its input embedding"
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


def copy_tokenizer(source: str | os.PathLike, output_dir: str | os.PathLike) -> None:
    """Re-save the tokenizer of ``source`` into ``output_dir`` without this machine's load settings (the
    converter and ``tiednorm-push`` ship a tokenizer this way)."""
    tokenizer = AutoTokenizer.from_pretrained(source)
    # Load-time bookkeeping that transformers keeps in init_kwargs describes this machine (e.g. offline mode), not
    # the tokenizer; published, it would make every user's load local-only.
    for key in ("is_local", "local_files_only"):
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(output_dir)


def _auto_class(config) -> type:
    """The Auto class that builds the LM of ``config``: seq2seq for encoder-decoders, causal otherwise."""
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    if type(config) not in auto._model_mapping:
        raise ValueError(
            f"cannot convert this checkpoint: {auto.__name__} has no model for model_type {config.model_type!r}. "
            f"Supported: {_SUPPORTED_TEXT}."
        )
    return auto


def _check_convertible(config) -> type:
    """Refuse, before any weight is loaded, what the config alone shows cannot convert; return the Auto class."""
    if config.model_type.startswith("tiednorm"):
        raise ValueError(
            f"this is an hf_tiednorm model already (model_type {config.model_type!r}): its head is normalized; "
            "change head_mode in its config instead of converting it"
        )
    auto = _auto_class(config)
    if not getattr(config, "tie_word_embeddings", False):
        raise ValueError(
            f"the {config.model_type} checkpoint has untied output embeddings (tie_word_embeddings=False): the "
            "normalized head scores tokens with the shared input embedding, so converting would drop the separate "
            f"output matrix and change the model. Supported: {_SUPPORTED_TEXT}."
        )
    return auto


def check_tied(model: PreTrainedModel) -> None:
    """Raise ``ValueError`` unless ``model``'s output layer is a bias-free linear layer holding its input embedding
    matrix: the same tensor, or (a checkpoint that stored both) equal values."""
    _check_convertible(model.config)
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or isinstance(head, TiedNormHead):
        raise ValueError(
            f"{type(model).__name__} has no plain linear output layer (got {type(head).__name__}); "
            f"pass a model with an LM head ({_SUPPORTED_TEXT})"
        )
    embedding = shared_embedding_modules(model)[0]
    if head.bias is not None:
        raise ValueError(f"the output layer of {type(model).__name__} has a bias, which a tied head cannot keep")
    if head.weight is not embedding.weight:
        if head.weight.shape != embedding.weight.shape or not torch.equal(head.weight, embedding.weight):
            difference = (
                f"shapes {tuple(head.weight.shape)} and {tuple(embedding.weight.shape)}"
                if head.weight.shape != embedding.weight.shape
                else f"max |difference| {(head.weight.float() - embedding.weight.float()).abs().max().item():.3g}"
            )
            raise ValueError(
                f"the config says tie_word_embeddings=True but the checkpoint's output matrix differs from its input "
                f"embedding ({difference}): it is untied, and converting would drop the output matrix. Set "
                "tie_word_embeddings=False in its config.json to use it as the untied model it is."
            )


def _check_unit_lookups(model: PreTrainedModel, norm_eps: float) -> None:
    """For the l2 mode: check, on a copy of each embedding module holding the shared matrix, that its class looks up
    through ``nn.Embedding.forward``, so that ``unit_lookups`` yields ŵ_i (times one constant, the scale the class
    applies). An architecture whose embedding computes its lookup otherwise is refused, and ``model`` is unchanged."""
    shared = model.get_output_embeddings().weight  # checked: the tied input embedding matrix
    with torch.no_grad():  # rows that have a direction (a padding row may be zero)
        ids = torch.nonzero(torch.linalg.vector_norm(shared.float(), dim=-1) > norm_eps).flatten()[:8]
    for module in shared_embedding_modules(model):
        probe = copy.copy(module)  # shares the weight; only the copy's class changes
        unit_lookups(probe, norm_eps)
        with torch.no_grad():
            looked_up = probe(ids).float()  # (8, d)
        scale = torch.linalg.vector_norm(looked_up, dim=-1, keepdim=True)  # one constant if the lookup is right
        expected = unit_rows(shared[ids].detach().float(), norm_eps) * scale
        if not (torch.allclose(looked_up, expected, atol=1e-5) and torch.allclose(scale, scale[0], rtol=1e-3)):
            raise ValueError(
                f"head_mode 'l2' needs unit-row lookups, but {type(module).__name__} does not look up "
                "through nn.Embedding.forward; use another head_mode for this architecture"
            )


def normalize_tied_head(
    model: PreTrainedModel,
    head_mode: str,
    *,
    logit_scale: str = "none",
    logit_scale_init: float | None = None,
    norm_eps: float = 1e-6,
) -> TiedNormWrappedPreTrainedModel:
    """Return the loaded tied ``model`` (a causal LM or an encoder-decoder) with the normalized tied head.

    The model itself is adopted, not copied: the result holds it as ``.model`` with its output layer replaced by a
    ``TiedNormHead`` (and, in l2 mode, unit-row lookups), and shares its weights. ``head_mode="baseline"`` gives
    exactly ``model``'s logits. The result saves and reloads with ``AutoModelFor*.from_pretrained(folder,
    trust_remote_code=True)``.

    Args:
        model: e.g. ``AutoModelForCausalLM.from_pretrained(...)`` of a model with tied embeddings.
        head_mode: one of ``HEAD_MODES``.
        logit_scale, logit_scale_init, norm_eps: the head's fields (configuration_tiednorm_wrapped.py).

    Returns:
        ``TiedNormWrappedForCausalLM`` or ``TiedNormWrappedForSeq2SeqLM``, in ``model``'s training mode.
    """
    check_tied(model)
    if head_mode == "l2":
        _check_unit_lookups(model, norm_eps)
    auto = _check_convertible(model.config)
    if type(model) is not auto._model_mapping[type(model.config)]:
        raise ValueError(
            f"{type(model).__name__} is not the model {auto.__name__} builds for {model.config.model_type!r} "
            f"({auto._model_mapping[type(model.config)].__name__}), which a saved conversion reloads as"
        )
    config = TiedNormWrappedConfig(
        text_config=model.config,
        head_mode=head_mode,
        logit_scale=logit_scale,
        logit_scale_init=logit_scale_init,
        norm_eps=norm_eps,
    )
    wrapper_class = TiedNormWrappedForSeq2SeqLM if model.config.is_encoder_decoder else TiedNormWrappedForCausalLM
    return wrapper_class(config, body=model).train(model.training)


def _target_config(source_config, head_mode: str, logit_scale: str, logit_scale_init: float | None):
    """The config of our own family for a marian / bart / llama source."""
    model_type = source_config.model_type
    fields = {k: v for k, v in source_config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    head_fields = {"head_mode": head_mode, "logit_scale": logit_scale, "logit_scale_init": logit_scale_init}
    if model_type == "marian":
        head_fields["tie_topology"] = "three_way" if source_config.share_encoder_decoder_embeddings else "decoder"
    elif model_type == "bart":  # BART's encoder and decoder always share model.shared
        head_fields["tie_topology"] = "three_way"
    return SUPPORTED_SOURCES[model_type][1](**fields, **head_fields)


def _to_own_family(
    source: Path, source_model: PreTrainedModel, head_mode: str, logit_scale: str, logit_scale_init: float | None
) -> PreTrainedModel:
    """Map a marian / bart / llama model 1:1 onto our family of the same architecture."""
    config = _target_config(source_model.config, head_mode, logit_scale, logit_scale_init)
    target_class = SUPPORTED_SOURCES[source_model.config.model_type][2]
    state = source_model.state_dict()
    if "final_logits_bias" in state and state["final_logits_bias"].count_nonzero() > 0:
        raise ValueError(
            f"{source} has a non-zero final_logits_bias, which hf_tiednorm's own {target_class.__name__} has no "
            "parameter for (converting would change the logits); convert with generic=True (CLI: --generic), which "
            "keeps the architecture's final_logits_bias"
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
    return model


def convert_checkpoint(
    source: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    head_mode: str = "baseline",
    logit_scale: str = "none",
    logit_scale_init: float | None = None,
    generic: bool = False,
) -> PreTrainedModel:
    """Load the tied checkpoint in ``source`` with the normalized head in ``head_mode``.

    marian / bart / llama sources become our own families unless ``generic``; every other tied causal LM or
    encoder-decoder is wrapped (``normalize_tied_head``). With ``output_dir`` (new or empty, outside ``source``), the
    converted model is saved there with its remote code, and the source's tokenizer if it has one. Returns the
    converted model in eval mode.
    """
    source = Path(source)
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} has no config.json; pass a local folder written by save_pretrained")
    check_head_mode(head_mode, logit_scale)
    if output_dir is not None:
        output_dir = Path(output_dir)
        if output_dir.resolve() == source.resolve() or source.resolve() in output_dir.resolve().parents:
            raise ValueError(f"output_dir {output_dir} must lie outside the source checkpoint {source}")
        if output_dir.exists() and any(output_dir.iterdir()):
            raise FileExistsError(f"{output_dir} is not empty; choose a new folder for the converted model")

    source_config = AutoConfig.from_pretrained(source)
    auto = _check_convertible(source_config)  # before loading any weight
    source_model = auto.from_pretrained(source, dtype="auto").eval()
    check_tied(source_model)
    if source_config.model_type in SUPPORTED_SOURCES and not generic:
        model = _to_own_family(source, source_model, head_mode, logit_scale, logit_scale_init)
    else:
        model = normalize_tied_head(
            source_model, head_mode, logit_scale=logit_scale, logit_scale_init=logit_scale_init
        )
    model.eval()

    if output_dir is not None:
        model.save_pretrained(output_dir)
        if (source / "tokenizer_config.json").is_file() or (source / "tokenizer.json").is_file():
            copy_tokenizer(source, output_dir)
    return model


def build_parser() -> argparse.ArgumentParser:
    """The ``tiednorm-convert`` command line; every option has a help text that names its default."""
    parser = argparse.ArgumentParser(
        prog="tiednorm-convert",
        description=f"Give a tied checkpoint ({_SUPPORTED_TEXT}) the normalized head. The weights are kept; "
        "with --head-mode baseline the logits equal the source's exactly, other modes change only the scoring "
        "(fine-tune afterwards). The output folder loads with trust_remote_code=True where hf_tiednorm is not "
        "installed.",
    )
    parser.add_argument("source", help="local folder of the source checkpoint (save_pretrained format)")
    parser.add_argument("output_dir", help="new or empty folder for the converted model")
    parser.add_argument(
        "--head-mode",
        default="baseline",
        choices=HEAD_MODES,
        help="how the head scores token i from the shared row w_i and the hidden state h: baseline w·h (plain "
        "tying), l2 ŵ·h with unit-row input lookups too, square w·h/‖w‖², distance w·h − ½‖w‖², cosine w·h/‖w‖ "
        "(default: %(default)s)",
    )
    parser.add_argument(
        "--logit-scale",
        default="none",
        choices=LOGIT_SCALES,
        help="multiply the scores by g: none, fixed (a constant g), scalar (one learned g) or vector (a learned g "
        "per token) (default: %(default)s)",
    )
    parser.add_argument(
        "--logit-scale-init",
        type=float,
        help="g for 'fixed', initial g for 'scalar'/'vector' (default: √d, d the hidden size)",
    )
    parser.add_argument(
        "--generic",
        action="store_true",
        help="wrap marian/bart/llama sources as they are (keeping e.g. a non-zero final_logits_bias) instead of "
        "mapping them onto hf_tiednorm's own families",
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    convert_checkpoint(
        args.source,
        args.output_dir,
        head_mode=args.head_mode,
        logit_scale=args.logit_scale,
        logit_scale_init=args.logit_scale_init,
        generic=args.generic,
    )
    print(f"wrote {args.output_dir}")


if __name__ == "__main__":
    main()
