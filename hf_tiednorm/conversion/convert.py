"""Give a tied checkpoint of any ``transformers`` causal LM or encoder-decoder the normalized tied head.

``marian``, ``bart`` and ``llama`` map 1:1 onto hf_tiednorm's own families (families/table.py; Marian's / BART's
``final_logits_bias`` must be zero there, as in released models, or use ``generic=True``). Every other tied causal LM
or encoder-decoder (GPT-2, Qwen, Gemma, Mistral, Phi-3, T5, mBART, NLLB, ...), and those three with ``generic=True``,
is wrapped as it is (families/wrapped.py). ``normalize_tied_head`` (a model in memory) and
``convert_checkpoint`` (a folder or GGUF file; CLI ``tiednorm-convert``) give the same model by default: same class,
weight names, ``name_or_path`` and logits. With ``head_mode="baseline"`` the logits are exactly the source's; other
modes change how the output layer scores tokens (and, in l2 mode, the lookups) and need fine-tuning unless the model
starts lossless (``lossless_start=True``; lossless_start.py). A converted model carries no quantization state; the
source's Hub id and license are recorded in its config (``provenance``, source_provenance.py) for every later card.
Untied sources are refused (the head scores with the input embedding: a separate output matrix would be dropped), as
is a config claiming a tie its checkpoint does not hold. The source folder is only read.

``plain_baseline`` (``--plain``) writes the source as a stock model of its own architecture in fp32 instead: the
plain model to fine-tune beside the normalized one.

CLI::

    python -m hf_tiednorm.convert path/to/gpt2 converted/ --head-mode cosine
    tiednorm-convert path/to/SmolLM2-135M-Instruct.Q4_1.gguf converted/ --head-mode cosine --lossless-start
    tiednorm-convert path/to/SmolLM2-135M-Instruct.Q4_1.gguf plain/ --plain
"""

from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, PreTrainedModel

from ..modeling.families.head_host import fp32_term_names
from ..modeling.families.table import WRAPPED, family_of_source
from ..modeling.families.wrapped import (
    TiedNormWrappedPreTrainedModel,
)
from ..modeling.head.modes import get_head_mode
from ..modeling.head.settings import DEFAULT_HEAD_MODE, RENAMED_FIELDS, HeadSettings, renamed_value
from ..modeling.head.terms import learned_terms
from .convert_checks import (
    SUPPORTED_TEXT,
    check_convertible,
    check_output_dir,
    check_source_loaded,
    check_tied,
    check_unit_lookups,
    drop_computed_tables,
    refuse_peft_before_normalizing,
    resolve_source,
    tie_parallel_output_rows,
    tied_copy,
)
from .field_flags import add_extra_term_flags, add_head_setting_flags, head_settings_from_flags
from .gguf_checks import drop_quantization_state
from .lossless_start import start_lossless, take_row_scales, takes_row_scales, with_lossless_start
from .plain_baseline import plain_baseline
from .source_provenance import (
    check_base_model_id,
    folder_provenance,
    name_like_source,
    portable_name_or_path,
    record_provenance,
    stated_provenance,
)
from .staging_checks import TOKENIZER_FILES, check_tokenizer_files, save_staged

# Config entries describing the source checkpoint or derived by our configs (tie_topology sets the tying flags).
_DROPPED_CONFIG_KEYS = (
    "model_type", "architectures", "transformers_version", "_name_or_path", "_model_name_or_path", "auto_map",
    "tie_word_embeddings", "share_encoder_decoder_embeddings",
)  # fmt: skip
# Keys that exist on only one side of the mapping: Marian's and BART's (zero) output bias, and the head's learned
# terms (head/settings.HeadTerm) that only its settings add (initialized by the model).
_SOURCE_ONLY_KEYS = {"final_logits_bias"}
def _target_only_keys() -> set[str]:
    return {f"lm_head.{term}" for term in learned_terms()}


def keep_head_terms_fp32(model: nn.Module) -> None:
    """Put the head's learned terms that stay fp32 (``HeadTerm.keep_fp32``) back in fp32 after a cast of the whole
    model (``model.to(torch.bfloat16)``), in place, as ``from_pretrained`` keeps them."""
    kept = fp32_term_names()
    for name, param in model.named_parameters():
        if name.rpartition(".")[2] in kept and param.dtype != torch.float32:
            param.data = param.data.float()


