"""What a source must be for ``tiednorm-convert`` / ``normalize_tied_head`` (convert.py): a tied causal LM or
encoder-decoder that transformers' Auto classes build, whose output layer is a bias-free linear layer holding its input
embedding matrix, and, for the l2 mode, whose embedding modules look up through ``nn.Embedding.forward``. Each check
raises ``ValueError`` naming what is wrong and what to do instead.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, PreTrainedModel

from ..modeling.families.table import family_of_config
from ..modeling.families.wrapped_head import shared_embedding_modules, unit_lookups
from ..modeling.head.layer import TiedNormHead
from ..modeling.head.modes import unit_rows
from ..modeling.head.peft_guard import PEFT_EMBEDDING_ADVICE
from ..modeling.load_checks import other_tensor_errors, refuse_load_errors
from .gguf_checks import check_gguf_file
from .path_identity import is_same_or_inside

SUPPORTED_TEXT = (
    "any transformers causal LM (AutoModelForCausalLM) or encoder-decoder (AutoModelForSeq2SeqLM) whose output layer "
    "is tied to its input embedding"
)


def _auto_class(config) -> type:
    """The Auto class that builds the LM of ``config``: seq2seq for encoder-decoders, causal otherwise."""
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    if type(config) not in auto._model_mapping:
        raise ValueError(
            f"cannot convert this checkpoint: {auto.__name__} has no model for model_type {config.model_type!r}. "
            f"Supported: {SUPPORTED_TEXT}."
        )
    return auto


def check_convertible(config) -> type:
    """Refuse, before any weight is loaded, what the config alone shows cannot convert; return the Auto class."""
    if family_of_config(config) is not None:
        raise ValueError(
            f"this is an hf_tiednorm model already (model_type {config.model_type!r}): its head is normalized; "
            "change head_mode in its config instead of converting it"
        )
    auto = _auto_class(config)
    if not getattr(config, "tie_word_embeddings", False):
        raise ValueError(
            f"the {config.model_type} checkpoint has untied output embeddings (tie_word_embeddings=False): the "
            "normalized head scores tokens with the shared input embedding, so converting would drop the separate "
            f"output matrix and change the model. Supported: {SUPPORTED_TEXT}."
        )
    return auto


@torch.no_grad()
def parallel_row_scales(output_rows: torch.Tensor, input_rows: torch.Tensor, eps: float, where: str) -> torch.Tensor:
    """c (V,) fp32 with output row r_i = c_i·w_i and c_i > 0 for every row, checked numerically; ``ValueError``
    naming the first row that is not a positive multiple of its input row (``where`` names the checkpoint).

    A plain export of a model with a trained logit scale (hf_tiednorm's ``tiednorm-export``) is untied but every
    output row is parallel to its lookup (row i = g_i·σ_i·w_i), so a lossless start that sets a per-token logit scale
    can take c_i into g_i and give back its logits. A dead input row (‖w_i‖ ≤ eps) must have a dead output row (c_i =
    0: both score 0)."""
    if output_rows.shape != input_rows.shape:
        raise ValueError(
            f"{where}: the output matrix {tuple(output_rows.shape)} and the input embedding {tuple(input_rows.shape)} "
            "differ in shape, so its output rows cannot be multiples of its input rows"
        )
    r, w = output_rows.float(), input_rows.float()
    norms = torch.linalg.vector_norm(w, dim=-1)
    live = norms > eps
    scales = torch.where(live, (r * w).sum(-1) / norms.clamp_min(eps).square(), torch.zeros_like(norms))
    residual = torch.linalg.vector_norm(r - scales[:, None] * w, dim=-1)
    tolerance = max(1e-5, 64 * torch.finfo(output_rows.dtype).eps)
    bad = (residual > tolerance * torch.linalg.vector_norm(r, dim=-1).clamp_min(eps)) | (live & (scales <= 0))
    bad |= ~live & (torch.linalg.vector_norm(r, dim=-1) > eps)
    if bad.any():
        row = int(bad.nonzero()[0])
        raise ValueError(
            f"{where} has untied output embeddings and its output row {row} is not a positive multiple of its input "
            f"row {row} (c = {scales[row].item():.4g}, |r − c·w| = {residual[row].item():.3g}, ‖r‖ = "
            f"{torch.linalg.vector_norm(r[row]).item():.3g}; {int(bad.sum())} such rows): a lossless start can take "
            "a per-token factor of each row into the logit scale, nothing else. Supported: "
            f"{SUPPORTED_TEXT}, or an untied one whose output rows are positive multiples of its input rows (a plain "
            "export) with --lossless-start in a mode that sets a logit scale."
        )
    return scales


def tie_parallel_output_rows(model: PreTrainedModel, where: str, eps: float) -> torch.Tensor:
    """Tie the untied ``model``'s output layer to its input embedding, in place, after checking that its output rows
    are positive multiples c_i of the input rows (``parallel_row_scales``) and that tying changes no other weight
    (an encoder-decoder whose encoder, decoder and shared lookups differ is refused). Returns c (V,) fp32."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if not isinstance(head, nn.Linear) or isinstance(head, TiedNormHead) or head.bias is not None:
        raise ValueError(f"{where}: the output layer is not a bias-free linear layer (got {type(head).__name__})")
    scales = parallel_row_scales(head.weight, embedding.weight, eps, where)
    before = dict(model.state_dict())
    head_keys = {f"{name}.weight" for name, module in model.named_modules() if module is head}
    model.config.tie_word_embeddings = True
    model.tie_weights()
    changed = [k for k, v in model.state_dict().items() if k in before and k not in head_keys
               and not torch.equal(v, before[k])]  # fmt: skip
    if changed or model.get_output_embeddings().weight is not embedding.weight:
        raise ValueError(
            f"{where}: tying its output layer to its input embedding also changes {changed or 'the output layer'}: "
            "its lookups are untied too, which one normalized tied matrix cannot hold"
        )
    return scales


def tied_copy(config):
    """A copy of ``config`` claiming tied embeddings (an untied source whose output rows are parallel to its input
    rows is checked as the tied model it converts to)."""
    config = copy.deepcopy(config)
    config.tie_word_embeddings = True
    return config


def check_tied(model: PreTrainedModel) -> None:
    """Raise ``ValueError`` unless ``model``'s output layer is a bias-free linear layer holding its input embedding
    matrix: the same tensor, or (a checkpoint that stored both) equal values. (``check_convertible`` checks its
    config.)"""
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear) or isinstance(head, TiedNormHead):
        raise ValueError(
            f"{type(model).__name__} has no plain linear output layer (got {type(head).__name__}); "
            f"pass a model with an LM head ({SUPPORTED_TEXT})"
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


def check_unit_lookups(model: PreTrainedModel, norm_eps: float) -> None:
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


def refuse_peft_before_normalizing(model: nn.Module) -> None:
    """Raise ``ValueError`` when ``model``, about to get the normalized head (``normalize_tied_head``), is a
    ``PeftModel`` or carries PEFT layers already (``get_peft_model`` injects them into the model it is given).

    Normalizing then would replace modules under the adapters (the saved adapter keys no longer match and reload
    re-initialized), or find a LoRA layer where the output layer should be (PEFT's ``lora.Linear``, reported as
    "got Linear"). The order that works: normalize the plain model, then ``get_peft_model`` on the result.
    """
    peft_classes = {"PeftModel", "BaseTunerLayer", "ModulesToSaveWrapper", "TrainableTokensWrapper"}
    found = next(
        (
            (name or "the model itself", type(module).__name__)
            for name, module in model.named_modules()
            if peft_classes.intersection(cls.__name__ for cls in type(module).__mro__)
        ),
        None,
    )
    if found is not None:
        raise ValueError(
            f"normalize_tied_head got a model that PEFT has wrapped already ({found[0]} is a PEFT "
            f"{found[1]}): normalize first, then add adapters, i.e. "
            "model = normalize_tied_head(base_model, ...) and then get_peft_model(model, LoraConfig(...)) on the "
            f"normalized model (load the base model again if get_peft_model has modified it). {PEFT_EMBEDDING_ADVICE}"
        )



def check_source_loaded(model: nn.Module, loading_info: dict) -> None:
    """The same refusal for a model of transformers' own classes (a conversion's source), loaded with
    ``from_pretrained(..., output_loading_info=True)``: every missing or unexpected tensor is named with the folder,
    instead of converting a randomly initialized layer "lossless"."""
    missing, unexpected = set(loading_info["missing_keys"]), set(loading_info["unexpected_keys"])
    refuse_load_errors(model, other_tensor_errors(model, missing, unexpected))


def resolve_source(source: str | os.PathLike, gguf_file: str | None) -> tuple[Path, str | None]:
    """(folder, GGUF file name or None) of a source given as a folder, a folder and ``gguf_file``, or a ``.gguf``
    path; ``FileNotFoundError`` naming what is missing, ``ValueError`` for a truncated GGUF file."""
    source = Path(source)
    if gguf_file is None and source.suffix == ".gguf":
        source, gguf_file = source.parent, source.name
    if gguf_file is not None:
        if not (source / gguf_file).is_file():
            raise FileNotFoundError(f"GGUF file {source / gguf_file} does not exist")
        check_gguf_file(source / gguf_file)  # a truncated file is named as such (gguf_checks.py)
    elif not (source / "config.json").is_file():
        raise FileNotFoundError(
            f"{source} has no config.json; pass a local folder written by save_pretrained, or a .gguf file"
        )
    return source, gguf_file


def drop_computed_tables(source: Path, model: PreTrainedModel, state: dict) -> None:
    """Take out of ``state`` what the target computes instead of loading (Marian's sinusoidal position tables: a
    frozen parameter of transformers' Marian, a buffer of ours), refusing by name a source whose table differs."""
    saved = model.state_dict()
    for name, table in model.named_buffers():
        if name in state and name not in saved:
            given = state.pop(name)
            if given.shape != table.shape or not torch.allclose(
                given.float(), table.float(), rtol=0, atol=max(1e-5, torch.finfo(table.dtype).eps)):
                raise ValueError(f"{source}'s {name} is not the table {type(model).__name__} computes (sinusoidal "
                                 f"positions): converting would change the logits")


def check_output_dir(output_dir: str | os.PathLike, source: Path) -> Path:
    """``output_dir`` as a ``Path`` if it can take a conversion of ``source``: a new or empty folder, outside the
    source (by device and inode), not below a file."""
    output_dir = Path(output_dir)
    existing = next(path for path in (output_dir, *output_dir.absolute().parents) if path.exists())
    if not existing.is_dir():  # output_dir is a file, or lies below one
        raise NotADirectoryError(f"output_dir {output_dir}: {existing} is a file; choose a new or empty folder")
    if is_same_or_inside(output_dir, source):  # by device and inode: a bind mount or link too
        raise ValueError(f"output_dir {output_dir} must lie outside the source checkpoint {source}")
    if output_dir.exists() and any(output_dir.iterdir()):
        raise FileExistsError(f"{output_dir} is not empty; choose a new folder for the converted model")
    return output_dir


__all__ = [
    "SUPPORTED_TEXT", "check_convertible", "check_output_dir", "check_source_loaded", "check_tied",
    "check_unit_lookups", "drop_computed_tables", "parallel_row_scales", "refuse_peft_before_normalizing",
    "resolve_source", "tie_parallel_output_rows", "tied_copy",
]  # fmt: skip
