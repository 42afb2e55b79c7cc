"""Train normalized, ship plain: bake an hf_tiednorm model into a checkpoint of its parent architecture.

After training, every head mode is an affine map of the plain scores along the vocabulary axis,
``s = (W·h) * scale + bias`` (head/layer.py; the logit scale g and the logit bias b included), so a plain
``nn.Linear`` with rows ``W * scale[:, None]`` plus the parent's own per-token bias slot computes the same logits.
Nothing of the normalized head is needed at inference: the export loads with stock ``AutoModel*.from_pretrained``
(no remote code, no ``auto_map``, no ``*.py``) and any engine that serves the parent architecture serves it.

================================= ======================================================================
source                            parent architecture (the checkpoint written)
================================= ======================================================================
``tiednorm_seq2seq``              ``MarianMTModel`` (all three tie topologies)
``tiednorm_bart``                 ``BartForConditionalGeneration`` (one vocabulary for encoder and decoder)
``tiednorm_causal``               ``LlamaForCausalLM``
``tiednorm_wrapped``              the wrapped architecture itself (GPT-2, Qwen, Gemma, T5, Marian, ...)
================================= ======================================================================

What changes: the output layer is untied (its rows are the effective rows, and Press & Wolf's projection P is
folded into them: (W'P)·h = W'·(P·h)) unless the effective rows are the input lookups, i.e. the effective fp32 scale
of every row is 1 up to the rounding of its own fp32 computation (``baseline`` and ``l2`` without a logit scale, an
untrained lossless start), whatever the weight dtype, in which case the tie is kept (an untied encoder-decoder
parent stores its encoder, decoder and shared lookups apart: transformers 5 ties them only with
``tie_word_embeddings``); ``l2``'s unit-row lookups ŵ_i are written into the embedding; the effective bias goes
to ``final_logits_bias`` (added to what a wrapped Marian/BART already had). A parent without a head bias (Llama,
Qwen, Gemma, GPT-2, T5, ...) takes only a model whose bias is identically zero. Adaptive input/softmax has no parent
architecture and is refused. The untied output layer adds a V×d matrix: the size increase is reported.

Every export is checked before anything is written: a baked tensor that is not finite is refused by name, and the
export's logits must equal the model's on random token ids within ``logit_tolerance`` (``check=False`` skips only
the logit comparison; export_checks.py), compared with the parent as ``from_pretrained`` builds it from the written
folder (``_parent_as_loaded``), so a bf16/fp16 checkpoint is checked as it will be served; a refusal names the tensor
or buffer that differs between the two (``differing_tensors``). The output folder is staged beside its target and
renamed into place (``staged_folder``).

CLI (``tiednorm-export``; ``python -m hf_tiednorm.export`` is the same)::

    tiednorm-export runs/cosine exported/
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from collections import defaultdict
from dataclasses import dataclass, fields
from pathlib import Path

import torch
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSeq2SeqLM,
    PreTrainedModel,
)

from ..modeling.families.configuration import TiedNormHeadConfigMixin
from ..modeling.families.configuration_techniques import TiedNormTechniquesConfigMixin
from ..modeling.families.table import family_of_config
from ..modeling.head.layer import TiedNormEmbedding, TiedNormHead
from ..modeling.head.modes import get_head_mode
from ..modeling.head.settings import HeadSettings
from ..modeling.head.terms import active_terms, learned_terms
from .export_checks import check_logits, differing_tensors, refuse_non_finite, rows_are_lookups
from .lossless_start import term_switches
from .plain_head import plain_input_weight, plain_output_layer
from .saved_code import VERSION_FIELD
from .staging_checks import (
    check_new_folder,
    check_tokenizer_files,
    check_tokenizer_fits,
    check_weight_files,
    copy_tokenizer,
    find_tokenizer,
    staged_folder,
)

# The parent of each row of the family table (families/table.py) is the architecture it converts from 1:1, the
# wrapper's the wrapped one; the table answers every per-family question of the export, so a new family exports without
# an edit here.
BIAS_PARENTS = "Marian, BART, mBART, Pegasus, Blenderbot (architectures with a final_logits_bias)"
# Fields that only hf_tiednorm's configs have (the parent config must not carry them) and bookkeeping that names the
# source or its remote code (VERSION_FIELD: the hf_tiednorm version whose code a folder carries; a plain one has none).
_OWN_FIELDS = {f.name for mixin in (TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin) for f in fields(mixin)}
_DROPPED = _OWN_FIELDS | {
    "tie_topology", "model_type", "architectures", "auto_map", "custom_pipelines", "transformers_version",
    "_name_or_path", "_model_name_or_path", "keys_to_ignore_at_inference", VERSION_FIELD,
}  # fmt: skip


def normalizes_lookups(config) -> bool:
    """Whether the model's head mode looks up unit rows ŵ_i at the input (``HeadMode.normalizes_input_lookups``),
    which the export writes into the embedding (``plain_head.plain_input_weight``)."""
    return get_head_mode(config.head_mode).normalizes_input_lookups


@dataclass
class PlainExport:
    """What ``export_plain`` made: the parent-architecture model and what the card and the CLI say about it."""

    model: PreTrainedModel
    parent: str  # the parent model class
    source_type: str  # the hf_tiednorm model_type
    head: dict  # head_mode, each built-in head term's switch and extra_terms of the source (term_switches)
    tied: bool  # whether the output layer stayed tied to the input embedding
    bias_slot: str | None  # where the effective bias went (None: it is identically zero)
    added_values: int  # stored values added (negative: removed), the untied V×d matrix minus the folded terms
    max_abs_diff: float | None  # source vs export logits on random ids (None: not checked)
    tolerance: float | None = None  # the largest max_abs_diff the check accepted (None: not checked)

    def size_text(self) -> str:
        dtype = next(self.model.parameters()).dtype
        megabytes = self.added_values * dtype.itemsize / 1e6
        if not self.added_values:
            return "no size increase (the output layer stays tied)"
        return f"{self.added_values:+,} stored values ({megabytes:+.1f} MB in {str(dtype).removeprefix('torch.')})"


def _refuse_unexportable(model: PreTrainedModel) -> None:
    config = model.config
    model_type = getattr(config, "model_type", None)
    row = family_of_config(config)
    if row is None:
        raise ValueError(
            f"{type(model).__name__} (model_type {model_type!r}) is not an hf_tiednorm model: it has no normalized "
            "head to bake; it is a plain checkpoint already"
        )
    if getattr(config, "adaptive_cutoffs", None) is not None:
        raise ValueError(
            f"adaptive_cutoffs={config.adaptive_cutoffs}: an adaptive input + adaptive softmax (Baevski & Auli) has no "
            "parent architecture in transformers (Marian, BART, Llama score with one dense output layer), so it "
            "cannot be exported plain; train without adaptive_cutoffs to ship a plain checkpoint"
        )
    if not isinstance(model.get_output_embeddings(), TiedNormHead):
        raise ValueError(f"the output layer of {type(model).__name__} is not a TiedNormHead: nothing to bake")
    refusal = row.export_refusal(config) if row.export_refusal is not None else None
    if refusal:
        raise ValueError(refusal)


def _bias_reason(model: PreTrainedModel) -> str:
    """Which mode/term of ``model`` puts a per-token bias on the scores: the mode's own bias, a learned term's."""
    head = model.get_output_embeddings()
    reasons = []
    _, mode_bias = head.mode.column_terms(head.weight, head.norm_eps)
    if mode_bias is not None and mode_bias.count_nonzero():
        reasons.append(f"head_mode {head.mode.name!r} (its score {head.mode.equation}, times g)")
    rows = slice(0, head.weight.shape[0])
    for term in active_terms(head.settings):  # a learned term that shifts the scores (b, or a registered one)
        _, shift = term.fold_into(head, None, None, rows, head.weight.device)
        if shift is not None and shift.count_nonzero():
            reasons.append("logit_bias=True (the learned per-token b)" if term.name == "logit_bias" else
                           f"the registered head term {term.name!r}")  # fmt: skip
    return " and ".join(reasons) or "the model's final_logits_bias"


def _parent_config(model: PreTrainedModel, tie: bool):
    parent = family_of_config(model.config).export_parent_config(model, _DROPPED)
    parent.tie_word_embeddings = tie
    parent.architectures = None
    return parent


@torch.no_grad()
def _baked_state(model: PreTrainedModel, body, head_path: str, projection) -> tuple[dict, torch.Tensor]:
    """The parent's state dict (output rows, l2 lookups baked) and the effective per-token bias (V,) fp32."""
    head = body.get_submodule(head_path)
    rows, bias = plain_output_layer(head)  # (V, d): row i scores w_i·h·scale_i (mode, g and b folded in by the head)
    if bias is None:
        bias = torch.zeros(rows.shape[0], dtype=torch.float32, device=rows.device)
    if projection is not None:  # logits = W'·(P·h) = (W'·P)·h
        rows = rows @ projection.weight.float()
    dtype = head.weight.dtype
    learned = {f"{head_path}.{term}" for term in learned_terms()}  # folded into the rows and the bias
    state = {k: v for k, v in body.state_dict().items() if k not in learned}
    state = {k: v for k, v in state.items() if not k.startswith("output_projection.")}
    state[f"{head_path}.weight"] = rows.to(dtype)
    lookups = [
        (name, module) for name, module in body.named_modules(remove_duplicate=False)
        if isinstance(module, TiedNormEmbedding) and module is not head
    ]  # fmt: skip
    for name, module in lookups:
        if module.normalize != normalizes_lookups(model.config):
            raise ValueError(
                f"embedding {name} has normalize={module.normalize}, but head_mode={model.config.head_mode!r}: the "
                "model's lookups disagree with its head mode; reload it from its folder"
            )
        state[f"{name}.weight"] = plain_input_weight(head.mode, module.weight.detach(), module.norm_eps)
        exact_lookups = plain_input_weight(head.mode, module.weight.detach().float(), module.norm_eps)
        if module.weight is head.weight and rows_are_lookups(rows, exact_lookups):
            # The effective rows are the lookups (baseline, plain l2, an untrained lossless start: ‖w_i‖·w_i/‖w_i‖):
            # write the lookups themselves, so that the export keeps the tie and its size.
            state[f"{head_path}.weight"] = state[f"{name}.weight"]
    return state, bias