def head_settings_of(
    settings: HeadSettings | None, head_mode: str | None, fields: dict, lossless: bool
) -> HeadSettings:
    """The head's settings given as ``settings`` or as keywords (``head_mode`` and any other ``HeadSettings`` field:
    each head term's config fields, ``extra_terms``, ``norm_eps``), not both; with a lossless start's terms on.
    ``options=``, the keyword's name before ``HeadSettings``, is taken with a FutureWarning."""
    if "options" in fields:
        fields = dict(fields)
        warnings.warn("the keyword options= is renamed settings= (a HeadSettings); options= will stop working in a "
                      "future release", FutureWarning, stacklevel=3)  # fmt: skip
        if settings is not None:
            raise ValueError("pass the head's settings as settings= only (options= is its old name)")
        settings = fields.pop("options")
    for old, new in RENAMED_FIELDS.items():  # logit_scale=: warned at the caller of normalize_tied_head / ...
        if old in fields:
            fields = dict(fields)
            fields[new] = renamed_value(old, fields.pop(old), fields.get(new, "none"), "keyword argument", 3)
    if settings is None:
        settings = HeadSettings(head_mode=head_mode or DEFAULT_HEAD_MODE, **fields)  # an unknown keyword: TypeError
    elif head_mode is not None or fields:
        given = ", ".join(f"{name}=..." for name in ([] if head_mode is None else ["head_mode"]) + list(fields))
        raise ValueError(f"pass the head's settings either as settings or as {given}, not both")
    return with_lossless_start(settings) if lossless else settings


def normalize_tied_head(
    model: PreTrainedModel,
    head_mode: str | None = None,
    *,
    lossless_start: bool = False,
    settings: HeadSettings | None = None,
    generic: bool = False,
    base_model: str | None = None,
    license: str | None = None,
    **head_settings,
) -> PreTrainedModel:
    """Return the loaded tied ``model`` (a causal LM or an encoder-decoder) with the normalized tied head.

    A marian / bart / llama ``model`` becomes our own family of its architecture (the default, as the CLI does), the
    same class, weights layout, ``name_or_path`` and logits that ``convert_checkpoint`` (CLI ``tiednorm-convert``
    without ``--generic``) gives for it: its weights are copied into the new model, and ``model`` is left as it was.
    Every other architecture, and every one with ``generic=True``, is wrapped: the model itself is adopted, not
    copied: the result holds it as ``.model`` with its output layer replaced by a
    ``TiedNormHead`` (and, in a mode that normalizes the input lookups, unit-row lookups), and shares its weights.
    ``head_mode="baseline"`` gives exactly ``model``'s logits, and so does every mode with a lossless start
    (``HeadMode.lossless_start``) with ``lossless_start``. The result saves and reloads with
    ``AutoModelFor*.from_pretrained(folder, trust_remote_code=True)``. A model loaded from a GGUF file loses its
    (stale) quantization state.

    Args:
        model: e.g. ``AutoModelForCausalLM.from_pretrained(...)`` of a model with tied embeddings (``gguf_file=...``
            works too).
        head_mode, **head_settings: the head's settings (``HeadSettings`` fields: each head term's config fields,
            ``extra_terms``, ``norm_eps``), or ``settings`` holding them all (then leave these unset); ``head_mode``
            None: the default mode. ``logit_scale``, the old name of ``logit_scale_kind``, still works with a
            FutureWarning naming the new one.
        lossless_start: start at the source's logits (module docstring); switches on the head terms it sets.
        generic: False (the default, as the CLI's): map marian / bart / llama onto our own families; True: wrap
            them (the CLI's ``--generic``). Other architectures are wrapped either way.
        base_model, license: the source's Hub id and license, recorded in the config (``provenance``, read by every
            card) over what ``model.name_or_path`` states (source_provenance.py); None: what it states, or unknown.

    Returns:
        ``TiedNormForConditionalGeneration`` / ``TiedNormBartForConditionalGeneration`` / ``TiedNormForCausalLM``
        for a marian / bart / llama model (without ``generic``), else ``TiedNormWrappedForCausalLM`` /
        ``TiedNormWrappedForSeq2SeqLM``, in ``model``'s training mode, with ``model``'s ``name_or_path`` (PEFT records
        it as the adapter's base model; a saved config keeps only a Hub id, ``portable_name_or_path``).
    """
    refuse_peft_before_normalizing(model)  # normalize first, then get_peft_model (head/peft_guard.py)
    check_base_model_id(base_model)
    settings = head_settings_of(settings, head_mode, head_settings, lossless_start)
    drop_quantization_state(model)
    name_or_path = model.name_or_path
    own_family = not generic and family_of_source(model.config.model_type) is not None
    # The own family normalizes its lookups itself; convert_checkpoint checks unit lookups only for the wrapper.
    auto = check_convertible(model.config) if own_family else check_source_model(model, settings)
    if type(model) is not auto._model_mapping[type(model.config)]:
        raise ValueError(
            f"{type(model).__name__} is not the model {auto.__name__} builds for {model.config.model_type!r} "
            f"({auto._model_mapping[type(model.config)].__name__}), which a saved conversion reloads as"
        )
    if own_family:
        check_tied(model)
        converted = _own_family_in_memory(model, settings, lossless_start)
    else:
        converted = _wrap(model, settings, lossless_start)
    record_provenance(converted, folder_provenance(name_or_path), base_model=base_model, license=license)
    return name_like_source(converted, name_or_path, _computes_source_logits(settings, lossless_start))


