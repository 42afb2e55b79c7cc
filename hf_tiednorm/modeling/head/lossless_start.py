"""The lossless start of a conversion, and the GGUF loader's stale quantization state (used by convert.py).

A pretrained model's hidden states are calibrated to raw dot products w_i·h, whose row norms carry the token prior;
a normalized head deletes them, so a plain conversion starts from a broken function (SmolLM2-135M on Multi30k: 8.7×
the source's perplexity in cosine mode, docs/converting.md). The lossless start keeps the head normalized but
starts the per-token terms that multiply or shift its scores where they give back the source's logits exactly, so
fine-tuning moves from the source's own function. Each mode declares its start (``HeadMode.lossless_start`` and
``lossless_terms``, head/modes.py); the built-in ones:

=========== ======================================================== =============================================
head_mode   lossless start                                           exact because
=========== ======================================================== =============================================
baseline    nothing to set                                           s_i = w_i·h already
cosine      ``logit_scale_kind="vector"``, g_i = ‖w_i‖                    g_i·w_i·h/‖w_i‖ = w_i·h
square      ``logit_scale_kind="vector"``, g_i = ‖w_i‖²                   g_i·w_i·h/‖w_i‖² = w_i·h
distance    ``logit_bias=True``, b_i = ½‖w_i‖²                       w_i·h − ½‖w_i‖² + b_i = w_i·h
l2          refused                                                  the input lookups become ŵ_i too, so every
                                                                     layer sees other inputs; no head term undoes it
=========== ======================================================== =============================================

Dead rows (‖w_i‖ ≤ ``norm_eps``, head/layer.py) score 0 in cosine/square: exact for an all-zero row (the
source scores 0 too), within ``norm_eps``·‖h‖ for a row in (0, norm_eps]. The learned terms are fp32 parameters;
a source in bf16/fp16 starts within that dtype's rounding rather than bit-exactly. The start is recorded in the config
(``lossless_start=True``), and tokens that ``resize_token_embeddings`` adds later start by the same map from their
initial rows (``start_resized_tokens``), so they take the probability mass they take in the source's same resize
(at g = 1, ten new tokens of a tiny Llama would take 33 % (cosine) or 72 % (square) of the probability mass
where the source's same resize gives them 14 %).

GGUF files load as transformers loads them (``gguf_file=``, dequantized by the ``gguf`` package: ``python -m pip
install -e ".[gguf]"``); the converted model must carry no quantization state (the dequantized weights are plain
tensors), so that it saves and fine-tunes like any other. Models still quantized (bitsandbytes, GPTQ, ...) are
refused.
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from .mode_checks import LOSSLESS_RTOL, MODE_LOSSLESS_TERMS
from .settings import HEAD_TERMS, HeadSettings, head_terms


def check_lossless_settings(config) -> None:
    """``ValueError`` unless ``config``'s head terms are switched as a lossless start of its ``head_mode`` needs
    (``HeadSettings.with_lossless_start``: its ``HeadMode.lossless_start``; see the module docstring's table), naming
    the switches (each term's first config field) and their needed values."""
    switches = tuple(HeadSettings().term_switches())
    settings = HeadSettings(head_mode=config.head_mode, **{name: getattr(config, name) for name in switches})
    needed = settings.with_lossless_start()  # raises for l2
    want, have = (tuple(o.term_switches().values()) for o in (needed, settings))
    if want != have:
        raise ValueError(
            f"lossless_start=True with head_mode={config.head_mode!r} needs ({', '.join(switches)}) = {want}, got "
            f"{have}; set them so, or lossless_start=False"
        )


@torch.no_grad()
def start_lossless(model: PreTrainedModel) -> None:
    """Set the converted ``model``'s per-token logit scale / bias so that it computes its source's logits (in place).

    ``model``'s head holds the source's embedding matrix W (V, d) unchanged and was built with the settings of
    ``HeadSettings.with_lossless_start``; the values are its mode's ``lossless_terms`` (cosine g_i = ‖w_i‖, square
    g_i = ‖w_i‖², distance b_i = ½‖w_i‖², fp32).
    """
    head = model.get_output_embeddings()
    _set_lossless_terms(head, 0)
    check_extra_terms_neutral(head)
    model.config.lossless_start = True


def check_extra_terms_neutral(head) -> None:
    """``ValueError`` naming the registered head settings (``extra_terms``) when, at their ``init``, they change the
    scores of a lossless-started ``head``: its effective column terms (mode, g, b and every option folded in) must be
    the plain scores', scale_i = 1 and bias_i = 0 on every live row, within the tolerance of the mode's own check
    (``head_mode_checks.check_lossless``). A lossless start sets g and b only; a term whose init is not neutral
    (e.g. a temperature starting at 2) would leave the logits off the source's while the config said lossless."""
    names = head.settings.extra_terms
    if not names or head.weight.is_meta:
        return
    scale, bias = head.column_terms()
    norms = torch.linalg.vector_norm(head.weight.float(), dim=-1)
    gain = torch.ones_like(norms) if scale is None else scale
    offset = torch.zeros_like(norms) if bias is None else bias
    _, mode_bias = head.mode.column_terms(head.weight, head.norm_eps)
    learned_bias = 0 if mode_bias is None else mode_bias.abs()  # what a lossless start's bias cancels
    error = (gain - 1).abs() * norms + offset.abs()  # the most a logit is off, for a unit-norm h
    excess = (error - LOSSLESS_RTOL * (norms + learned_bias) - head.norm_eps).nan_to_num(nan=torch.inf)
    row = int(excess.argmax())
    if bool(excess[row] > 0):  # host syncs at conversion time only
        inits = ", ".join(f"{name} init={HEAD_TERMS[name].init}" for name in names)
        raise ValueError(
            f"lossless_start cannot give back the source's logits with the registered head term(s) {list(names)} "
            f"({inits}): folded in at their init they change the scores (at row {row}, scale {float(gain[row]):.6g} "
            f"and bias {float(offset[row]):.6g} where the plain score needs 1 and 0; a logit off by up to "
            f"{float(error[row]):.4g}). A lossless start sets the logit scale and bias only: register the option "
            "with an init at which its fold changes nothing, or convert without lossless_start"
        )


def _set_lossless_terms(head, first: int) -> None:
    """Set every learned term of ``head`` that a lossless start sets (``HeadTerm.lossless_value``: the built-ins
    from their mode's ``lossless_terms``, a registered one to its ``lossless`` value) for tokens ``first`` and up."""
    rows = head.weight[first:]
    mode_terms = dict(zip(MODE_LOSSLESS_TERMS, head.mode.lossless_terms(rows, head.norm_eps), strict=True))
    for term in head.settings.active_terms():
        value = term.lossless_value(head, rows, mode_terms)  # (new,) or None: the term is left as it is
        if value is not None:
            getattr(head, term.name)[first:].copy_(value)  # copy_: from any device, as a load does


@torch.no_grad()
def start_resized_tokens(model: PreTrainedModel, first_new: int) -> None:
    """After ``resize_token_embeddings`` of a lossless-started ``model`` (``config.lossless_start``), start the new
    tokens' g_i / b_i (ids ``first_new`` and up) by their mode's lossless map from their initial rows, in place; a
    model without a lossless start keeps the head's own rule (g = ``logit_scale_init``, b = 0)."""
    head = model.get_output_embeddings()
    if not getattr(model.config, "lossless_start", False) or head.weight.shape[0] <= first_new:
        return
    _set_lossless_terms(head, first_new)


@torch.no_grad()
def take_row_scales(model: PreTrainedModel, row_scales: torch.Tensor) -> None:
    """After the lossless start of a source whose output rows were c_i·w_i: g_i·(score) + b_i = w_i·h becomes
    c_i·g_i·(score) + c_i·b_i = c_i·(w_i·h), the source's logit (in place)."""
    head = model.get_output_embeddings()
    for term in head_terms():  # those that scale or shift the whole logit (g, b): c_i times each
        learned = getattr(head, term.name, None)
        if term.row_scaled and learned is not None:
            learned.mul_(row_scales.to(learned))


__all__ = ["check_extra_terms_neutral", "check_lossless_settings", "start_lossless", "start_resized_tokens",
           "take_row_scales"]