def _tied_groups_agree(target: PreTrainedModel, state: dict) -> list[tuple[str, str]]:
    """Pairs of names of one parameter of ``target`` (tied or aliased) whose values in ``state`` differ."""
    groups = defaultdict(list)
    for name, param in target.named_parameters(remove_duplicate=False):
        groups[id(param)].append(name)
    for target_name, source_name in target.get_expanded_tied_weights_keys(all_submodels=True).items():
        groups[id(target.get_parameter(source_name))].append(target_name)
    conflicts = []
    for names in groups.values():
        present = [n for n in dict.fromkeys(names) if n in state]
        conflicts += [(present[0], n) for n in present[1:] if not torch.equal(state[present[0]], state[n])]
    return conflicts


def _stored_values(model: torch.nn.Module) -> int:
    seen = {}
    for tensor in model.state_dict().values():
        seen.setdefault((tensor.data_ptr(), tensor.shape), tensor.numel())
    return sum(seen.values())


@torch.no_grad()
def _max_abs_diff(source: PreTrainedModel, target: PreTrainedModel) -> tuple[float, float]:
    """(max |target − source logits|, max |source logit|) on random ids (NaN where either is not finite)."""
    generator = torch.Generator().manual_seed(0)
    vocab = source.config.vocab_size
    inputs = {"input_ids": torch.randint(0, vocab, (2, 9), generator=generator)}
    if source.config.is_encoder_decoder:
        decoder_vocab = getattr(source.config, "decoder_vocab_size", None) or vocab
        inputs["decoder_input_ids"] = torch.randint(0, decoder_vocab, (2, 6), generator=generator)
    device = next(source.parameters()).device
    inputs = {k: v.to(device) for k, v in inputs.items()}
    expected = source(**inputs).logits.float()
    return (target(**inputs).logits.float() - expected).abs().max().item(), expected.abs().max().item()