def _computes_source_logits(settings: HeadSettings, lossless_start: bool) -> bool:
    """Whether a conversion with ``settings`` starts with its source's logits: a lossless start, or the plain
    baseline head with no learned term."""
    return lossless_start or settings == HeadSettings(norm_eps=settings.norm_eps)


def _own_family_in_memory(model: PreTrainedModel, settings: HeadSettings, lossless_start: bool) -> PreTrainedModel:
    """A loaded marian / bart / llama ``model`` (checked) as our own family, as ``convert_checkpoint`` builds it
    from a folder: same class, weights layout and start; on ``model``'s device, in its training mode."""
    converted = _to_own_family(model.name_or_path or type(model).__name__, model, settings)
    converted = converted.to(model.device).train(model.training)
    if lossless_start:
        start_lossless(converted)
    return converted


def check_source_model(model: PreTrainedModel, settings: HeadSettings) -> type:
    """Every check a loaded source goes through, once: convertible (config), tied (weights) and, for a mode that
    normalizes the input lookups, lookups that can be made unit rows. Returns the Auto class of its architecture."""
    auto = check_convertible(model.config)
    check_tied(model)
    if get_head_mode(settings.head_mode).normalizes_input_lookups:
        check_unit_lookups(model, settings.norm_eps)
    return auto


def _wrap(model: PreTrainedModel, settings: HeadSettings, lossless_start: bool) -> TiedNormWrappedPreTrainedModel:
    """``model`` (checked: ``check_source_model``) inside the wrapper with a head of ``settings``."""
    # The adopted model's config is saved as text_config: it names its source only by a Hub id, never a local path.
    model.config._name_or_path = portable_name_or_path(model.config._name_or_path)
    config = WRAPPED.config_class(text_config=model.config, **settings.as_config_fields())
    wrapper_class = WRAPPED.lm_class_for(model.config.is_encoder_decoder)
    wrapped = wrapper_class(config, body=model).train(model.training)
    if lossless_start:
        start_lossless(wrapped)
    return wrapped


