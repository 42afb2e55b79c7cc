"""The lossless start of a conversion (used by convert.py): the head's settings it needs, and its terms' values.

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

Dead rows (‖w_i‖ ≤ ``norm_eps``, head/layer.py) score 0 in cosine/square: exact for an all-zero row (the source scores 0
too), within ``norm_eps``·‖h‖ for a row in (0, norm_eps]. The learned terms are fp32 parameters; a source in bf16/fp16
starts within that dtype's rounding rather than bit-exactly. The start is recorded in the config
(``lossless_start=True``), and tokens that ``resize_token_embeddings`` adds later start by the same map from their
initial rows (the model's ``resize_token_embeddings``: head/terms.py, ``start_lossless_rows``), so they take the
probability mass they take in the source's same resize (at g = 1, ten new tokens of a tiny Llama would take 33 %
(cosine) or 72 % (square) of the probability mass where the source's same resize gives them 14 %).

GGUF files load as transformers loads them (``gguf_file=``, dequantized by the ``gguf`` package: ``python -m pip
install -e ".[gguf]"``); the converted model must carry no quantization state (the dequantized weights are plain
tensors), so that it saves and fine-tunes like any other. Models still quantized (bitsandbytes, GPTQ, ...) are
refused.
"""

from __future__ import annotations

import dataclasses

import torch
from transformers import PreTrainedModel

from ..modeling.head.modes import get_head_mode
from ..modeling.head.settings import HEAD_TERMS, HeadSettings
from ..modeling.head.terms import head_terms, start_lossless_rows
from ..registration.mode_checks import LOSSLESS_RTOL, check_lossless


def _logit_scale_settings(settings: HeadSettings, mode) -> dict:
    """The logit scale a lossless start of ``mode`` needs: per token (``vector``) where it sets g, else none."""
    kind = settings.logit_scale_kind
    if "logit_scale" in mode.lossless_start:
        if kind not in ("none", "vector"):
            raise ValueError(
                f"lossless_start for head_mode {settings.head_mode!r} sets a per-token logit scale "
                f"(logit_scale_kind='vector'); logit_scale_kind={kind!r} cannot give back the source's "
                "logits: leave logit_scale_kind unset or 'vector'"
            )
        if settings.logit_scale_init is not None:
            # The start sets every g_i (and a resize's new tokens) from the rows: an explicit initial g would be
            # dropped while config.json recorded it.
            raise ValueError(
                f"logit_scale_init={settings.logit_scale_init} (--logit-scale-init) cannot be combined with "
                f"lossless_start (--lossless-start): for head_mode {settings.head_mode!r} the lossless start sets "
                "every per-token logit scale g_i itself, to the value that gives back the source's logits "
                f"({mode.equation}), so logit_scale_init would be ignored; leave it unset, or convert without "
                "lossless_start"
            )
        return {"logit_scale_kind": "vector"}
    if kind != "none":
        raise ValueError(
            f"lossless_start for head_mode {settings.head_mode!r} needs no logit scale ({mode.equation}; its start "
            f"sets {' and '.join(mode.lossless_start) or 'nothing'}); logit_scale_kind={kind!r} would "
            "multiply the scores: leave logit_scale_kind='none'"
        )
    return {}


# The settings each built-in term needs for a lossless start of a mode (an added term keeps its own: extra_terms).
_LOSSLESS_SETTINGS = {
    "logit_scale": _logit_scale_settings,
    "logit_bias": lambda settings, mode: {"logit_bias": settings.logit_bias or "logit_bias" in mode.lossless_start},
}


def with_lossless_start(settings: HeadSettings) -> HeadSettings:
    """The settings a lossless start of ``settings.head_mode`` needs (its ``HeadMode.lossless_start`` terms switched
    on), or ``ValueError`` naming the setting that makes it impossible."""
    mode = get_head_mode(settings.head_mode)
    if mode.lossless_start is None:
        raise ValueError(mode.lossless_refusal)
    changes = {}
    for needed in _LOSSLESS_SETTINGS.values():
        changes.update(needed(settings, mode))
    return dataclasses.replace(settings, **changes)


def term_switches(settings: HeadSettings) -> dict:
    """Each built-in term's switch (its first config field) and its value: {"logit_scale_kind": ..., ...}."""
    return {term.config_fields[0]: getattr(settings, term.config_fields[0]) for term in head_terms()
            if term.config_fields}  # fmt: skip


def takes_row_scales(mode) -> bool:
    """Whether ``mode``'s lossless start sets a term that can absorb a source's output row scales c_i (a per-token
    scale of the logit, ``HeadTerm.takes_row_scales``): an untied source with rows c_i·w_i converts losslessly."""
    return any(HEAD_TERMS[name].takes_row_scales for name in mode.lossless_start or () if name in HEAD_TERMS)


@torch.no_grad()
def start_lossless(model: PreTrainedModel) -> None:
    """Set the converted ``model``'s per-token logit scale / bias so that it computes its source's logits (in place).

    ``model``'s head holds the source's embedding matrix W (V, d) unchanged and was built with the settings of
    ``with_lossless_start``; the values are its mode's ``lossless_terms`` (cosine g_i = ‖w_i‖, square
    g_i = ‖w_i‖², distance b_i = ½‖w_i‖², fp32).
    """
    head = model.get_output_embeddings()
    check_lossless(head.mode, head.weight, head.norm_eps, *head.mode.lossless_terms(head.weight, head.norm_eps))
    start_lossless_rows(head, 0)
    check_extra_terms_neutral(head)
    model.config.lossless_start = True


def check_extra_terms_neutral(head) -> None:
    """``ValueError`` naming the registered head settings (``extra_terms``) when, at their ``init``, they change the
    scores of a lossless-started ``head``: its effective column terms (mode, g, b and every option folded in) must be
    the plain scores', scale_i = 1 and bias_i = 0 on every live row, within the tolerance of the mode's own check
    (``registration/mode_checks.check_lossless``). A lossless start sets g and b only; a term whose init is not neutral
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
            f"{float(error[row]):.4g}). A lossless start sets the logit scale and bias only: register the term "
            "with an init at which its fold changes nothing, or convert without lossless_start"
        )


@torch.no_grad()
def take_row_scales(model: PreTrainedModel, row_scales: torch.Tensor) -> None:
    """After the lossless start of a source whose output rows were c_i·w_i: g_i·(score) + b_i = w_i·h becomes
    c_i·g_i·(score) + c_i·b_i = c_i·(w_i·h), the source's logit (in place)."""
    head = model.get_output_embeddings()
    for term in head_terms():  # those that scale or shift the whole logit (g, b): c_i times each
        learned = getattr(head, term.name, None)
        if term.row_scaled and learned is not None:
            learned.mul_(row_scales.to(learned))


__all__ = ["check_extra_terms_neutral", "start_lossless", "take_row_scales", "takes_row_scales", "term_switches",
           "with_lossless_start"]