def _parent_as_loaded(parent_class: type, config, state: dict, dtype: torch.dtype, device: torch.device):
    """The parent model holding ``state``, built the way ``from_pretrained`` builds it from the written folder: under
    ``dtype`` as the default dtype, so that buffers computed at construction keep the dtype their module gives them
    (RoPE's ``inv_freq`` stays fp32; ``model.to(dtype)`` would cast it), with the architecture's keep-in-fp32 modules
    and its ties. Built by ``from_pretrained`` itself (``state_dict=``), so the in-memory parent
    (``PlainExport.model``) and its check are what a user loading the folder gets (issue 51: a bf16 SmolLM2 export
    was refused because its in-memory parent's ``inv_freq`` was bf16)."""
    from transformers.utils import logging as hf_logging

    # from_pretrained keeps the tensors of a state dict passed in: copies, so that the export shares no storage with
    # the source model.
    state = {name: tensor.detach().clone() for name, tensor in state.items()}
    placement = {} if device.type == "cpu" else {"device_map": {"": device}}
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # "Loading weights" of an in-memory state dict says nothing to the user
    try:
        target, info = parent_class.from_pretrained(
            None, config=config, state_dict=state, dtype=dtype, output_loading_info=True, **placement
        )
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    missing, unexpected = sorted(info["missing_keys"]), sorted(info["unexpected_keys"])
    if missing or unexpected or info["mismatched_keys"]:
        raise ValueError(
            f"the baked weights do not map 1:1 onto {parent_class.__name__}: missing {missing}, unexpected "
            f"{unexpected}, shape mismatches {sorted(info['mismatched_keys'])}"
        )
    return target