def _target_config(source_config, settings: HeadSettings):
    """The config of our own family for a source it maps 1:1 from (families/table.py), with the head's ``settings``."""
    family = family_of_source(source_config.model_type)
    fields = {k: v for k, v in source_config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    head_fields = settings.as_config_fields()
    if family.is_encoder_decoder:  # Marian with two vocabularies shares only the decoder's; BART always shares
        shared = getattr(source_config, "share_encoder_decoder_embeddings", True)
        head_fields["tie_topology"] = "three_way" if shared else "decoder"
    return family.config_class(**fields, **head_fields)


def _to_own_family(source: Path, source_model: PreTrainedModel, settings: HeadSettings) -> PreTrainedModel:
    """Map a marian / bart / llama model 1:1 onto our family of the same architecture."""
    config = _target_config(source_model.config, settings)
    target_class = family_of_source(source_model.config.model_type).lm_class
    state = source_model.state_dict()
    if "final_logits_bias" in state and state["final_logits_bias"].count_nonzero() > 0:
        raise ValueError(
            f"{source} has a non-zero final_logits_bias, which hf_tiednorm's own {target_class.__name__} has no "
            "parameter for (converting would change the logits); convert with generic=True (CLI: --generic), which "
            "keeps the architecture's final_logits_bias"
        )
    model = target_class(config).to(source_model.dtype)
    keep_head_terms_fp32(model)  # g and b stay fp32 in a bf16/fp16 source, as from_pretrained keeps them
    drop_computed_tables(source, model, state)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = set(missing) - _target_only_keys()
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
    head_mode: str | None = None,
    generic: bool = False,
    gguf_file: str | None = None,
    lossless_start: bool = False,
    settings: HeadSettings | None = None,
    base_model: str | None = None,
    license: str | None = None,
    **head_settings,
) -> PreTrainedModel:
    """Load the tied checkpoint in ``source`` with the normalized head in ``head_mode``.

    marian / bart / llama sources become our own families unless ``generic``; every other tied causal LM or
    encoder-decoder is wrapped (``normalize_tied_head``). With ``output_dir`` (new or empty, outside ``source``), the
    converted model is saved there with its remote code, and the source's tokenizer if it has one, staged beside it
    and renamed into place (a failed conversion leaves no output folder). Returns the converted model in eval mode.

    Args:
        source: a folder written by ``save_pretrained``; with ``gguf_file``, the folder holding that GGUF file; or
            the path of a ``.gguf`` file itself.
        gguf_file: name of a GGUF file in ``source`` (transformers' ``gguf_file``; needs the gguf extra:
            ``python -m pip install -e ".[gguf]"``).
        lossless_start: start at the source's logits (module docstring); switches on the head terms it sets.
        head_mode, **head_settings: the head's settings (``HeadSettings`` fields: each head term's config fields,
            ``extra_terms``, ``norm_eps``), or ``settings`` holding them all; ``head_mode`` None: the default mode
            (head_modes.DEFAULT_HEAD_MODE). ``logit_scale`` (the old name of ``logit_scale_kind``) works with a
            FutureWarning.
        base_model, license: the source's Hub id and license (CLI ``--base-model`` / ``--license``), recorded in the
            saved config (``provenance``) over what the source states: its README.md / config, or the GGUF file's
            ``general.license`` (source_provenance.py). None: what the source states, else unknown.
    """
    source, gguf_file = resolve_source(source, gguf_file)
    check_base_model_id(base_model)
    settings = head_settings_of(settings, head_mode, head_settings, lossless_start)
    if output_dir is not None:
        output_dir = check_output_dir(output_dir, source)

    load = {"gguf_file": gguf_file} if gguf_file is not None else {}
    has_tokenizer = gguf_file is not None or any((source / name).is_file() for name in TOKENIZER_FILES)
    if output_dir is not None and has_tokenizer:
        check_tokenizer_files(source)  # a corrupt tokenizer.json is named before any work
    source_config = AutoConfig.from_pretrained(source, **load)
    # An untied source whose output rows are positive multiples c_i of its input rows (a plain export with a trained
    # logit scale) converts with a lossless start that sets a logit scale: c_i goes into g_i. Others are refused.
    parallel = (
        lossless_start and takes_row_scales(get_head_mode(settings.head_mode))
        and not getattr(source_config, "tie_word_embeddings", False)
    )  # fmt: skip
    auto = check_convertible(tied_copy(source_config) if parallel else source_config)  # before loading any weight
    source_model, loading = auto.from_pretrained(source, dtype="auto", output_loading_info=True, **load)
    check_source_loaded(source_model, loading)  # a tensor missing from the folder is named, not made up (issue 40)
    source_model.eval()
    drop_quantization_state(source_model)
    row_scales = tie_parallel_output_rows(source_model, str(source), settings.norm_eps) if parallel else None
    check_tied(source_model)
    if family_of_source(source_config.model_type) is not None and not generic:
        model = _to_own_family(source, source_model, settings)
        if lossless_start:
            start_lossless(model)
    else:
        if get_head_mode(settings.head_mode).normalizes_input_lookups:
            check_unit_lookups(source_model, settings.norm_eps)
        model = _wrap(source_model, settings, lossless_start)
    if row_scales is not None:
        take_row_scales(model, row_scales)
    record_provenance(model, stated_provenance(source, gguf_file), base_model=base_model, license=license)
    model = name_like_source(model.eval(), source_model.name_or_path, _computes_source_logits(settings, lossless_start))
    if output_dir is not None:
        save_staged(model, output_dir, source, has_tokenizer, load)
    return model


