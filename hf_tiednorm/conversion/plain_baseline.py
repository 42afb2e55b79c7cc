"""The plain baseline of a conversion (``tiednorm-convert SOURCE OUTPUT --plain``): the source as a stock model of its
own architecture, in fp32, with no normalized head.

A practitioner who converts a pretrained model fine-tunes the plain model beside the normalized one to compare the
two. ``--head-mode baseline`` gives plain tying's logits, but as an hf_tiednorm model; and a GGUF file loaded with
``from_pretrained(..., gguf_file=...)`` keeps a quantization config, so the Trainer refuses it as "purely
quantized". This writes the same weights as the parent architecture's own class, loadable without
``trust_remote_code``, from the same source checks and with the same provenance and tokenizer as a conversion.
"""

from __future__ import annotations

import os

import torch
from transformers import AutoConfig, PreTrainedModel

from .convert_checks import check_convertible, check_output_dir, check_source_loaded, check_tied, resolve_source
from .gguf_checks import drop_quantization_state
from .source_provenance import check_base_model_id, name_like_source, record_provenance, stated_provenance
from .staging_checks import TOKENIZER_FILES, check_tokenizer_files, save_staged


def plain_baseline(
    source: str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    gguf_file: str | None = None,
    base_model: str | None = None,
    license: str | None = None,
) -> PreTrainedModel:
    """The source as a stock model of its own architecture (``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ...), fp32,
    with the logits of ``convert_checkpoint(source, head_mode="baseline")``.

    Args:
        source, gguf_file, base_model, license: as ``convert_checkpoint``'s; the source must be one it converts
            (tied), so that the two models differ only in their head.
        output_dir: as ``convert_checkpoint``'s (new or empty, outside ``source``, staged): the model, its recorded
            provenance and the source's tokenizer are saved there.

    Returns:
        The model, in eval mode.
    """
    source, gguf_file = resolve_source(source, gguf_file)
    check_base_model_id(base_model)
    if output_dir is not None:
        output_dir = check_output_dir(output_dir, source)
    load = {"gguf_file": gguf_file} if gguf_file is not None else {}
    has_tokenizer = gguf_file is not None or any((source / name).is_file() for name in TOKENIZER_FILES)
    if output_dir is not None and has_tokenizer:
        check_tokenizer_files(source)
    auto = check_convertible(AutoConfig.from_pretrained(source, **load))  # tied, not ours, a causal LM or enc-dec
    model, loading = auto.from_pretrained(source, dtype=torch.float32, output_loading_info=True, **load)
    check_source_loaded(model, loading)
    drop_quantization_state(model)
    check_tied(model)
    record_provenance(model, stated_provenance(source, gguf_file), base_model=base_model, license=license)
    model = name_like_source(model.eval(), model.name_or_path)
    if output_dir is not None:
        save_staged(model, output_dir, source, has_tokenizer, load)
    return model


__all__ = ["plain_baseline"]