def _load(folder: Path) -> PreTrainedModel:
    check_weight_files(folder)  # a truncated model.safetensors is named (transformers' error names no file)
    config = AutoConfig.from_pretrained(folder)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    return auto.from_pretrained(folder, dtype="auto").eval()


@torch.no_grad()
def export_plain(
    model_or_folder: PreTrainedModel | str | os.PathLike,
    output_dir: str | os.PathLike | None = None,
    *,
    tokenizer: str | os.PathLike | None = None,
    check: bool = True,
    write_card: bool = True,
) -> PlainExport:
    """Bake an hf_tiednorm model (any family, the wrapper, every head mode and option) into its parent architecture.

    Args:
        model_or_folder: a loaded hf_tiednorm model, or the folder it was saved in (its tokenizer is copied).
        output_dir: new or empty folder for the parent checkpoint (weights, config, generation config, tokenizer,
            README card); None keeps it in memory.
        tokenizer: a tokenizer folder to copy, when ``model_or_folder`` is a model or its folder has none.
        check: compare the two models' logits on random ids (``PlainExport.max_abs_diff``) and refuse a difference
            above ``logit_tolerance`` (the baked weights are checked to be finite either way).
        write_card: write the model card README.md into ``output_dir``.

    Returns:
        ``PlainExport``, whose ``model`` is the parent model as ``from_pretrained`` loads the written folder (eval
        mode, the source's dtype; buffers such as RoPE's ``inv_freq`` in the dtype their module computes them in).
        A model passed in keeps its training mode.
    """
    folder = None
    if isinstance(model_or_folder, PreTrainedModel):
        model = model_or_folder
    else:
        folder = Path(model_or_folder)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder} has no config.json: pass a folder written by save_pretrained")
    tokenizer_source = find_tokenizer(folder, tokenizer)
    if output_dir is not None:  # checked before the model loads: a mistake here costs nothing
        output_dir = Path(output_dir)
        check_new_folder(output_dir, "output_dir", outside=folder)
        if tokenizer_source is not None:
            check_tokenizer_files(tokenizer_source)
    if folder is not None:
        model = _load(folder)
    _refuse_unexportable(model)
    row = family_of_config(model.config)
    body, head_path, projection = row.export_parts(model)
    state, bias = _baked_state(model, body, head_path, projection)
    parent_class, slot = row.export_parent_class(body), row.export_bias_slot(body)
    if slot is not None and slot not in state:
        head_weight = state[f"{head_path}.weight"]
        state[slot] = torch.zeros(1, bias.numel(), dtype=head_weight.dtype, device=head_weight.device)
    if slot is not None:
        state[slot] = (state[slot].float() + bias[None]).to(state[slot].dtype)
    elif bias.count_nonzero():
        raise ValueError(
            f"{parent_class.__name__} has no per-token bias after its output layer, but this model's scores carry one "
            f"from {_bias_reason(model)} ({int(bias.count_nonzero())} of {bias.numel()} tokens non-zero): the "
            f"plain export would change its logits. Parents that take a bias: {BIAS_PARENTS}; a lossless-start "
            "distance model that was not trained has a zero bias and exports"
        )
    refuse_non_finite(state)

    if row.parent_shared_key is not None and row.parent_shared_key[0] not in state:
        # BART's parent always has model.shared (its input embedding); an untied encoder looks up its own copy.
        shared, lookup = row.parent_shared_key
        state[shared] = state[lookup]
    dtype, device = state[f"{head_path}.weight"].dtype, state[f"{head_path}.weight"].device
    for tie in (True, False):
        config = _parent_config(model, tie)
        with torch.device("meta"):  # only its names and ties are read: no memory, no initialization
            conflicts = _tied_groups_agree(parent_class(config), state)
        if not conflicts:
            break
    else:
        raise ValueError(f"{parent_class.__name__} holds one matrix under names whose baked values differ: {conflicts}")
    # On the source's device: the check feeds both models the same inputs (a model trained on a GPU stays there).
    target = _parent_as_loaded(parent_class, config, state, dtype, device)
    target.generation_config = copy.deepcopy(model.generation_config)
    target.eval()
    output_weight = target.get_output_embeddings().weight
    tied = any(
        isinstance(m, torch.nn.Embedding) and m.weight is output_weight for m in target.modules()
    )
    difference = tolerance = None
    if check:
        training = {module: module.training for module in model.modules()}
        try:  # compared in eval mode (no dropout); the caller's model keeps its own mode
            difference, largest = _max_abs_diff(model.eval(), target)
            tolerance = check_logits(difference, largest, dtype, lambda: differing_tensors(body, target, state))
        finally:
            for module, mode in training.items():
                module.training = mode
    settings = HeadSettings.from_config(model.config)  # the head's settings, recorded (the card shows them)
    result = PlainExport(
        model=target,
        parent=parent_class.__name__,
        source_type=model.config.model_type,
        head={"head_mode": settings.head_mode, **term_switches(settings), "extra_terms": settings.extra_terms},
        tied=tied,
        bias_slot=slot if slot is not None and state[slot].count_nonzero() else None,
        added_values=_stored_values(target) - _stored_values(model),
        max_abs_diff=difference,
        tolerance=tolerance,
    )
    if output_dir is not None:
        with staged_folder(output_dir) as partial:  # a failure leaves no half-written output_dir
            _save(result, partial, folder, tokenizer_source)
            if write_card:
                from .export_card import write_export_card

                write_export_card(partial, result, source=folder)
    return result