def build_parser() -> argparse.ArgumentParser:
    """The ``tiednorm-convert`` command line; every option has a help text that names its default."""
    parser = argparse.ArgumentParser(
        prog="tiednorm-convert",
        description=f"Give a tied checkpoint ({SUPPORTED_TEXT}) the normalized head. The weights are kept; "
        "with --head-mode baseline the logits equal the source's exactly, other modes change only the scoring "
        "(fine-tune afterwards). The output folder loads with trust_remote_code=True where hf_tiednorm is not "
        "installed.",
    )
    parser.add_argument(
        "source",
        help="local folder of the source checkpoint (save_pretrained format; with --gguf-file, the folder holding "
        "that file), or the path of a .gguf file",
    )
    parser.add_argument("output_dir", help="new or empty folder for the converted model")
    add_head_setting_flags(parser)  # --head-mode ... --norm-eps: the head's config fields (field_flags.py)
    parser.add_argument(
        "--gguf-file",
        help="name of a GGUF file inside SOURCE, dequantized on load; needs the gguf extra (python -m pip install -e "
        "\".[gguf]\") (default: none, SOURCE is a save_pretrained folder or a .gguf path)",
    )
    parser.add_argument(
        "--lossless-start",
        action="store_true",
        help="start at the source's logits: the terms each mode declares (cosine/square a per-token logit scale "
        "‖w_i‖ / ‖w_i‖², distance a logit bias ½‖w_i‖²; l2 is refused: its input lookups change too) (default: off)",
    )
    parser.add_argument(
        "--license",
        help="license id of the source's weights, recorded for every card of this model and its fine-tunes "
        "(default: what the source states: its README.md or config, a GGUF's general.license; else unknown)",
    )
    parser.add_argument(
        "--base-model",
        help="Hub id of the source (owner/name), recorded for every card (default: what the source states: its "
        "place in the Hugging Face cache or its config; else none, and the card says a local model)",
    )
    parser.add_argument(
        "--generic",
        action="store_true",
        help="wrap marian/bart/llama sources as they are (keeping e.g. a non-zero final_logits_bias) instead of "
        "mapping them onto hf_tiednorm's own families",
    )
    parser.add_argument(
        "--plain",
        action="store_true",
        help="write SOURCE as a stock model of its own architecture instead (LlamaForCausalLM, Qwen3ForCausalLM, ...): "
        "fp32, no normalized head, GGUF quantization state dropped, loadable without trust_remote_code; the plain "
        "baseline to fine-tune beside a normalized conversion of the same source (its logits equal --head-mode "
        "baseline's). Takes no head flags (default: off)",
    )
    add_extra_term_flags(parser)  # last: a registered term's flag may not shadow one above
    return parser


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # the settings checked once, as the one value the conversion passes on
        settings = head_settings_from_flags(args)
    except ValueError as error:
        parser.error(str(error))
    if args.plain:
        given = [flag for flag, on in (("--lossless-start", args.lossless_start), ("--generic", args.generic),
                                       ("head flags (--head-mode, ...)", settings != HeadSettings())) if on]
        if given:
            parser.error(f"--plain writes the source as it is, with no normalized head: drop {', '.join(given)}")
        plain_baseline(args.source, args.output_dir, gguf_file=args.gguf_file, base_model=args.base_model,
                       license=args.license)
        print(f"wrote {args.output_dir} (the plain baseline)")
        return
    convert_checkpoint(
        args.source,
        args.output_dir,
        settings=settings,
        generic=args.generic,
        gguf_file=args.gguf_file,
        lossless_start=args.lossless_start,
        base_model=args.base_model,
        license=args.license,
    )
    print(f"wrote {args.output_dir}")


if __name__ == "__main__":
    main()