def _save(result: PlainExport, output_dir: Path, folder: Path | None, tokenizer_source: Path | None) -> None:
    result.model.save_pretrained(output_dir)
    config_path = output_dir / "config.json"
    config = json.loads(config_path.read_text())
    if config.pop("auto_map", None) is not None:  # never: a stock class writes none; kept as a guard
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tokenizer_source is not None:
        tokenizer = copy_tokenizer(tokenizer_source, output_dir)
        check_tokenizer_fits(tokenizer, result.model, tokenizer_source, folder or "the model passed in")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tiednorm-export",
        description="Export an hf_tiednorm model to its parent architecture (Marian, BART, Llama, or the wrapped "
        "one): the normalized head baked into a plain output layer (and final_logits_bias), loadable by stock "
        "transformers without trust_remote_code and by engines that serve the parent. The logits are the same.",
    )
    parser.add_argument("folder", help="folder of the hf_tiednorm model (save_pretrained format)")
    parser.add_argument("output_dir", help="new or empty folder for the plain checkpoint")
    parser.add_argument("--tokenizer", help="tokenizer folder, when FOLDER has none (default: FOLDER's)")
    parser.add_argument("--no-card", action="store_true", help="do not write README.md (default: write it)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    result = export_plain(args.folder, args.output_dir, tokenizer=args.tokenizer, write_card=not args.no_card)
    print(
        f"wrote {args.output_dir}: {result.parent} (from {result.source_type}, head_mode {result.head['head_mode']}); "
        f"output layer {'tied' if result.tied else 'untied'}; size: {result.size_text()}; "
        f"bias: {result.bias_slot or 'none'}; max |logit difference| on random ids: {result.max_abs_diff:.2e} "
        f"(tolerance {result.tolerance:.2e})"
    )


if __name__ == "__main__":
    main()
