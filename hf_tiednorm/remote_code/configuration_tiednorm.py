# configuration_tiednorm.py: GENERATED from the hf_tiednorm package by utils/generate_remote_code.py. Do not edit it.
# Regenerate with `python utils/generate_remote_code.py` (CI fails when it is stale: --check).
#
# The remote code of a saved hf_tiednorm model (what `from_pretrained(..., trust_remote_code=True)` runs):
# 12 package modules, in dependency order, each under a rule naming its file.
# ruff: noqa: E402, E501, I001

import dataclasses
import functools
import gc
import importlib.metadata
import keyword
import math
import os
import shutil
import sys
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import InitVar, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, get_args

import torch
from huggingface_hub.dataclasses import as_validated_field, strict
from huggingface_hub.errors import StrictDataclassError
from torch import nn
from transformers import AutoConfig, BartConfig, LlamaConfig, MarianConfig, PreTrainedConfig, PreTrainedModel
from transformers.utils import logging
from transformers.utils.type_validators import interval, positive_int_field


# ------------------------------ hf_tiednorm/modeling/head/folded_weight.py --------------------------------------
"""The two O(V·d) computations of the head on its weight W, as autograd ops that read W in its own dtype, accumulate
in fp32 a block of rows at a time and keep only W (and a (V,) vector) for their backward: the row norms ‖w_i‖² that
every normalized mode's (scale, bias) is made of, and the scale folded into the weight, ``W_s = diag(scale)·W``.

Every head mode scores ``s = (W·h) * scale + bias`` (``head/modes.py``), so ``s = W_s·h + bias`` with the folded
weight W_s: any linear cross-entropy that takes a weight and a bias (liger-kernel's fused one, torch's
``F.linear_cross_entropy``, the chunked loop of ``loss/chunked.py``, a plain ``F.linear``) scores every mode.

W_s is built in W's dtype, each product computed in fp32 and rounded once (a scale can reach 1/eps, a scaled row
cannot), a block of rows at a time: a bf16 W never gets a whole fp32 copy (V·d·4 bytes, 1 GiB at V = 128k,
d = 2048). Autograd would save W_s (or an fp32 W) for the backward of ``W * scale``; this op saves W and the (V,)
scale only and computes both gradients from them:
``grad_W = scale * grad_Ws`` and ``grad_scale_j = w_j · grad_Ws_j`` (fp32 dot products).

The row norms are the same story: ``torch.linalg.vector_norm(W, dtype=torch.float32)`` of a bf16 W casts the whole
matrix to fp32 on the CPU, and its backward builds ``W * (grad / norm)`` as further fp32 (V, d) tensors (8 of them
per step with the fold, issue 49), where the baseline head makes none. ``SquaredRowNorms`` computes ‖w_i‖² with an fp32
accumulation a block at a time, saves W only, and returns ``grad_W = 2·grad_i·w_i`` in W's dtype, each product in
fp32 and rounded once: the bf16 gradient autograd's fp32 path rounded to as well.
"""


# Rows per block of the fp32 products: 2**22 elements (16 MiB of fp32) at most, whatever V·d is, and at most 1/8 of
# the rows, so that no fp32 temporary is ever as large as W itself (a small W is 8 blocks: 8 short kernels).
_BLOCK_ELEMENTS = 1 << 22
_MIN_BLOCKS = 8


def _row_blocks(rows: "int", width: "int") -> "tuple[range, int]":
    """The first row of each block of rows, and the block's height."""
    step = max(1, min(_BLOCK_ELEMENTS // max(1, width), -(-rows // _MIN_BLOCKS)))
    return range(0, rows, step), step


def _scaled_rows(weight: "torch.Tensor", scale: "torch.Tensor") -> "torch.Tensor":
    """diag(scale)·weight in weight's dtype, each product in (at least) fp32 and rounded once.

    One mixed-dtype multiply per block into the bf16/fp16 result: on CUDA the kernel reads W in its dtype and
    computes in fp32 with no fp32 tensor at all; on the CPU its fp32 temporaries are one block's."""
    compute = torch.promote_types(weight.dtype, torch.float32)
    if weight.dtype == compute:
        return weight * scale.to(compute).unsqueeze(-1)
    out = torch.empty_like(weight)
    starts, step = _row_blocks(*weight.shape)
    for start in starts:
        block = slice(start, start + step)
        torch.mul(weight[block], scale[block].to(compute).unsqueeze(-1), out=out[block])
    return out


def _row_dots(a: "torch.Tensor", b: "torch.Tensor", dtype: "torch.dtype") -> "torch.Tensor":
    """(V,) dot products of the rows of a and b, in ``dtype`` (fp32 at least), a block of rows at a time (a whole
    ``vecdot`` would build the (V, d) product, in fp32 for fp32 rows)."""
    out = torch.empty(a.shape[0], dtype=dtype, device=a.device)
    starts, step = _row_blocks(*a.shape)
    for start in starts:
        block = slice(start, start + step)
        out[block] = torch.linalg.vecdot(a[block].to(dtype), b[block].to(dtype))
    return out


class SquaredRowNorms(torch.autograd.Function):
    """‖w_i‖² of every row of W (V, d), as a (V,) vector in fp32 (fp64 for an fp64 W); saves W only."""

    @staticmethod
    def forward(ctx, weight: "torch.Tensor") -> "torch.Tensor":
        ctx.save_for_backward(weight)
        # vector_norm with an fp32 dtype reads W in its dtype and accumulates in fp32 (on the CPU, one block's copy).
        compute = torch.promote_types(weight.dtype, torch.float32)
        out = torch.empty(weight.shape[0], dtype=compute, device=weight.device)
        starts, step = _row_blocks(*weight.shape)
        for start in starts:
            block = slice(start, start + step)
            out[block] = torch.linalg.vector_norm(weight[block], dim=-1, dtype=compute)
        return out.square()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_norms: "torch.Tensor") -> "torch.Tensor":
        (weight,) = ctx.saved_tensors
        return _scaled_rows(weight, 2 * grad_norms)  # d‖w_i‖²/dw_i = 2·w_i, in W's dtype


def squared_row_norms(weight: "torch.Tensor") -> "torch.Tensor":
    """‖w_i‖² of every row of ``weight`` (V, d) (or (..., d)): shape (V,) (or (...,)), fp32 (fp64 for fp64 rows), with
    no fp32 copy of a bf16/fp16 W in the forward or the backward."""
    if weight.dim() != 2:  # looked-up rows (tokens, ..., d): O(tokens·d), nothing to save
        return torch.linalg.vector_norm(weight, dim=-1, dtype=torch.promote_types(weight.dtype, torch.float32)).square()
    return SquaredRowNorms.apply(weight)


class FoldScale(torch.autograd.Function):
    """``W_s = diag(scale)·W`` (V, d) in W's dtype; saves W and scale, not W_s."""

    @staticmethod
    def forward(ctx, weight: "torch.Tensor", scale: "torch.Tensor") -> "torch.Tensor":
        ctx.save_for_backward(weight, scale)
        return _scaled_rows(weight, scale)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_folded: "torch.Tensor"):
        weight, scale = ctx.saved_tensors
        grad_weight = grad_scale = None
        if ctx.needs_input_grad[0]:
            grad_weight = _scaled_rows(grad_folded, scale).to(weight.dtype)
        if ctx.needs_input_grad[1]:
            compute = torch.promote_types(torch.promote_types(weight.dtype, scale.dtype), torch.float32)
            grad_scale = _row_dots(grad_folded, weight, compute).to(scale.dtype)
        return grad_weight, grad_scale


def fold_scale(weight: "torch.Tensor", scale: "torch.Tensor | None") -> "torch.Tensor":
    """``diag(scale)·weight`` (V, d) in weight's dtype; ``weight`` itself when ``scale`` is None. ``scale``: (V,)."""
    if scale is None:
        return weight
    if scale.shape != weight.shape[:1]:
        raise ValueError(f"the head's scale has shape {tuple(scale.shape)}, its weight {tuple(weight.shape)}: "
                         "a mode's column_terms must return one scale per row (V,)")
    return FoldScale.apply(weight, scale)


# ------------------------------ hf_tiednorm/modeling/head/mode_checks.py ----------------------------------------
"""What a head mode returns is checked, not trusted (head/modes.py wraps every mode's ``column_terms`` and
``lossless_terms`` with these checks, and ``register_head_mode`` runs them on a probe):

* **the terms** (``check_terms``): each of scale, bias, g and b is None or a floating tensor on the weight's device,
  of shape (n,) for the n rows asked about or 0-dim (one value for every row, expanded to (n,)); they come back as
  fp32. Anything else (a Python float, a (n, 1) or (d,) tensor, an integer tensor, a tensor on another device) is a
  ``TypeError``/``ValueError`` naming the mode and the term, at every call rather than only where a batch happens to
  take the code path that trips over it;
* **the lossless start** (``check_lossless``): ``lossless_terms`` must give back the plain scores w_i·h for every
  h, i.e. per row g_i·scale_i = 1 and g_i·bias_i + b_i = 0 (a dead row, ‖w_i‖ ≤ eps, may score 0). It is verified on
  the weight being converted, with a stated tolerance (``LOSSLESS_RTOL`` of the row's score scale, plus eps), and
  on a small random probe when the mode is registered: a start that cannot undo the mode's bias (or its scale) is
  refused by the mode's name instead of converting "lossless" with other logits.

This file imports torch only: it travels with the modeling code as remote code (head/modes.py imports it).
"""


ColumnTerms = tuple["torch.Tensor | None", "torch.Tensor | None"]

# A lossless start may be off by this fraction of a row's score scale (‖w_i‖ + |g_i·bias_i| + |b_i|), plus eps: fp32
# rounding of g_i·scale_i is ~1e-7, a bias the start forgets is of the order of the bias itself.
LOSSLESS_RTOL = 1e-5
COLUMN_TERM_NAMES = ("scale", "bias")
# The learned head terms a mode's lossless start sets, in the order of its ``lossless_terms`` (the scale g, then the
# bias b): the built-in terms of head/terms.py, which take their lossless values from these.
MODE_LOSSLESS_TERMS: "tuple[str, ...]" = ("logit_scale", "logit_bias")
LOSSLESS_TERM_NAMES = tuple(f"{name} {symbol}" for name, symbol in zip(MODE_LOSSLESS_TERMS, "gb", strict=True))


def check_terms(mode_name: "str", method: "str", terms, weight: "torch.Tensor", names=COLUMN_TERM_NAMES) -> "ColumnTerms":
    """``terms`` (what ``method`` of mode ``mode_name`` returned for ``weight`` (n, d)) as two fp32 (n,) tensors or
    None; ``TypeError``/``ValueError`` naming the mode and the term for anything else (module docstring)."""
    where = f"head mode {mode_name!r}: {method} returned"
    if not isinstance(terms, (tuple, list)) or len(terms) != 2:
        raise TypeError(f"{where} {type(terms).__name__} {terms!r:.80}; it must return a pair ({', '.join(names)})")
    rows = weight.shape[0]
    checked = []
    for name, term in zip(names, terms):
        if term is None:
            checked.append(None)
            continue
        if not isinstance(term, torch.Tensor):
            raise TypeError(
                f"{where} a {type(term).__name__} as its {name} ({term!r:.40}); it must be a tensor on the weight's "
                f"device ({weight.device}), of shape ({rows},) or 0-dim, or None (e.g. weight.new_full((rows,), "
                "value, dtype=torch.float32))"
            )
        if not term.is_floating_point():
            raise ValueError(f"{where} a {term.dtype} {name}; it must be a floating-point tensor")
        if term.device != weight.device:
            raise ValueError(
                f"{where} its {name} on {term.device}, the weight is on {weight.device}; create the term on the "
                "weight's device (e.g. from the weight itself, or with device=weight.device)"
            )
        if term.dim() == 0:
            term = term.expand(rows)
        elif tuple(term.shape) != (rows,):
            raise ValueError(
                f"{where} a {name} of shape {tuple(term.shape)} for a weight of shape {tuple(weight.shape)}; it "
                f"must have shape ({rows},) (one value per row, i.e. per token) or be 0-dim (one for every row)"
            )
        checked.append(term.float())
    return checked[0], checked[1]


def check_lossless(mode, weight: "torch.Tensor", eps: "float", g, b) -> "None":
    """``ValueError`` naming ``mode`` and the worst row when the logit scale ``g`` and bias ``b`` (fp32 (n,) or None:
    the head's g = 1, b = 0) do not turn the mode's scores on ``weight`` back into the plain w_i·h for every h:
    g_i·(w_i·h·scale_i + bias_i) + b_i − w_i·h = (g_i·scale_i − 1)·w_i·h + (g_i·bias_i + b_i), at most
    |g_i·scale_i − 1|·‖w_i‖ + |g_i·bias_i + b_i| for a unit h. Allowed: ``LOSSLESS_RTOL``·(‖w_i‖ + |g_i·bias_i| +
    |b_i|) + eps (a dead row scores 0: off by ‖w_i‖ ≤ eps). Skipped for a weight without values (meta device)."""
    if weight.is_meta or weight.shape[0] == 0:
        return
    scale, bias = mode.column_terms(weight, eps)
    norms = torch.linalg.vector_norm(weight.float(), dim=-1)
    g = torch.ones_like(norms) if g is None else g
    gain = g if scale is None else g * scale  # must be 1
    shift = torch.zeros_like(norms) if bias is None else g * bias
    offset = shift if b is None else shift + b  # must be 0
    scale_error, bias_error = (gain - 1).abs() * norms, offset.abs()
    allowed = LOSSLESS_RTOL * (norms + shift.abs() + (0 if b is None else b.abs())) + eps
    excess = (scale_error + bias_error - allowed).nan_to_num(nan=torch.inf)  # NaN/inf: not lossless
    worst = excess.argmax()
    if bool(excess[worst] > 0):  # one host sync, at conversion time only (never in a training step)
        row = int(worst)
        raise ValueError(
            f"head mode {mode.name!r} declares lossless_start={mode.lossless_start!r}, but its lossless_terms do not "
            f"give back the plain scores w_i·h: at row {row} of {weight.shape[0]}, g_i·scale_i = {float(gain[row]):.6g}"
            f" (must be 1) and g_i·bias_i + b_i = {float(offset[row]):.6g} (must be 0), so a logit would be off by up "
            f"to {float(scale_error[row] + bias_error[row]):.4g} for a unit-norm h (allowed: {float(allowed[row]):.3g},"
            f" {LOSSLESS_RTOL:g} of the row's score scale + eps). A lossless start needs g_i = 1/scale_i and "
            "b_i = −g_i·bias_i: add 'logit_bias' to lossless_start when the mode's score has a bias term, or override "
            "lossless_terms"
        )


def checked_column_terms(method: "Callable") -> "Callable":
    """``method`` (a ``column_terms``) with its result checked by ``check_terms``."""
    if getattr(method, "_checked_terms", False):
        return method

    @functools.wraps(method)
    def column_terms(self, weight, eps, *args, **kwargs):
        return check_terms(self.name, "column_terms", method(self, weight, eps, *args, **kwargs), weight)

    column_terms._checked_terms = True
    return column_terms


def checked_lossless_terms(method: "Callable") -> "Callable":
    """``method`` (a ``lossless_terms``) with its result checked: terms (``check_terms``), only the terms the mode's
    ``lossless_start`` declares, and lossless on the weight (``check_lossless``)."""
    if getattr(method, "_checked_terms", False):
        return method

    @functools.wraps(method)
    def lossless_terms(self, weight, eps, *args, **kwargs):
        g, b = check_terms(
            self.name, "lossless_terms", method(self, weight, eps, *args, **kwargs), weight, LOSSLESS_TERM_NAMES
        )
        declared = self.lossless_start or ()
        for term, value in zip(MODE_LOSSLESS_TERMS, (g, b), strict=True):
            if value is not None and term not in declared:
                raise ValueError(
                    f"head mode {self.name!r}: lossless_terms returned a {term} but lossless_start={declared!r} does "
                    f"not declare {term!r}, so the converted head would have no {term} to hold it; declare it or "
                    "return None"
                )
        check_lossless(self, weight, eps, g, b)
        return g, b

    lossless_terms._checked_terms = True
    return lossless_terms


def probe_head_mode(mode) -> "None":
    """Run ``mode``'s column terms, and its lossless start if it declares one, on a small random weight (7 rows,
    one of them dead, on the CPU): a term of the wrong type, shape, dtype or device, or a lossless start that does not
    give back the plain scores, is refused by the mode's name when it is registered, not when a model uses it."""
    generator = torch.Generator().manual_seed(0)  # on the CPU, also inside a torch.device("meta") block
    weight = torch.randn(7, 5, generator=generator, device="cpu") * torch.linspace(0.2, 3.0, 7, device="cpu")[:, None]
    weight[0] = 0  # a dead row, as HF's zeroed padding row
    eps = 1e-6
    try:
        mode.column_terms(weight, eps)
        if mode.lossless_start is not None:
            mode.lossless_terms(weight, eps)
    except (TypeError, ValueError) as error:
        raise type(error)(
            f"register_head_mode refuses it, on a random {tuple(weight.shape)} probe weight: {error}"
        ) from None


# ------------------------------ hf_tiednorm/modeling/head/modes.py ----------------------------------------------
"""The head modes: one small object per mode, holding everything that mode *is*, and the registry that holds them.

With weight tying (Press & Wolf, 2017) the output layer reuses the input embedding matrix W (rows w_i) and scores
token i as s_i = w_i·h. Liu, Zhai & Chen ("Normalization of Input-output Shared Embeddings in Text Generation
Models", 2020) show that this score is biased by the row norm ‖w_i‖ and propose the normalized modes below. Every
mode is an affine map of the plain scores W·h along the vocabulary axis, ``s = (W·h) * scale + bias`` with
vocabulary-sized vectors derived from the rows (``HeadMode.column_terms``): one matmul plus O(V) work per decoding
step, a chunked loss that reuses the vectors, and no normalized copy of W.

A mode object answers every question the rest of the package asks about a mode, so that no other module compares
a mode's name:

* ``column_terms(weight, eps)``: the (scale, bias) of its score;
* ``normalizes_input_lookups``: whether the input embedding looks up unit rows ŵ_i too (l2), which changes every
  layer's input (no lossless start, no weight-norm technique, and a plain export ships the unit rows at the input);
* ``keeps_row_norms``: whether row norms still mean something anywhere in the model (the weight-norm
  initialization and regularization act on them);
* ``equation``, ``paper``, ``summary``: the text of the config help, the CLI help, the model card and the docs;
* ``lossless_start`` / ``lossless_terms(weight, eps)``: which learned per-token terms (``"logit_scale"``,
  ``"logit_bias"``) give back a source's plain logits exactly when a tied checkpoint is converted, and their values;
  ``None`` where no such start exists (``lossless_refusal`` says why);
* ``plain_input_weight(weight, eps)``: what a plain ``nn.Embedding`` must hold to look up what this mode looks up;
  with the head's effective column terms (``TiedNormHead.column_terms()``, the logit scale g and bias b folded in)
  that is all a plain export needs: output weight ``diag(scale)·W``, output bias ``bias``.

``register_head_mode`` adds a mode (a test, a user's own variant). The registry lives in the model layer and travels
with a saved model as remote code: a folder whose config names a mode that its code files do not define is refused
by name when it is loaded (``get_head_mode``). A saved config records the mode's *name* only, so a name must mean one
mode everywhere: the built-in names (``BUILTIN_HEAD_MODES``) can be neither redefined nor unregistered (a model
trained with a redefined ``cosine`` reloaded in a fresh process as the built-in one, its logits 7.9 off, no error).
For the same reason a name that a live model scores with is not given another definition in its process: every head
is recorded, by weak reference, as it is built (``hold_head_mode``), and ``register_head_mode`` refuses a definition
other than the one a live head holds (issue 58: ``replace=True`` while a model built with ``"m"`` lived left that
model on the old definition while its saved folder reloaded in the same process with the new one, logits × 0.5, no
warning). Once the model is gone (``del model``) the name may be redefined; a model keeps its mode through a
``copy.deepcopy`` (TRL's reference model), since a mode copies as itself.

What a mode returns is checked, not trusted, wherever it is called: ``HeadMode`` wraps every ``column_terms`` and
``lossless_terms`` a subclass defines with the checks of ``head/mode_checks.py`` (the terms' type, shape, dtype and
device; a declared lossless start verified on the weights), and ``register_head_mode`` runs them on a small probe.
"""


LIU_ET_AL = "Liu, Zhai & Chen (2020)"


def inverse_row_norms(weight: "torch.Tensor", eps: "float", power: "float" = 1) -> "torch.Tensor":
    """1/‖w_i‖^power of every row of ``weight`` (..., d), in fp32, shape (...,); 0 for a dead row (‖w_i‖ ≤ eps).

    The 0 instead of 1/eps makes a dead row (the zero padding row) score 0 and receive no gradient through its
    norm: the direction of a zero vector is undefined and its gradient grows as 1/‖w‖, so a floored norm made the
    padding row's gradient dominate the whole model's.
    """
    # From ‖w_i‖² directly (no sqrt, whose gradient is infinite at a zero row): (‖w‖²)^(-power/2), floored at eps².
    squared = squared_row_norms(weight).float()
    inverse = squared.clamp_min(eps * eps).pow(-0.5 * power)
    return torch.where(squared > eps * eps, inverse, torch.zeros_like(inverse))


def unit_rows(rows: "torch.Tensor", eps: "float") -> "torch.Tensor":
    """ŵ = w/‖w‖ for each row of ``rows`` (..., d), in the dtype of ``rows``; 0 for a dead row.

    Scaled in fp32 so that fp16 rows cannot overflow on the way.
    """
    return (rows.float() * inverse_row_norms(rows, eps).unsqueeze(-1)).to(rows.dtype)


class HeadMode:
    """One scoring mode of the tied output head. Subclass it (or build one with ``column_terms`` overridden) and
    ``register_head_mode`` the instance.

    Attributes:
        name: the value of ``config.head_mode``.
        equation: the score s_i in words, e.g. ``"s_i = w_i·h / ‖w_i‖"``.
        paper: where it comes from, e.g. ``"Liu, Zhai & Chen (2020), eq. 27"``.
        summary: a short description for the help texts (default: the equation).
        normalizes_input_lookups: the input embedding looks up ŵ_i instead of w_i.
        keeps_row_norms: the row norms still act somewhere (False when both sides normalize them away).
        lossless_start: the learned terms a lossless start sets (``("logit_scale",)``, ``("logit_bias",)``, ``()``
            when the scores are the source's already); None: no lossless start (see ``lossless_refusal``).
        lossless_refusal: why there is no lossless start, for the error message.
        cites_liu_et_al: the model card cites Liu, Zhai & Chen.
    """

    name: "str" = ""
    equation: "str" = ""
    paper: "str" = ""
    summary: "str" = ""
    normalizes_input_lookups: "bool" = False
    keeps_row_norms: "bool" = True
    lossless_start: "tuple[str, ...] | None" = None
    lossless_refusal: "str" = "this mode declares no lossless start"
    cites_liu_et_al: "bool" = True

    def __init_subclass__(cls, **kwargs) -> "None":
        # Every column_terms / lossless_terms a mode defines returns checked terms (module docstring).
        super().__init_subclass__(**kwargs)
        if "column_terms" in cls.__dict__:
            cls.column_terms = checked_column_terms(cls.__dict__["column_terms"])
        if "lossless_terms" in cls.__dict__:
            cls.lossless_terms = checked_lossless_terms(cls.__dict__["lossless_terms"])

    def column_terms(self, weight: "torch.Tensor", eps: "float") -> "ColumnTerms":
        """(scale, bias) over the vocabulary such that ``s = (W·h) * scale + bias`` is the mode's score.

        Args:
            weight: W, (V, d) (or one band's (n, d)); eps: the dead-row threshold ``norm_eps``.
        Returns:
            fp32 vectors of shape (V,) on ``weight``'s device (a 0-dim tensor stands for one value for every row),
            or None for "multiply by one" / "add zero"; anything else is refused naming the mode and the term.
        """
        raise NotImplementedError(f"head mode {self.name!r} defines no column_terms")

    @checked_lossless_terms
    def lossless_terms(self, weight: "torch.Tensor", eps: "float") -> "ColumnTerms":
        """The per-token logit scale g and logit bias b (fp32 (V,), or None where ``lossless_start`` sets none) that
        make this mode's scores equal the plain w_i·h: g·(W·h·scale + bias) + b = W·h, i.e. g = 1/scale and
        b = −g·bias (g = 0 on a dead row, which scores 0 either way). Modes override it for exact closed forms."""
        if self.lossless_start is None:
            raise ValueError(self.lossless_refusal)
        scale, bias = self.column_terms(weight, eps)
        scale_term, bias_term = MODE_LOSSLESS_TERMS  # g, b
        g = None
        if scale_term in self.lossless_start:
            g = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale))
        b = None
        if bias_term in self.lossless_start:
            b = -bias if g is None else -bias * g
        return g, b

    def plain_input_weight(self, weight: "torch.Tensor", eps: "float") -> "torch.Tensor":
        """The matrix a plain ``nn.Embedding`` must hold to look up what this mode looks up: ŵ for a mode that
        normalizes the input lookups, W itself otherwise. (V, d), in ``weight``'s dtype."""
        return unit_rows(weight, eps) if self.normalizes_input_lookups else weight

    def __repr__(self) -> "str":
        return f"<head mode {self.name!r}: {self.equation}>"

    def __deepcopy__(self, memo) -> "HeadMode":
        return self  # a mode is its registered definition: a deep-copied model scores with the same one


class Baseline(HeadMode):
    name, equation, paper = "baseline", "s_i = w_i·h", "plain weight tying, Press & Wolf (2017)"
    summary = "w_i·h (plain tying)"
    lossless_start = ()
    cites_liu_et_al = False

    def column_terms(self, weight, eps):
        return None, None


class L2(HeadMode):
    name, paper = "l2", f"{LIU_ET_AL}, eq. 19"
    equation = "s_i = ŵ_i·h with ŵ_i = w_i/‖w_i‖, and the input lookups use ŵ_i too"
    summary = "ŵ_i·h with unit-row input lookups too"
    normalizes_input_lookups = True
    keeps_row_norms = False
    lossless_refusal = (
        "lossless_start is impossible for head_mode 'l2': it looks up unit rows ŵ_i = w_i/‖w_i‖ at the input too, "
        "so every layer receives other inputs than in the source and no term of the output head can restore its "
        "logits. Use head_mode 'cosine' with lossless_start (the same normalized output head ŵ_i·h, with the "
        "source's input lookups), or convert to 'l2' without lossless_start and fine-tune"
    )

    def column_terms(self, weight, eps):  # ŵ_i·h = w_i·h / ‖w_i‖
        return inverse_row_norms(weight, eps), None


class Square(HeadMode):
    name, equation, paper = "square", "s_i = w_i·h / ‖w_i‖²", f"{LIU_ET_AL}, eq. 22"
    summary = "w_i·h/‖w_i‖²"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps, power=2), None

    def lossless_terms(self, weight, eps):  # g_i = ‖w_i‖²
        return squared_row_norms(weight).float(), None


class Distance(HeadMode):
    name, paper = "distance", f"{LIU_ET_AL}, eq. 26"
    # = −½‖w_i − h‖² + ½‖h‖²: a nearest-neighbour score (the ½‖h‖² is the same for every token)
    equation = "s_i = w_i·h − ½‖w_i‖²"
    summary = "w_i·h − ½‖w_i‖²"
    lossless_start = ("logit_bias",)

    def column_terms(self, weight, eps):
        # No norm is divided by, so no lower bound is needed: a zero row has zero bias and a bounded gradient.
        return None, -0.5 * squared_row_norms(weight).float()

    def lossless_terms(self, weight, eps):  # b_i = ½‖w_i‖², the same fp32 numbers as the bias it cancels
        return None, 0.5 * squared_row_norms(weight).float()


class Cosine(HeadMode):
    name, equation, paper = "cosine", "s_i = w_i·h / ‖w_i‖", f"{LIU_ET_AL}, eq. 27"
    summary = "w_i·h/‖w_i‖"
    lossless_start = ("logit_scale",)

    def column_terms(self, weight, eps):
        return inverse_row_norms(weight, eps), None

    def lossless_terms(self, weight, eps):  # g_i = ‖w_i‖
        return squared_row_norms(weight).float().sqrt(), None


_REGISTRY: "dict[str, HeadMode]" = {}
# The package's own modes: what a config naming them means in every process, so never replaced (module docstring).
BUILTIN_HEAD_MODES = ("baseline", "l2", "square", "distance", "cosine")
# The heads built in this process, by the name of their mode, held weakly (a head is forgotten with its model).
_LIVE_HEADS: "dict[str, weakref.WeakSet]" = {}


def hold_head_mode(head) -> "None":
    """Record that ``head`` (a module whose ``mode`` attribute is the ``HeadMode`` it scores with) lives: while it
    does, its mode's name cannot be given another definition (``register_head_mode``)."""
    _LIVE_HEADS.setdefault(head.mode.name, weakref.WeakSet()).add(head)


def live_heads_holding_another(mode: "HeadMode") -> "list":
    """The live heads scoring with a definition of ``mode.name`` other than ``mode``. A model in a reference cycle
    outlives its last name until the garbage collector runs, so it runs before a head is counted as live."""
    def others() -> "list":
        return [head for head in list(_LIVE_HEADS.get(mode.name, ())) if head.mode is not mode]

    if others():
        gc.collect()
    return others()


def register_head_mode(mode: "HeadMode", *, replace: "bool" = False) -> "HeadMode":
    """Add ``mode`` to the registry under ``mode.name`` (and return it); every config, head, script flag, converter
    and model card of this process then accepts it. ``replace`` allows redefining a name registered at runtime; a
    built-in name (``BUILTIN_HEAD_MODES``) is refused: a saved config names its mode only, and a fresh process (the
    folder's remote code, another user) would score it with the built-in mode."""
    if not isinstance(mode, HeadMode) or not isinstance(mode.name, str) or not mode.name.isidentifier():
        raise ValueError(f"a head mode must be a HeadMode instance with an identifier as name, got {mode!r}")
    if mode.name in BUILTIN_HEAD_MODES and mode.name in _REGISTRY:
        if _REGISTRY[mode.name] is mode:  # the built-in object itself: nothing changes
            return mode
        raise ValueError(
            f"head mode {mode.name!r} is built in ({', '.join(BUILTIN_HEAD_MODES)}) and cannot be redefined, even "
            "with replace=True: a saved config records the mode's name only, so a model trained with the redefined "
            f"mode would reload in another process as the built-in {mode.name!r}, with other logits and no error. "
            "Register your mode under a name of its own"
        )
    if mode.lossless_start is not None and set(mode.lossless_start) - set(MODE_LOSSLESS_TERMS):
        names = " / ".join(map(repr, MODE_LOSSLESS_TERMS))
        raise ValueError(f"head mode {mode.name!r}: lossless_start may name {names} only")
    if mode.name in _REGISTRY and not replace:
        raise ValueError(f"head mode {mode.name!r} is registered already; pass replace=True to redefine it")
    live = live_heads_holding_another(mode)
    if live:
        raise ValueError(
            f"head mode {mode.name!r} cannot be redefined while a model built with it lives ({len(live)} live "
            f"head(s) of {type(live[0]).__name__} score with {live[0].mode!r}): that model would keep the old "
            "definition while its saved folder reloaded in this process with the new one, other logits and no "
            "error. Delete those models first (del model), or register the new definition under a name of its own"
        )
    # Terms set on the instance itself (mode.column_terms = ...) are checked like a subclass's.
    for attribute, checked in (("column_terms", checked_column_terms), ("lossless_terms", checked_lossless_terms)):
        if attribute in vars(mode):
            setattr(mode, attribute, functools.partial(checked(_unbound(vars(mode)[attribute])), mode))
    probe_head_mode(mode)
    _REGISTRY[mode.name] = mode
    return mode


def _unbound(function: "Callable") -> "Callable":
    """A function set on an instance takes (weight, eps); the checks call it as (self, weight, eps)."""
    return getattr(function, "__func__", None) or (lambda self, *args, **kwargs: function(*args, **kwargs))


def unregister_head_mode(name: "str") -> "None":
    """Remove a mode that ``register_head_mode`` added (a test cleans up with it); a built-in mode is refused (it
    could then be registered again as another mode under its name). A live model of the mode keeps scoring with it,
    its ``save_pretrained`` is refused until it is registered again, and no other definition can be registered under
    the name while it lives."""
    if name in BUILTIN_HEAD_MODES:
        raise ValueError(f"head mode {name!r} is built in and cannot be unregistered")
    _REGISTRY.pop(name, None)


def get_head_mode(name: "str") -> "HeadMode":
    """The registered mode called ``name``; ``ValueError`` naming it and the modes this code defines otherwise."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"head_mode must be one of {tuple(_REGISTRY)}, the modes this code ({__name__}) defines; got {name!r}. "
            "A model with a mode registered at runtime (register_head_mode) loads and saves only where that mode is "
            "registered: register it first"
        ) from None


def registered_head_mode(name: "str") -> "HeadMode | None":
    """The mode registered as ``name``, or None (``get_head_mode`` raises instead)."""
    return _REGISTRY.get(name)


class _RegisteredNames(Sequence):
    """The names of the registered modes, read at each use (argparse choices, membership tests, iteration)."""

    def __getitem__(self, index):
        return tuple(_REGISTRY)[index]

    def __len__(self) -> "int":
        return len(_REGISTRY)

    def __iter__(self) -> "Iterator[str]":
        return iter(tuple(_REGISTRY))

    def __contains__(self, name: "object") -> "bool":
        return name in _REGISTRY

    def __eq__(self, other: "object") -> "bool":
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> "int":
        return hash(tuple(self))

    def __repr__(self) -> "str":
        return repr(tuple(self))


HEAD_MODES: "Sequence[str]" = _RegisteredNames()
# The mode a model, a head or a conversion gets when none is named: plain tying, which keeps a converted model's
# function unchanged (docs/head.md, "The default mode").
DEFAULT_HEAD_MODE = "baseline"

for _mode in (Baseline(), L2(), Square(), Distance(), Cosine()):
    register_head_mode(_mode)


def head_mode_summaries() -> "str":
    """"name summary" of every registered mode, for help texts."""
    return "; ".join(f"{mode.name} {mode.summary or mode.equation}" for mode in _REGISTRY.values())


# ------------------------------ hf_tiednorm/modeling/save_checks.py ---------------------------------------------
"""A refused save leaves the folder as it was: every check that can refuse a ``save_pretrained`` runs before its
first write.

transformers' ``PreTrainedModel.save_pretrained`` creates the folder and its code files, then lets the config refuse
itself (``PreTrainedConfig.save_pretrained`` validates just before writing ``config.json``) and the generation config
after that. A model whose head mode had been unregistered wrote ``configuration_tiednorm.py`` and
``modeling_tiednorm.py`` before the refusal, and the folder then failed later with transformers' "Should have a
`model_type` key" (issue 58). ``check_model_saveable`` (a model's save) and ``check_config_saveable`` (a config's)
run those same checks first, and one more: every head of the model scores with the definition its mode's name is
registered under (head/modes.py), since the saved config records that name only.

This file imports the head modes only: it travels with the configuration code (auto_map.py's save hooks) as remote
code, where the head's layer is not.
"""


def check_config_saveable(config, save_directory: "str | os.PathLike") -> "None":
    """What ``config.save_pretrained(save_directory)`` would refuse, raised before anything is written: the config's
    own validation (``@strict`` validators: a head mode or head term not registered, a contradiction) and generation
    parameters set on the config. ``ValueError`` naming the folder, with the cause."""
    try:
        if hasattr(config, "validate"):
            config.validate()
        generation = config._get_generation_parameters() if hasattr(config, "_get_generation_parameters") else {}
        if generation:
            raise ValueError(
                f"generation parameters are set in the model config ({generation}): they go into "
                "model.generation_config"
            )
    except (ValueError, StrictDataclassError) as error:  # a @strict validator's refusal is not a ValueError
        refused = f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written"
        raise ValueError(f"{refused}: {error}") from error


def check_model_saveable(model: "nn.Module", save_directory: "str | os.PathLike") -> "None":
    """What ``model.save_pretrained(save_directory)`` would refuse, raised before the folder is created or any file
    written: a head whose mode is not the definition registered under its name (unregistered, or replaced past the
    registry), the config's checks (``check_config_saveable``) and the generation config's strict validation as
    transformers runs it at save time."""
    # The heads (head/layer.py's, found by the mode they hold: this file travels with the configuration code too)
    for head in (module for module in model.modules() if isinstance(getattr(module, "mode", None), HeadMode)):
        registered = registered_head_mode(head.head_mode)
        if registered is not head.mode:
            what = "is not registered" if registered is None else f"is registered as {registered!r}"
            raise ValueError(
                f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written: the model scores "
                f"with head mode {head.mode!r}, but its name {head.head_mode!r} {what} in this process, and the saved "
                "config records the name only, so the folder would not reload as this model. Register the model's "
                f"mode again (register_head_mode({head.mode!r})) and save"
            )
    check_config_saveable(model.config, save_directory)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None and model.can_generate():
        strict = getattr(generation_config, "_original_object_hash", None) != hash(generation_config)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # transformers' own save warns again; this check only refuses
                generation_config.validate(strict=strict)
        except ValueError as error:
            raise ValueError(
                f"save_pretrained({str(save_directory)!r}) is refused, and nothing was written: the generation "
                f"config is invalid ({error})"
            ) from error


# ------------------------------ hf_tiednorm/modeling/auto_map.py ------------------------------------------------
"""Every ``auto_map`` rule in one place: a wrapped model's saved folder has the wrapper's own, never the source's
(``drop_source_auto_map``); and which entries of a config are ours (``foreign_auto_map``).

A Hub config often carries an ``auto_map`` under a built-in ``model_type`` (remote code of its own, or stale
entries). Kept inside the wrapper's ``text_config``, it (a) took the wrapper's own entries: ``register_for_auto_class``
reads and writes ``config.auto_map``, which the wrapper config delegates to ``text_config``, so the saved folder had
no top-level ``auto_map`` and did not load with ``trust_remote_code=True`` where hf_tiednorm is not installed; and
(b) named someone else's code (``"AutoModelForCausalLM": "org/repo--modeling.Model"``) that transformers would run to
build the wrapped model from ``text_config`` under ``trust_remote_code=True``. The wrapped architecture is a built-in
one, so its config needs no ``auto_map``: it is removed when the config becomes a wrapper's ``text_config``.

A saved model carries two Python files, ``configuration_tiednorm.py`` and ``modeling_tiednorm.py``, generated from
this package by ``utils/generate_remote_code.py`` (in ``hf_tiednorm/remote_code/``): ``two_file_remote_code`` puts
them in the folder and points ``auto_map`` (and the translation pipeline's ``custom_pipelines`` entry) into them,
where transformers' ``custom_object_save`` would copy the class's module and every module it imports. A class that
is not the package's (a saved copy's, loaded with ``trust_remote_code=True``; a family registered from outside) is
left to transformers. Folders saved before (``LEGACY_MODULES``: one file per package module) still name their own
copies, which they carry.

Whose code runs. transformers builds a model type registered in the process (``import hf_tiednorm`` registers ours)
instead of the folder's code, ``trust_remote_code=True`` or not. So a folder saved by another version, or whose
``modeling_tiednorm.py`` was edited, loads with the installed package's classes. A save records the version whose
code it wrote (``config.json``'s ``hf_tiednorm_version``); a load with the package's classes compares the folder's
code files with those the installed package writes for it (``saved_code_files``: the one rule of which files a save
writes) and, where they differ, logs once per folder which code runs and how to run the folder's own
(``report_whose_code_runs``, issue 58).

Ours are the only remote code a saved or published model may name.
``auto_map`` tells ``from_pretrained(..., trust_remote_code=True)`` which code to download and run. A base model's
config can carry entries pointing elsewhere (``"AutoModelForCausalLM": "attacker/repo--evil.EvilModel"``), and
``save_pretrained`` keeps the config's entries it does not overwrite, so they would survive fine-tuning and be
uploaded. Our entries name one of the two generated files (or, in a folder saved by an earlier version, one of
its copies of a package module) without a ``repo--`` prefix; ``foreign_auto_map`` returns every other one, for
the training layer to drop and for staging to refuse.
"""


logger = logging.get_logger(__name__)

REMOTE_CODE_MODULES = ("configuration_tiednorm", "modeling_tiednorm")
# The config.json key of the package version whose code a save wrote into the folder.
VERSION_FIELD = "hf_tiednorm_version"
# The package modules a folder saved before the two generated files names in its auto_map (the flat
# hf_tiednorm/*.py of 7bdafef, copied one file each): such a folder carries them and still loads.
LEGACY_MODULES = frozenset({
    "accumulated_loss", "adaptive", "causal_lm_names", "chunked_loss", "configuration_tiednorm",
    "configuration_tiednorm_wrapped", "embeddings", "folded_weight", "fused_loss", "head_host", "head_mode_checks",
    "head_modes", "head_options", "load_checks", "loss", "lossless_start", "modeling_common",
    "modeling_tiednorm_bart", "modeling_tiednorm_causal", "modeling_tiednorm_seq2seq", "modeling_tiednorm_wrapped",
    "normalized_head", "outputs", "peft_guard", "pipeline_translation", "regularizers", "remote_code_map",
    "scoring_guard", "tie_topology", "token_loss", "weight_checks", "wrapped_fused_loss",
})  # fmt: skip  (scoring_guard: issue 47, a model-layer module transformers copies like the others)
# The model layer's folder (hf_tiednorm/modeling/) and the generated files beside it in the package (absent where
# this module is itself generated code).
_MODEL_LAYER = Path(__file__).resolve().parent
GENERATED_DIR = _MODEL_LAYER.parent / "remote_code"


def drop_source_auto_map(text_config) -> "None":
    """Remove ``auto_map`` from ``text_config`` (a ``PreTrainedConfig`` about to become a wrapper's ``text_config``)
    in place; a dict (converted later) or None is left alone."""
    if isinstance(text_config, PreTrainedConfig):
        text_config.__dict__.pop("auto_map", None)


def _is_ours(reference: "Any") -> "bool":
    if reference is None:
        return True
    if isinstance(reference, (list, tuple)):  # a tokenizer's [slow, fast] pair
        return all(_is_ours(item) for item in reference)
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return False
    return reference.rsplit(".", 1)[0] in LEGACY_MODULES.union(REMOTE_CODE_MODULES)


def foreign_auto_map(auto_map: "dict[str, Any] | None") -> "dict[str, Any]":
    """The entries of ``auto_map`` (a config's) that do not name our remote code: another repository's
    (``owner/repo--module.Class``) or a module that is not ours. {} when every entry is ours."""
    return {key: value for key, value in (auto_map or {}).items() if not _is_ours(value)}


def _package_class(cls: "type") -> "bool":
    """Whether ``cls`` is defined by one of this package's model-layer modules (not by a generated file, a saved copy
    or a test) while the generated files are at hand."""
    module = sys.modules.get(cls.__module__)
    path = Path(getattr(module, "__file__", "") or "").resolve()
    return GENERATED_DIR.is_dir() and _MODEL_LAYER in path.parents


def remote_code_reference(cls: "type") -> "str":
    """``"modeling_tiednorm.Name"`` / ``"configuration_tiednorm.Name"``: where a saved model's code defines ``cls``,
    a class of this package. ``RuntimeError`` when the generated file lacks it (stale: regenerate)."""
    module = REMOTE_CODE_MODULES[0] if issubclass(cls, PreTrainedConfig) else REMOTE_CODE_MODULES[1]
    if f"\nclass {cls.__name__}(" not in (GENERATED_DIR / f"{module}.py").read_text():
        raise RuntimeError(
            f"{GENERATED_DIR / module}.py does not define {cls.__name__}: the generated remote code is stale; run "
            "`python utils/generate_remote_code.py`"
        )
    return f"{module}.{cls.__name__}"


def _renamed(reference: "Any") -> "Any":
    """A ``"module.Name"`` entry naming one of the package's modules, renamed into the generated files."""
    if not isinstance(reference, str) or "--" in reference or "." not in reference:
        return reference
    module, name = reference.rsplit(".", 1)
    if module not in LEGACY_MODULES:
        return reference
    for target in REMOTE_CODE_MODULES:
        if f"\nclass {name}(" in (GENERATED_DIR / f"{target}.py").read_text():
            return f"{target}.{name}"
    return reference


def code_reference(cls: "type") -> "str":
    """The ``auto_map`` entry of ``cls``: in the generated files for a class of this package, else
    ``"<its module's file name>.Name"`` as transformers writes it (a saved copy's class names its own file)."""
    if _package_class(cls):
        return remote_code_reference(cls)
    return f"{cls.__module__.rsplit('.', 1)[-1]}.{cls.__name__}"


@contextmanager
def no_module_copies(model) -> "Iterator[None]":
    """While ``model.save_pretrained`` runs, for a model class of this package: transformers' ``custom_object_save``
    copies nothing (it would copy the class's module and the modules it imports, and it follows single-dot imports
    only), the config's ``auto_map`` names the class in the generated modeling file, and the config's own save writes
    the two files (``two_file_remote_code``). transformers asks the class (``is_remote_code`` is a classmethod), so
    the class's ``_auto_class`` is cleared for the save and restored after it."""
    cls = type(model)
    auto_class = cls._auto_class
    if auto_class is None or not _package_class(cls):
        yield
        return
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), auto_class: code_reference(cls)}
    own = "_auto_class" in vars(cls)
    cls._auto_class = None
    try:
        yield
    finally:
        if own:
            cls._auto_class = auto_class
        else:
            del cls._auto_class


def installed_version() -> "str | None":
    """The installed hf_tiednorm's version; None where the package is not installed (this file as remote code)."""
    try:
        return importlib.metadata.version("hf_tiednorm")
    except importlib.metadata.PackageNotFoundError:
        return None


def saved_code_files(config: "PreTrainedConfig", *, with_model: "bool" = True) -> "dict[str, Path]":
    """The code files a save of ``config`` writes into its folder (file name -> the package's generated file it is a
    copy of): what the installed package generates for the config's family. ``with_model``: the modeling file too
    (a config saved alone names no model). The one rule ``two_file_remote_code`` writes by and a load compares a
    folder's code against (``code_differences``)."""
    modules = REMOTE_CODE_MODULES if with_model else REMOTE_CODE_MODULES[:1]
    return {f"{module}.py": GENERATED_DIR / f"{module}.py" for module in modules}


def folder_code_files(config: "PreTrainedConfig") -> "list[str]":
    """The code files a loaded ``config``'s folder names as its own: the modules of its ``auto_map`` entries and of
    its pipelines' implementations (``module.Name``, no other repository's), as file names."""
    pipelines = getattr(config, "custom_pipelines", None) or {}
    named = [*(getattr(config, "auto_map", None) or {}).values(),
             *(entry.get("impl") for entry in pipelines.values() if isinstance(entry, dict))]  # fmt: skip
    named = [item for value in named for item in (value if isinstance(value, (list, tuple)) else [value])]
    modules = {name.rsplit(".", 1)[0] for name in named if isinstance(name, str) and "." in name and "--" not in name}
    return sorted(f"{module}.py" for module in modules)


def code_differences(folder: "Path", config: "PreTrainedConfig") -> "list[str]":
    """How the code files that ``folder`` (loaded as ``config``) names differ from those the installed package writes
    for it (``saved_code_files``); [] where they are the same bytes, or the folder names no code of its own."""
    expected = saved_code_files(config)
    differences = []
    for name in folder_code_files(config):
        if name not in expected:
            differences.append(f"{name} is not a file this version writes (it writes {', '.join(expected)})")
        elif not (folder / name).is_file():
            differences.append(f"{name} is missing")
        elif (folder / name).read_bytes() != expected[name].read_bytes():
            differences.append(f"{name} differs from the installed package's")
    return differences


_REPORTED: "set[str]" = set()  # the folders whose code was reported (once each)


def report_whose_code_runs(model, source: "str | os.PathLike") -> "None":
    """Log once per folder, where ``model`` (a class of the installed package, loaded from ``source``) was loaded from
    a folder whose own code differs from what the installed package writes for it: which code runs, and how to run
    the folder's own. Nothing for a class that is not the package's (the folder's own code already runs)."""
    if not _package_class(type(model)) or not Path(source).is_dir():
        return
    folder = Path(source)
    key = str(folder.resolve())
    differences = [] if key in _REPORTED else code_differences(folder, model.config)
    if not differences:
        return
    _REPORTED.add(key)
    saved, installed = getattr(model.config, VERSION_FIELD, None), installed_version()
    saved_by = f"saved by hf_tiednorm {saved}" if saved else "saved with no hf_tiednorm version recorded (before 0.1)"
    entries = (getattr(model.config, "auto_map", None) or {}).values()
    own = next((e for e in entries if isinstance(e, str) and e.endswith(f".{type(model).__name__}")), None)
    own = own or f"{REMOTE_CODE_MODULES[1]}.{type(model).__name__}"
    logger.warning(
        "%s carries its own code (%s%s: %s), but the installed hf_tiednorm %s runs it: transformers builds a model "
        "type registered in this process (import hf_tiednorm registers ours) instead of a folder's code, "
        "trust_remote_code=True or not. To run the folder's own code: transformers.dynamic_module_utils."
        "get_class_from_dynamic_module(%r, %r).from_pretrained(%r), or load it in a process that does not import "
        "hf_tiednorm; to give the folder the installed code, save the loaded model again",
        folder, saved_by, "; edited since, or another build" if saved == installed else "", "; ".join(differences),
        installed, own, str(folder), str(folder),
    )


@contextmanager
def two_file_remote_code(config: "PreTrainedConfig", save_directory: "str | os.PathLike") -> "Iterator[None]":
    """While ``config.save_pretrained(save_directory)`` runs (itself, or inside a model's ``save_pretrained``):
    the folder holds the two generated files instead of transformers' copies of the package's modules, and the
    config's ``auto_map`` and ``custom_pipelines`` entries name them. Nothing changes for a config class that is not
    the package's (see the module docstring)."""
    if type(config)._auto_class is None or not _package_class(type(config)):
        yield
        return
    folder = Path(save_directory)
    folder.mkdir(parents=True, exist_ok=True)
    left = []
    for module in LEGACY_MODULES - set(REMOTE_CODE_MODULES):
        if (folder / f"{module}.py").is_file():
            left.append(f"{module}.py")
    if left:  # not ours to delete: an earlier save's code, or the user's
        logger.warning("%s holds %s, which the saved model does not use (auto_map names configuration_tiednorm.py "
                       "and modeling_tiednorm.py); delete them if an earlier save left them", folder, sorted(left))
    auto_map = {key: _renamed(value) for key, value in (getattr(config, "auto_map", None) or {}).items()}
    config.auto_map = {**auto_map, type(config)._auto_class: remote_code_reference(type(config))}
    pipelines = getattr(config, "custom_pipelines", None) or {}
    for entry in pipelines.values():
        if isinstance(entry, dict) and "impl" in entry:
            entry["impl"] = _renamed(entry["impl"])
    named = [*config.auto_map.values(), *(entry.get("impl") for entry in pipelines.values() if isinstance(entry, dict))]
    # the modeling file where a model (or its pipeline) is named: not a config's
    with_model = any(str(name).startswith(f"{REMOTE_CODE_MODULES[1]}.") for name in named)
    for name, generated in saved_code_files(config, with_model=with_model).items():
        shutil.copyfile(generated, folder / name)
    setattr(config, VERSION_FIELD, installed_version())  # whose code the folder now carries
    config._auto_class = None  # an instance attribute, over the class's: transformers then copies nothing
    try:
        yield
    finally:
        del config._auto_class


class TwoFileModelCodeMixin:
    """Put before ``PreTrainedModel`` in a model class's bases (every family's pretrained base, so a bare body too):
    its ``save_pretrained`` names the generated modeling file instead of copying its module (``no_module_copies``),
    and its ``from_pretrained`` says where the folder's own code is not the code that runs
    (``report_whose_code_runs``)."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        report_whose_code_runs(loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path)
        return loaded

    def save_pretrained(self, save_directory, *args, **kwargs) -> "None":
        check_model_saveable(self, save_directory)  # a refused save writes nothing (modeling/save_checks.py)
        with no_module_copies(self):
            super().save_pretrained(save_directory, *args, **kwargs)


class TwoFileRemoteCodeMixin:
    """Put before ``PreTrainedConfig`` in a config class's bases: its ``save_pretrained`` (alone, or inside a
    model's) writes the two generated files as the folder's code (``two_file_remote_code``)."""

    def save_pretrained(self, save_directory, *args, **kwargs) -> "None":
        check_config_saveable(self, save_directory)  # before the code files are written (modeling/save_checks.py)
        with two_file_remote_code(self, save_directory):
            super().save_pretrained(save_directory, *args, **kwargs)


# ------------------------------ hf_tiednorm/modeling/head/settings.py -------------------------------------------
"""The five settings of the normalized tied head, as one value: ``HeadSettings``.

A head is built from a config (``HeadSettings.from_config``), from the converter's arguments or CLI, or directly; each
path builds one ``HeadSettings``, which checks every setting once when it is made, and passes it whole to the head
(``TiedNormHead(..., settings=...)``), the wrapper's config (``as_config_fields``) and the lossless start
(``with_lossless_start``). The head's learned terms (its logit scale g and bias b, and any added from outside) are
``HeadTerm`` objects in one registry (``HEAD_TERMS``; the built-ins in terms.py): a new term is a
``HeadTerm`` registered with ``register_head_term`` and nothing else.
"""


# Configs annotate their logit_scale_kind field with this type (``@strict`` checks it).
LogitScale = Literal["none", "fixed", "scalar", "vector"]
LOGIT_SCALES: "tuple[str, ...]" = get_args(LogitScale)


def renamed_config_fields() -> "dict[str, tuple[str, HeadTerm]]":
    """Config fields renamed since models were saved with them: old name -> (new name, the term that owns it), from
    each term's ``renamed_fields``. config.json and keyword arguments under the old name still load, with a
    FutureWarning (``HeadTerm.renamed_value``)."""
    return {old: (new, term) for term in head_terms() for old, new in term.renamed_fields.items()}


def renamed_fields_set(config, kwargs: "dict") -> "dict":
    """Set on ``config`` each field that ``kwargs`` (a config's extra keywords: config.json, from_pretrained) gives
    under its old name (``renamed_config_fields``, with a FutureWarning); returns the other keywords."""
    for old, (new, term) in renamed_config_fields().items():
        if old in kwargs:
            kwargs = dict(kwargs)
            setattr(config, new, term.renamed_value(old, new, kwargs.pop(old), getattr(config, new)))
    return kwargs


class HeadTerm:
    """A learned term of the head, folded into its (scale, bias): the one protocol of the built-in terms (the logit
    scale g and bias b, terms.py) and of a term added from outside (``ExtraHeadTerm``). The head, the fold, a
    resize, fp32 handling, a lossless start, the load checks, the flags, the export and the card ask a term only
    these; none of them names one. Defaults are those of a per-token (V,) term switched on by ``extra_terms``.

    Attributes:
        name: the head's parameter (``lm_head.<name>``, a state-dict key), a Python identifier.
        help: the help of its flag (converter, training scripts).
        config_fields: the ``HeadSettings``/config fields that set it (their flags are the term's flags); () for a
            term switched on by naming it in ``extra_terms`` (its flag is the switch ``--<name>``).
        keep_fp32: kept fp32 under a bf16/fp16 load or cast (a step of a small learning rate rounds away in bf16).
        row_scaled: multiplied by c_i where a source's output rows were c_i·w_i (``take_row_scales``), because it
            multiplies or shifts the whole logit (g and b).
        takes_row_scales: a lossless start that sets it can absorb those c_i (a per-token scale of the logit).
    """

    name: "str"
    help: "str"
    config_fields: "tuple[str, ...]" = ()
    renamed_fields: "dict[str, str]" = {}  # noqa: RUF012 (read only) old config field name -> its new name
    keep_fp32: "bool" = True
    row_scaled: "bool" = False
    takes_row_scales: "bool" = False

    def renamed_value(self, old: "str", new: "str", value, current, given_as: "str" = "config field"):
        """The value of config field ``new`` given under its old name ``old`` (``renamed_fields``) as a
        ``given_as`` (``"config field"``, ``"keyword argument"``), with a FutureWarning, or ``ValueError``; a term
        that renamed a field says what the old name may hold."""
        raise ValueError(f"{old}={value!r}: the config field {old} is now {new}")

    def is_on(self, settings) -> "bool":
        """Whether a head with ``settings`` holds (or applies) this term."""
        return self.name in settings.extra_terms

    def setting(self, settings) -> "str":
        """The config setting that switches it, as config.json states it (load checks' messages)."""
        return f"extra_terms={list(settings.extra_terms)!r}"

    def check(self, settings) -> "None":
        """``ValueError`` naming the field for a bad setting of ``settings`` (a ``HeadSettings`` being made)."""

    def start_value(self, settings, hidden_size: "int") -> "float":
        """The value the parameter starts at (and a resized vocabulary's new tokens get)."""
        return float(self.init)

    def shape(self, settings, vocab_size: "int") -> "tuple[int, ...] | None":
        """The parameter's shape for ``settings``; None: the head holds no parameter for it."""
        return (vocab_size,) if self.is_on(settings) else None

    def fold_into(self, head, scale, bias, rows: "slice", device):
        """(scale, bias) of the tokens ``rows`` (a slice with both ends; fp32, (n,) or None) with this term folded
        in; ``device``: the head's."""
        return self.fold(getattr(head, self.name)[rows].float(), scale, bias)

    def lossless_settings(self, settings, mode) -> "dict":
        """The ``HeadSettings`` fields a lossless start of ``mode`` sets for this term, or ``ValueError`` naming the
        setting that makes the start impossible."""
        return {}

    def lossless_value(self, head, rows, mode_terms: "dict"):
        """The value a lossless start gives this term for the rows ``rows`` (``mode_terms``: the mode's
        ``lossless_terms`` by name); None: left as it is (then checked to change no score)."""
        value = getattr(self, "lossless", None)
        return None if value is None else torch.full((rows.shape[0],), float(value), device=rows.device)

    def card_row(self, config, stored, hidden_size: "int") -> "str | None":
        """The model card's text for it (``stored(name)``: the (min, max) of a saved tensor, or None); None where
        ``config`` does not switch it on."""
        return self.card if self.is_on(HeadSettings.from_config(config)) else None

    def bias_text(self) -> "str":
        """What a plain export's refusal of a bias says this term is."""
        return f"the registered head term {self.name!r}"


@dataclass(frozen=True)
class ExtraHeadTerm(HeadTerm):
    """A head term added from outside the package (``register_head_term``): a learned per-token term t (V,),
    a parameter of the head named ``name``, started at ``init`` and folded into the column terms by ``fold(t, scale,
    bias) -> (scale, bias)`` (so the plain export bakes it like g and b). A model switches it on with
    ``HeadSettings(extra_terms=(name,))``; its config records the names (``extra_terms``), and a process where the
    option is not registered refuses the model by name, as it refuses an unknown head mode. ``lossless``: the value
    a lossless start sets it to (None: left at ``init``); ``keep_fp32``: kept fp32 under a bf16/fp16 load."""

    name: "str"
    help: "str"
    init: "float"
    fold: "Callable"
    card: "str"  # the model card's line for it
    keep_fp32: "bool" = True
    lossless: "float | None" = None


# Every head term, in the order they fold: the built-ins first (terms.py registers them at import), then those
# registered from outside (``register_head_term``).
HEAD_TERMS: "dict[str, HeadTerm]" = {}


def head_terms() -> "tuple[HeadTerm, ...]":
    """Every registered head term, built-in and added, in folding order."""
    return tuple(HEAD_TERMS.values())


def add_head_term(term: "HeadTerm") -> "HeadTerm":
    """Put ``term`` in the registry (a built-in's way in, at import; ``register_head_term`` checks more)."""
    if term.name in HEAD_TERMS:
        raise ValueError(f"a head term {term.name!r} is registered already")
    HEAD_TERMS[term.name] = term
    return term


def takes_row_scales(mode) -> "bool":
    """Whether ``mode``'s lossless start sets a term that can absorb a source's output row scales c_i (a per-token
    scale of the logit, ``HeadTerm.takes_row_scales``): an untied source with rows c_i·w_i converts losslessly."""
    return any(HEAD_TERMS[name].takes_row_scales for name in mode.lossless_start or () if name in HEAD_TERMS)


def switched_terms() -> "tuple[str, ...]":
    """The names of the terms a model switches on by naming them in ``extra_terms``."""
    return tuple(term.name for term in HEAD_TERMS.values() if not term.config_fields)


def register_head_term(term: "ExtraHeadTerm") -> "ExtraHeadTerm":
    """Make ``term`` available to every head, config, converter flag (``--<name>``), export and card.

    Its name becomes a parameter of the head (``lm_head.<name>``), a key of the state dict and a converter flag, so
    it must be a Python identifier (no dash, dot or empty name) not starting with ``_``, and must not shadow
    anything the head already holds (``HEAD_NAME_SOURCES``: ``norm_eps``, ``weight``, ``settings``, ...): a
    parameter set over ``norm_eps`` changed the logits by 1.77 at its neutral init, with no error.
    """
    if not isinstance(term, HeadTerm):
        raise TypeError(f"register_head_term takes an ExtraHeadTerm (a HeadTerm), got {type(term).__name__}")
    name = term.name
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
        raise ValueError(
            f"head term name {name!r} (register_head_term) must be a Python identifier not starting with '_' "
            "(letters, digits and underscores: it becomes the head's parameter lm_head.<name> and the converter's "
            "flag --<name with dashes>), e.g. 'logit_temperature'"
        )
    if name in HEAD_TERMS:
        raise ValueError(f"a head term {name!r} is registered already")
    if term.config_fields:  # HeadSettings and the configs declare the built-ins' fields only
        raise ValueError(
            f"head term {name!r} (register_head_term) declares config_fields {term.config_fields}, which no "
            "config has: a term added from outside is switched on by naming it in extra_terms; leave config_fields ()"
        )
    if name in taken_head_names():
        raise ValueError(
            f"head term name {name!r} (register_head_term) is taken by the head itself (an attribute, method "
            "or setting of TiedNormHead): its parameter would replace it; register the term under another name"
        )
    return add_head_term(term)


# Callables giving every name a head holds (its attributes, methods and parameters): head/layer.py adds
# TiedNormHead's where it defines the head, which imports this module (so this module cannot import it).
HEAD_NAME_SOURCES: "list[Callable[[], Iterable[str]]]" = []


def taken_head_names() -> "frozenset[str]":
    """What a registered term's parameter must not replace: every name the head holds (``HEAD_NAME_SOURCES``) and
    every ``HeadSettings`` field, the renamed ones' old names included."""
    if not HEAD_NAME_SOURCES:
        raise RuntimeError("no head has declared its names (head/layer.py is not loaded): cannot check a name")
    fields = {f.name for f in dataclasses.fields(HeadSettings)} | set(renamed_config_fields())
    return frozenset(fields.union(*(source() for source in HEAD_NAME_SOURCES)))


def learned_terms() -> "tuple[str, ...]":
    """Every learned term a head may hold, named as its parameter (state-dict keys such as 'lm_head.<name>')."""
    return tuple(HEAD_TERMS)


@dataclass(frozen=True, kw_only=True)
class HeadSettings:
    """The head's settings, keyword-only; the config fields of the same names (``TiedNormHeadConfigMixin``) document
    them, and every check of them is here (a config validates through ``HeadSettings.from_config``).

    Attributes:
        head_mode: a registered mode (head/modes.py).
        logit_scale_kind: ``none``, ``fixed`` (a constant g), ``scalar`` (one learned g) or ``vector`` (a learned
            g_i, the head's ``logit_scale`` parameter).
        logit_scale_init: g for ``fixed``, the initial g for ``scalar``/``vector``; None: 1 for a learned g, √d
            for ``fixed``.
        logit_bias: a learned per-token bias b added to the scores, zero at initialization.
        norm_eps: a row with ‖w_i‖ ≤ norm_eps is dead (scores 0, no gradient through its norm).
    """

    head_mode: "str" = DEFAULT_HEAD_MODE
    logit_scale_kind: "str" = "none"
    logit_scale_init: "float | None" = None
    logit_bias: "bool" = False
    norm_eps: "float" = 1e-6
    # Registered head terms (``register_head_term``) that are on; not a config field of the package's own.
    extra_terms: "tuple[str, ...]" = field(default=(), metadata={"registry": True})
    # The old name of logit_scale_kind (renamed_config_fields), a keyword only: HeadSettings(logit_scale="vector"),
    # as scripts written before the rename pass it (normalize_tied_head, convert_checkpoint), sets logit_scale_kind
    # with a FutureWarning naming the new name.
    logit_scale: "InitVar[str | None]" = None

    def __post_init__(self, logit_scale: "str | None" = None) -> "None":
        if logit_scale is not None:  # the old keyword: its term checks the value and warns
            new, term = renamed_config_fields()["logit_scale"]
            value = term.renamed_value("logit_scale", new, logit_scale, getattr(self, new), "keyword argument")
            object.__setattr__(self, new, value)
        extra = self.extra_terms
        if isinstance(extra, str) or not isinstance(extra, (tuple, list)) or not all(isinstance(n, str) for n in extra):
            raise ValueError(
                f"extra_terms must be a tuple of registered head term names, got {type(extra).__name__} {extra!r}"
                + (f"; write extra_terms=({extra!r},)" if isinstance(extra, str) else "")
            )
        if len(set(extra)) != len(extra):
            raise ValueError(f"extra_terms names a head term twice: {list(extra)}")
        object.__setattr__(self, "extra_terms", tuple(extra))  # a config.json's list, as the hashable tuple
        switched = switched_terms()
        unknown = [name for name in self.extra_terms if name not in switched]
        if unknown:
            raise ValueError(
                f"head term(s) {unknown} are not registered in this process (registered: {sorted(switched)}): "
                "the model was trained with a head term registered at runtime (register_head_term); register it "
                "before loading"
            )
        get_head_mode(self.head_mode)  # ValueError naming the mode and the registered ones
        for term in head_terms():  # each term checks its own fields (terms.py)
            term.check(self)
        if not 0 < self.norm_eps < math.inf:
            raise ValueError(f"norm_eps must be > 0 and finite, got {self.norm_eps}")

    @property
    def mode(self) -> "HeadMode":
        """The mode object (head/modes.py): column terms, input lookups, lossless start, texts."""
        return get_head_mode(self.head_mode)

    @classmethod
    def from_config(cls, config) -> "HeadSettings":
        """The settings a config (any hf_tiednorm config: the fields of ``TiedNormHeadConfigMixin``) holds."""
        extra = getattr(config, "extra_terms", None)
        fields = {name: getattr(config, name) for name in cls.field_names()}
        return cls(**fields, extra_terms=() if extra is None else extra)  # a string is refused, not split

    @classmethod
    def field_names(cls) -> "tuple[str, ...]":
        """The settings that are config fields of the package (``TiedNormHeadConfigMixin``)."""
        return tuple(f.name for f in dataclasses.fields(cls) if not f.metadata.get("registry"))

    def active_terms(self) -> "tuple[HeadTerm, ...]":
        """The head terms these settings switch on, in the order they fold: the built-ins' (set by their config
        fields) in registry order, then ``extra_terms`` in their order."""
        built_in = (term for term in head_terms() if term.config_fields and term.is_on(self))
        return (*built_in, *map(HEAD_TERMS.get, self.extra_terms))

    def term_switches(self) -> "dict":
        """Each built-in term's switch (its first config field) and its value: {"logit_scale_kind": ..., ...}."""
        switches = [term.config_fields[0] for term in head_terms() if term.config_fields]
        return {name: getattr(self, name) for name in switches}

    def term_settings(self) -> "str":
        """The terms' settings as config.json states them (a head's repr): "logit_scale_kind='none', ..."."""
        settings = (term.setting(self) for term in head_terms() if term.config_fields or term.is_on(self))
        return ", ".join(dict.fromkeys(settings))

    def as_config_fields(self) -> "dict":
        """The config fields (``head_mode=...``, ...) of these settings; ``extra_terms`` only when one is on."""
        fields = dataclasses.asdict(self)
        if not self.extra_terms:
            del fields["extra_terms"]
        return fields

    def with_lossless_start(self) -> "HeadSettings":
        """The settings a lossless start of ``head_mode`` needs (its ``HeadMode.lossless_start`` terms switched on),
        or ``ValueError`` naming the option that makes it impossible (head/lossless_start.py)."""
        mode = self.mode
        if mode.lossless_start is None:
            raise ValueError(mode.lossless_refusal)
        changes = {}
        for term in head_terms():
            changes.update(term.lossless_settings(self, mode))
        return dataclasses.replace(self, **changes)


# ------------------------------ hf_tiednorm/modeling/head/lossless_start.py -------------------------------------
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


def check_lossless_settings(config) -> "None":
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
def start_lossless(model: "PreTrainedModel") -> "None":
    """Set the converted ``model``'s per-token logit scale / bias so that it computes its source's logits (in place).

    ``model``'s head holds the source's embedding matrix W (V, d) unchanged and was built with the settings of
    ``HeadSettings.with_lossless_start``; the values are its mode's ``lossless_terms`` (cosine g_i = ‖w_i‖, square
    g_i = ‖w_i‖², distance b_i = ½‖w_i‖², fp32).
    """
    head = model.get_output_embeddings()
    _set_lossless_terms(head, 0)
    check_extra_terms_neutral(head)
    model.config.lossless_start = True


def check_extra_terms_neutral(head) -> "None":
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


def _set_lossless_terms(head, first: "int") -> "None":
    """Set every learned term of ``head`` that a lossless start sets (``HeadTerm.lossless_value``: the built-ins
    from their mode's ``lossless_terms``, a registered one to its ``lossless`` value) for tokens ``first`` and up."""
    rows = head.weight[first:]
    mode_terms = dict(zip(MODE_LOSSLESS_TERMS, head.mode.lossless_terms(rows, head.norm_eps), strict=True))
    for term in head.settings.active_terms():
        value = term.lossless_value(head, rows, mode_terms)  # (new,) or None: the term is left as it is
        if value is not None:
            getattr(head, term.name)[first:].copy_(value)  # copy_: from any device, as a load does


@torch.no_grad()
def start_resized_tokens(model: "PreTrainedModel", first_new: "int") -> "None":
    """After ``resize_token_embeddings`` of a lossless-started ``model`` (``config.lossless_start``), start the new
    tokens' g_i / b_i (ids ``first_new`` and up) by their mode's lossless map from their initial rows, in place; a
    model without a lossless start keeps the head's own rule (g = ``logit_scale_init``, b = 0)."""
    head = model.get_output_embeddings()
    if not getattr(model.config, "lossless_start", False) or head.weight.shape[0] <= first_new:
        return
    _set_lossless_terms(head, first_new)


@torch.no_grad()
def take_row_scales(model: "PreTrainedModel", row_scales: "torch.Tensor") -> "None":
    """After the lossless start of a source whose output rows were c_i·w_i: g_i·(score) + b_i = w_i·h becomes
    c_i·g_i·(score) + c_i·b_i = c_i·(w_i·h), the source's logit (in place)."""
    head = model.get_output_embeddings()
    for term in head_terms():  # those that scale or shift the whole logit (g, b): c_i times each
        learned = getattr(head, term.name, None)
        if term.row_scaled and learned is not None:
            learned.mul_(row_scales.to(learned))


# ------------------------------ hf_tiednorm/modeling/head/terms.py ----------------------------------------------
"""The head's two built-in learned terms, ``HeadTerm`` objects registered at import as an outside term is
(settings.py): the logit scale g and the logit bias b of ``s_i = g·score_i + b_i``.

* ``logit_scale`` (config fields ``logit_scale_kind``, ``logit_scale_init``): ``none``; ``fixed`` (a constant g,
  FixNorm's r², no parameter); ``scalar`` (one learned g, as in Transformers without Tears); ``vector`` (a learned
  g_i per token, as in nGPT). A learned g starts at 1 unless told otherwise, ``fixed`` at √d (layer.py).
* ``logit_bias`` (config field ``logit_bias``): a learned b_i per token, zero at first, added after the scale: where
  a model can keep the unigram prior that a normalized head deletes.

Everything the package does with them (the head's parameters and fold, a resize's new tokens, fp32, a lossless
start, the load checks, the flags, the export and the card) asks these objects, through the ``HeadTerm`` hooks.
Their config fields and state-dict keys (``lm_head.logit_scale``, ``lm_head.logit_bias``) are those of every saved
model.
"""


def default_logit_scale(logit_scale: "str", hidden_size: "int") -> "float":
    """g when ``logit_scale_init`` is unset: 1 for a learned scale (``scalar``, ``vector``: the head starts as the
    scale-free one and learns the sharpness it needs); √d for ``fixed``, the constant it has always had (a saved
    ``fixed`` model's function depends on it, so it keeps its meaning)."""
    return math.sqrt(hidden_size) if logit_scale == "fixed" else 1.0


class LogitScaleTerm(HeadTerm):
    """g: multiplies the mode's (scale, bias); a parameter for ``scalar`` (0-dim) and ``vector`` (V,)."""

    name = "logit_scale"
    help = "the logit scale g: logit_scale_kind 'vector' for a (V,) tensor, 'scalar' for a 0-dim one"
    config_fields = ("logit_scale_kind", "logit_scale_init")
    # Its switch was called logit_scale: TRL, vLLM and transformers' Cohere read config.logit_scale as a float.
    renamed_fields = {"logit_scale": "logit_scale_kind"}  # noqa: RUF012
    row_scaled = takes_row_scales = True

    def renamed_value(self, old: "str", new: "str", value, current, given_as: "str" = "config field"):
        """``value`` given under the old name with a FutureWarning naming the new one; ``ValueError`` for a value the
        old field never took (``logit_scale=2.0``: the float multiplier of other architectures, which this head's
        settings do not read) or one contradicting ``new`` given too. ``given_as``: ``"config field"`` (config.json,
        a config's keywords) or ``"keyword argument"`` (``HeadSettings``, ``normalize_tied_head``,
        ``convert_checkpoint``), which the warning's advice follows."""
        if not (isinstance(value, str) and value in LOGIT_SCALES):
            raise ValueError(
                f"{old}={value!r}: hf_tiednorm's configs have no {old} field (TRL, vLLM and Cohere read config.{old} "
                f"as a float multiplier of the logits, which this head would not apply); the head's scale is {new}, "
                f"one of {LOGIT_SCALES}, with logit_scale_init for its value"
            )
        if current not in ("none", value):
            raise ValueError(f"{old}={value!r} (the old name of {new}) contradicts {new}={current!r}: give {new} only")
        # Attributed to the first caller outside this package (from_pretrained's, or the user's own line).
        frame, stacklevel = sys._getframe(0), 1
        while frame is not None and frame.f_globals.get("__name__", "").startswith("hf_tiednorm"):
            frame, stacklevel = frame.f_back, stacklevel + 1
        advice = {
            "config field": "Save the config again to store the new name; the old one will stop loading",
            "keyword argument": f"Write {new}={value!r}; the old keyword will stop working",
        }[given_as]
        warnings.warn(
            f"the {given_as} {old!r} is renamed {new!r} (TRL, vLLM and transformers read config.{old} as a float "
            f"multiplier of the logits); reading {old}={value!r} as {new}={value!r}. {advice} in a future release",
            FutureWarning,
            stacklevel=stacklevel,
        )
        return value

    def is_on(self, settings) -> "bool":
        return settings.logit_scale_kind != "none"

    def setting(self, settings) -> "str":
        return f"logit_scale_kind={settings.logit_scale_kind!r}"

    def check(self, settings) -> "None":
        if settings.logit_scale_kind not in LOGIT_SCALES:
            raise ValueError(f"logit_scale_kind must be one of {LOGIT_SCALES}, got {settings.logit_scale_kind!r}")
        if settings.logit_scale_init is not None:
            if not 0 < settings.logit_scale_init < math.inf:
                raise ValueError(f"logit_scale_init must be > 0 and finite, got {settings.logit_scale_init}")
            if settings.logit_scale_kind == "none":
                raise ValueError(
                    f"logit_scale_init={settings.logit_scale_init} is set but logit_scale_kind='none'; choose a "
                    "logit_scale_kind "
                    "among ('fixed', 'scalar', 'vector') or leave logit_scale_init unset"
                )

    def start_value(self, settings, hidden_size: "int") -> "float":
        init = settings.logit_scale_init
        return float(init) if init is not None else default_logit_scale(settings.logit_scale_kind, hidden_size)

    def shape(self, settings, vocab_size: "int") -> "tuple[int, ...] | None":
        return {"scalar": (), "vector": (vocab_size,)}.get(settings.logit_scale_kind)

    def fold_into(self, head, scale, bias, rows: "slice", device):
        # g·(W·h·scale + bias) = W·h·(g·scale) + g·bias; "fixed" is a constant, not a parameter
        if head.settings.logit_scale_kind == "none":
            return scale, bias
        g = head.logit_scale
        g = g.float() if g is not None else torch.tensor(head.term_starts[self.name], device=device)
        g = g[rows] if g.dim() else g.expand(rows.stop - rows.start)  # a single g for every token
        return (g if scale is None else scale * g), (None if bias is None else bias * g)

    def lossless_settings(self, settings, mode) -> "dict":
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

    def lossless_value(self, head, rows, mode_terms: "dict"):
        return mode_terms.get(self.name)

    def card_row(self, config, stored, hidden_size: "int") -> "str":
        """The logit scale as the weights hold it: a learned scale is described by its saved values (``stored(name)``:
        their (min, max); a lossless start sets g_i = ‖w_i‖, not the configured initial value), the initial value
        only when no weights are saved."""
        kind = config.logit_scale_kind
        if kind == "none":
            return "none"
        saved = stored(self.name) if kind != "fixed" else None
        if saved is not None:
            low, high = saved
            if kind == "scalar":
                return f"one learned g (g = {low:.4g} in these weights)"
            return (
                f"a learned g_i per token (g_i in {low:.4g}–{high:.4g} in these weights; a lossless start sets "
                "g_i = ‖w_i‖ of the source)"
            )
        g = self.start_value(config, hidden_size)
        return {
            "fixed": f"fixed g = {g:.4g}",
            "scalar": f"one learned g (initialized to {g:.4g})",
            "vector": f"a learned g_i per token (initialized to {g:.4g})",
        }[kind]


class LogitBiasTerm(HeadTerm):
    """b: a learned (V,) bias added to the scores after the scale, zero at first."""

    name, help, init = "logit_bias", "the learned per-token logit bias b: logit_bias true", 0.0
    config_fields = ("logit_bias",)
    row_scaled = True

    def is_on(self, settings) -> "bool":
        return settings.logit_bias

    def setting(self, settings) -> "str":
        return f"logit_bias={settings.logit_bias!r}"

    def check(self, settings) -> "None":
        if not isinstance(settings.logit_bias, bool):
            raise ValueError(f"logit_bias must be True or False, got {settings.logit_bias!r}")

    def fold_into(self, head, scale, bias, rows: "slice", device):
        if head.logit_bias is None:
            return scale, bias
        learned = head.logit_bias[rows].float()
        return scale, (learned if bias is None else bias + learned)

    def lossless_settings(self, settings, mode) -> "dict":
        return {"logit_bias": settings.logit_bias or "logit_bias" in mode.lossless_start}

    def lossless_value(self, head, rows, mode_terms: "dict"):
        return mode_terms.get(self.name)

    def card_row(self, config, stored, hidden_size: "int") -> "str":
        if getattr(config, "logit_bias", False):
            return "a learned b_i per token, added to the scores (zero at initialization)"
        return "none"

    def bias_text(self) -> "str":
        return "logit_bias=True (the learned per-token b)"


BUILTIN_TERMS: "tuple[HeadTerm, ...]" = (add_head_term(LogitScaleTerm()), add_head_term(LogitBiasTerm()))


# ------------------------------ hf_tiednorm/modeling/loss/regularizers.py ---------------------------------------
"""The two loss regularizers of the tied embedding, each returned as its own number.

Projection regularization (Press & Wolf, 2017, "Using the Output Embedding to Improve Language Models", §4):
a matrix P ∈ R^{H×H} is inserted between the decoder output and the tied output embedding, so the logits are
W·(P·h), and λ‖P‖ is added to the loss (the paper uses λ = 0.15). P is initialized to the identity, so a fresh
model scores exactly as without it.

Which norm: the paper writes ‖P‖₂ and calls it the L2 norm; the authors' released TensorFlow code
(ofirpress/UsingTheOutputEmbedding, ``ptb_word_lm_WT_PR.py``) penalizes ``tf.nn.l2_loss(P)``, i.e. the L2 norm
of P's entries. We use that entry-wise reading, unsquared: the Frobenius norm ‖P‖_F. Unsquared, its gradient
λ·P/‖P‖_F has norm λ whatever the width H, so the paper's λ = 0.15 keeps its meaning at any model size
(the squared form would put 0.15·H/2 nats on the identity init: 19 nats at H = 256). It is also cheap
(no SVD per step, unlike the spectral norm) and differentiable everywhere except P = 0.

Weight-norm regularization (Herold, Gao & Ney, 2018, "Improving Neural Language Models with Weight Norm
Initialization and Regularization"): ρ·Σ_k (‖w_k‖ − ν)² over the rows w_k of the output (tied) embedding,
paper values ρ = 1e-3, ν = 2.0. It pulls every row norm towards ν, i.e. it limits the frequency bias that
row norms carry in a tied softmax.
"""


@dataclass
class LossTerms:
    """The terms of a model's ``loss`` (their sum), carried next to it by the model outputs (which inherit these
    fields) and logged one by one by the Trainer. Each is the share of this batch in the accumulated batch, like the
    Trainer-scaled loss; a regularizer that is off is None.

    cross_entropy: the token cross-entropy; projection_penalty / weight_norm_penalty: the two regularizers.
    """

    cross_entropy: "torch.FloatTensor | None" = None
    projection_penalty: "torch.FloatTensor | None" = None
    weight_norm_penalty: "torch.FloatTensor | None" = None


# The loss-term names, in field order: what the Trainer logs and evaluation ignores.
LOSS_TERMS: "tuple[str, ...]" = tuple(field.name for field in fields(LossTerms))


class OutputProjection(nn.Linear):
    """Press & Wolf's projection P (H×H, no bias) applied to the decoder output before the tied head.

    Initialized to the identity (by ``reset_parameters`` and by the model's ``_init_weights``).
    """

    def __init__(self, hidden_size: "int", device=None, dtype=None) -> "None":
        super().__init__(hidden_size, hidden_size, bias=False, device=device, dtype=dtype)

    def reset_parameters(self) -> "None":
        nn.init.eye_(self.weight)


def projection_penalty(projection: "torch.Tensor", strength: "float") -> "torch.Tensor":
    """λ·‖P‖_F in fp32 (see the module docstring for the choice of norm)."""
    return strength * torch.linalg.matrix_norm(projection.float(), ord="fro")


def weight_norm_penalty(weights: "list[torch.Tensor]", strength: "float", target_norm: "float") -> "torch.Tensor":
    """ρ·Σ_k (‖w_k‖ − ν)² in fp32, summed over the rows of every matrix in ``weights``.

    ``weights`` is the output embedding split in one or more matrices (one per band with adaptive softmax);
    rows may have different widths across matrices. A zero row (the padding row) has a zero subgradient.
    """
    total = sum(
        (torch.linalg.vector_norm(w.float(), dim=-1) - target_norm).square().sum() for w in weights
    )
    return strength * total


# ------------------------------ hf_tiednorm/modeling/families/config_fields.py ----------------------------------
"""What the configs' fields are made of: the field types and validators (``@strict`` runs them whenever a field is
set) and ``script_flag``, the metadata that makes a config field a training script's flag."""


TieTopology = Literal["untied", "decoder", "three_way"]
LossImplementation = Literal["auto", "fused", "chunked", "plain"]  # fused_loss.LOSS_IMPLEMENTATIONS
TIE_TOPOLOGIES: tuple[str, ...] = get_args(TieTopology)


@as_validated_field
def positive_finite_field(value: float | None) -> None:
    """> 0 and finite, or None (unset): an inf scale or eps makes the loss nan (inf · 0) or the softmax uniform."""
    if value is not None and not 0 < value < math.inf:
        raise ValueError(f"Value must be > 0 and finite, got {value}")


@as_validated_field
def non_negative_field(value: float | None) -> None:
    """>= 0, or None (unset)."""
    if value is not None and not value >= 0:
        raise ValueError(f"Value must be >= 0, got {value}")


@as_validated_field
def head_mode_field(value: str) -> None:
    """A registered head mode (head_modes.py); the error names the value and the modes this code defines."""
    get_head_mode(value)


def script_flag(help: str, *, finetune: bool = False, new_model_only: bool = False, choices=None) -> dict:
    """The metadata of a config field that the training scripts offer as a flag: its ``help`` text, and whether
    fine-tuning a saved model may change it (``finetune``: a loss weight, which changes no parameter) or only a new
    model takes it (``new_model_only``: applied when the model is built). The one place a field is described:
    ``hf_tiednorm.training.arguments`` derives the scripts' flags and their fine-tuning rules from it. ``choices``:
    the values the flag accepts, for a field whose type is no ``Literal`` (a live sequence such as ``HEAD_MODES`` is
    read when the flag is parsed)."""
    metadata = {"help": help, "finetune": finetune, "new_model_only": new_model_only}
    if choices is not None:
        metadata["choices"] = choices
    return metadata


# Widths and vocabularies must be >= 1 (a zero fails much later, e.g. with ZeroDivisionError), layer counts >= 0.
size_field = positive_int_field
layer_count_field = interval(min=0)


# ------------------------------ hf_tiednorm/modeling/families/configuration.py ----------------------------------
"""Configurations of the model families: Marian-style and BART-style encoder-decoders and a Llama-style causal LM.

Each inherits every architecture field from its HF parent and adds, from mixins listed before the parent (their
fields override the parent's), the fields of the normalized tied head, of the training techniques and, for the two
encoder-decoders, the tie topology and the small model's defaults (the small Multi30k model: joint 8k vocabulary,
d = 256). Validation is transformers 5's: ``@strict`` checks every field's type (``Literal`` choices included) and
range (``validated_field``) whenever it is set, then runs the ``validate_*`` methods on the whole config; a bad value
raises a ``StrictDataclass*ValidationError`` naming the field or validator and the cause.
"""


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormHeadConfigMixin(TwoFileRemoteCodeMixin):
    """Fields of the normalized tied output head: every hf_tiednorm config has them (TiedNormWrappedConfig too)."""

    head_mode: str = head_mode_field(
        default=DEFAULT_HEAD_MODE,
        metadata=script_flag(
            "how the output layer scores token i against the decoder state h (hf_tiednorm/modeling/head/modes.py): "
            f"{head_mode_summaries()}",
            choices=HEAD_MODES,
        ),
    )
    logit_scale_kind: LogitScale = field(default="none", metadata=script_flag(
        "multiplier g on the logits: none, fixed (a constant), scalar or vector (learned, one g per token)"))
    logit_scale_init: float | int | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "g for logit_scale_kind fixed, its initial value for scalar/vector; None: 1 for scalar/vector (the "
            "scale-free head at step 0), sqrt(hidden size) for fixed"
        ),
    )
    logit_bias: bool = field(
        default=False,
        metadata=script_flag(
            "a learned per-token bias b added to the scores, zero at initialization (s_i = g·score_i + b_i): where a "
            "normalized head can keep the unigram prior that the row norms carried"
        ),
    )
    norm_eps: float = positive_finite_field(
        default=1e-6,
        metadata=script_flag("lower bound on the row norms: a row with norm <= norm_eps is dead (score 0, no gradient "
                             "through its norm), so zero rows never divide by zero"),
    )
    loss_implementation: LossImplementation = field(
        default="auto",
        metadata=script_flag(
            "what computes the head's training loss (hf_tiednorm/modeling/loss/policy.py): auto (the fastest "
            "path correct for "
            "the device, dtype and options: a fused linear cross-entropy on the folded weight — liger-kernel on CUDA, "
            "torch's where exact, else the chunked loop — once the logits are large, else the plain one), fused "
            "(always a fused path), chunked (the chunked loop) or plain (the materialized logits). A fused path "
            "returns logits=None in training",
            finetune=True,
        ),
    )
    # Set by a conversion's lossless start (head/lossless_start.py): the per-token g_i / b_i started from the rows'
    # norms (not from logit_scale_init / 0), and tokens added by resize_token_embeddings start the same way.
    lossless_start: bool = False

    def __post_init__(self, **kwargs):  # logit_scale, the old name of logit_scale_kind (TRL reads it as a float)
        super().__post_init__(**renamed_fields_set(self, kwargs))

    def validate_lossless_start(self) -> None:
        if self.lossless_start:
            check_lossless_settings(self)  # the head terms a lossless start of head_mode sets (lossless_start.py)

    @property
    def head_settings(self) -> HeadSettings:
        """The head's settings as the one value a head is built from (head/settings.py)."""
        return HeadSettings.from_config(self)

    @property
    def head_options(self) -> HeadSettings:
        """``head_settings`` under its name in 0.1 (a FutureWarning; removed in the next release)."""
        warnings.warn("config.head_options is renamed config.head_settings", FutureWarning, stacklevel=2)
        return self.head_settings

    def validate_head_settings(self) -> None:
        HeadSettings.from_config(self)  # every check of the head's settings, once (head/settings.py)


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormTechniquesConfigMixin:
    """Fields of the training techniques that hf_tiednorm's own families implement in their forward and loss
    (label smoothing, the chunked loss, both regularizers, the initializations, adaptive input/softmax). A wrapped
    model (TiedNormWrappedConfig) trains with its architecture's own loss and refuses them."""

    # The Trainer's evaluation collects every other output field as predictions; the loss terms are scalars.
    keys_to_ignore_at_inference = ["cache", "past_key_values", *LOSS_TERMS]  # the KV cache's names since / before 5.24

    label_smoothing: float | int = interval(min=0, max=1, exclude_max=True)(
        default=0.0,
        metadata=script_flag(
            "label smoothing of the model's own cross-entropy (set here rather than in the Trainer's "
            "--label_smoothing_factor, so that the regularizer terms of the model's loss are kept)",
            finetune=True,
        ),
    )
    loss_chunk_size: int | None = positive_int_field(
        default=None,
        metadata=script_flag(
            "tokens per chunk of the chunked training loss, which never materializes the (tokens × V) logits "
            "(hf_tiednorm/modeling/loss/chunked.py; the forward then returns logits=None): set, it picks the "
            "chunked loop "
            "under loss_implementation auto; None: the chunked loop's default size",
            finetune=True,
        ),
    )
    projection_regularization: float | int | None = non_negative_field(
        default=None,
        metadata=script_flag(
            "Press & Wolf's projection P (H×H, identity init) between the decoder output and the tied head, with "
            "penalty λ·‖P‖_F (paper: λ = 0.15; 0: P unregularized; None: no P; "
            "hf_tiednorm/modeling/loss/regularizers.py). "
            "Fine-tuning may change λ of a model trained with P, never add P",
            finetune=True,
        ),
    )
    weight_norm_regularization: float | int = non_negative_field(
        default=0.0,
        metadata=script_flag(
            "Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² over the output embedding rows "
            "(paper: ρ = 1e-3; 0: off)",
            finetune=True,
        ),
    )
    weight_norm_target: float | int = positive_finite_field(
        default=2.0,
        metadata=script_flag("ν, the row norm the weight-norm regularization pulls towards (paper: 2)", finetune=True),
    )
    embedding_init_std: float | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "std of a new model's token embeddings (and untied output matrix); None: the parent's init_std (0.02). "
            "The paper's fairseq init is d**-0.5 (row norms ≈ 1 instead of 0.02·√d), e.g. 0.0625 at d = 256; "
            "square mode (scores w·h/‖w‖²) needs it. The padding row stays zero"
        ),
    )
    # The config records σ once hf_tiednorm.training.weight_norm_init_ has rescaled the embedding (None: not applied).
    weight_norm_init_sigma: float | int | None = positive_finite_field(
        default=None,
        metadata=script_flag(
            "Herold et al.'s weight-norm initialization: a new model's embedding rows get norm σ·log(count), counts "
            "from the tokenized training data; None: HF's random init",
            new_model_only=True,
        ),
    )
    adaptive_cutoffs: list[int] | None = field(
        default=None,
        metadata=script_flag(
            "adaptive input + tied adaptive softmax (Baevski & Auli, 2019): increasing token ids c_1 < … < c_n-1 < V "
            "that split the frequency-ordered vocabulary into bands, such as 2000 6000 (encoder-decoders: "
            "tie_topology three_way); None: plain embedding"
        ),
    )
    adaptive_div_value: float | int = interval(min=1)(
        default=4.0, metadata=script_flag("k of the adaptive bands: band i has width d // k**i")
    )
    adaptive_tie_projections: bool = field(
        default=True,
        metadata=script_flag(
            "tie each adaptive band's output projection to its input projection too (else only the band rows)"
        ),
    )

    def validate_loss_chunk_size(self) -> None:
        # Refused, not ignored (issue 48): the plain path and the adaptive softmax materialize the logits, never chunk.
        if self.loss_chunk_size is not None and (self.loss_implementation == "plain" or self.adaptive_cutoffs):
            reader = "the adaptive softmax" if self.adaptive_cutoffs else "loss_implementation='plain'"
            raise ValueError(
                f"loss_chunk_size={self.loss_chunk_size} (the chunks of the chunked loss of the plain head) does not "
                f"apply to {reader} (which materializes the logits and never chunks): it would be ignored; leave "
                "loss_chunk_size unset (null), or use loss_implementation 'chunked' / 'auto' without adaptive_cutoffs"
            )

    def validate_row_norm_techniques(self) -> None:
        uses_row_norms = self.weight_norm_regularization > 0 or self.weight_norm_init_sigma is not None
        if uses_row_norms and not get_head_mode(self.head_mode).keeps_row_norms:
            raise ValueError(
                "weight_norm_regularization / weight_norm_init_sigma act on row norms, which "
                f"head_mode={self.head_mode!r} removes from both the input lookups and the scores; use another "
                "head_mode or leave them unset"
            )

    def validate_adaptive_cutoffs(self) -> None:
        cutoffs, vocab_size = self.adaptive_cutoffs, self.vocab_size
        if cutoffs is None:
            return
        if not cutoffs or cutoffs != sorted(set(cutoffs)) or cutoffs[0] <= 0 or cutoffs[-1] >= vocab_size:
            raise ValueError(
                f"adaptive_cutoffs must be strictly increasing ints in [1, vocab_size - 1] = [1, {vocab_size - 1}] so "
                f"that the bands [0, c_1), ..., [c_n-1, {vocab_size}) are non-empty and cover the vocabulary exactly; "
                f"got {cutoffs}"
            )
        if int(self.hidden_size // self.adaptive_div_value ** len(cutoffs)) < 1:
            raise ValueError(
                f"the last of {len(cutoffs) + 1} adaptive bands would have width {self.hidden_size} // "
                f"{self.adaptive_div_value}^{len(cutoffs)} < 1; use fewer adaptive_cutoffs or a smaller "
                "adaptive_div_value"
            )
        if self.adaptive_tie_projections and not self.tie_word_embeddings:
            raise ValueError(
                "adaptive_tie_projections=True ties the output projections to the input ones, but the output layer "
                "is untied from the input embedding; tie the embeddings or set adaptive_tie_projections=False"
            )
        if self.embedding_init_std is not None:
            raise ValueError(
                "embedding_init_std initializes the plain token embedding; the adaptive bands keep their own init: "
                "leave one of embedding_init_std / adaptive_cutoffs unset"
            )
        if self.loss_implementation in ("fused", "chunked"):
            raise ValueError(
                f"loss_implementation={self.loss_implementation!r} (a fused loss of the plain head) does not apply to "
                "the adaptive softmax; set loss_implementation='auto' or 'plain', or leave adaptive_cutoffs unset"
            )


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TieTopologyConfigMixin:
    """Which embeddings of an encoder-decoder share one matrix (Press & Wolf, 2017, Section 5), for both
    encoder-decoder families:

      * ``"three_way"``: encoder input = decoder input = output embedding; needs one shared vocabulary;
      * ``"decoder"``: decoder input = output embedding, the encoder has its own (``decoder_vocab_size`` may differ);
      * ``"untied"``: three separate matrices (the head mode still applies to the output matrix).

    ``tie_word_embeddings`` and ``share_encoder_decoder_embeddings`` follow from ``tie_topology``; passing values
    that contradict it is an error.
    """

    # Where the family's models keep their embeddings (module paths from the LM; families/tie_topology.py reads them):
    # the shared matrix of a three-way tie, and the encoder's and decoder's token embeddings. Class attributes, no
    # fields.
    shared_embedding_path = "model.shared"
    stack_embedding_paths = ("model.encoder.embed_tokens", "model.decoder.embed_tokens")

    # Which embeddings share one matrix: one of TIE_TOPOLOGIES.
    tie_topology: TieTopology = "three_way"
    # Vocabulary of the decoder input and the output layer when it differs from the encoder's; None = vocab_size.
    decoder_vocab_size: int | None = size_field(default=None)
    # Derived from tie_topology when left unset (the HF parents default both to True).
    tie_word_embeddings: bool | None = None
    share_encoder_decoder_embeddings: bool | None = None

    def _implied_tie_flags(self) -> dict[str, bool]:
        return {
            "tie_word_embeddings": self.tie_topology != "untied",
            "share_encoder_decoder_embeddings": self.tie_topology == "three_way",
        }

    def __post_init__(self, **kwargs):
        for name, value in self._implied_tie_flags().items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        if self.decoder_vocab_size is None:
            self.decoder_vocab_size = self.vocab_size
        super().__post_init__(**kwargs)

    def validate_tie_topology(self) -> None:
        for name, value in self._implied_tie_flags().items():
            if getattr(self, name) != value:
                raise ValueError(
                    f"{name}={getattr(self, name)} contradicts tie_topology={self.tie_topology!r} (which implies "
                    f"{value}); set tie_topology to one of {TIE_TOPOLOGIES} and leave {name} unset"
                )
        if self.tie_topology == "three_way" and self.decoder_vocab_size != self.vocab_size:
            raise ValueError(
                f"tie_topology='three_way' needs one shared vocabulary, but decoder_vocab_size="
                f"{self.decoder_vocab_size} != vocab_size={self.vocab_size}; use tie_topology='decoder' or 'untied'"
            )
        if self.adaptive_cutoffs is not None and self.tie_topology != "three_way":
            raise ValueError(
                f"adaptive_cutoffs needs tie_topology='three_way' (one adaptive embedding shared by encoder, decoder "
                f"and output layer), got tie_topology={self.tie_topology!r}"
            )


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class SmallEncoderDecoderConfigMixin:
    """The sizes and special tokens both encoder-decoder families default to: the small Multi30k model and the
    tokenizer hf_tiednorm trains (BART-large instead: d = 1024, 12 + 12 layers, 16 heads, FFN 4096, 50265 tokens)."""

    # Joint subword vocabulary (source and target) of the encoder; the decoder's unless decoder_vocab_size is set.
    vocab_size: int = size_field(default=8000)
    # Longest sequence the position table covers (Marian's is sinusoidal, BART's learned).
    max_position_embeddings: int = size_field(default=256)
    # Model width d; also the embedding size, so embeddings and hidden states live in one space.
    d_model: int = size_field(default=256)
    encoder_layers: int = layer_count_field(default=3)
    encoder_ffn_dim: int = size_field(default=1024)
    encoder_attention_heads: int = size_field(default=4)
    decoder_layers: int = layer_count_field(default=3)
    decoder_ffn_dim: int = size_field(default=1024)
    decoder_attention_heads: int = size_field(default=4)
    # Special token ids of the tokenizer that hf_tiednorm trains: <pad>=0, <s>=1, </s>=2, <unk>=3 (BART's own: <s>=0,
    # <pad>=1, decoding starts with </s> and is forced to end with it).
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int | None = 1
    forced_eos_token_id: int | list[int] | None = None


@strict
class TiedNormSeq2SeqConfig(
    SmallEncoderDecoderConfigMixin,
    TieTopologyConfigMixin,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    MarianConfig,
):
    """A Marian-style encoder-decoder (sinusoidal positions) whose output layer is the normalized tied head."""

    model_type = "tiednorm_seq2seq"

    # Multiply embeddings by sqrt(d) as in Vaswani et al. (Marian's default for trained-from-scratch models).
    scale_embedding: bool = True


@strict
class TiedNormBartConfig(
    SmallEncoderDecoderConfigMixin,
    TieTopologyConfigMixin,
    TiedNormHeadConfigMixin,
    TiedNormTechniquesConfigMixin,
    BartConfig,
):
    """A BART-style encoder-decoder (learned positions, embedding LayerNorm) whose output layer is the normalized
    tied head; the family that BART checkpoints convert to. ``scale_embedding`` keeps BART's default (False)."""

    model_type = "tiednorm_bart"


@strict
class TiedNormCausalConfig(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin, LlamaConfig):
    """A Llama-style decoder-only LM whose output layer is the normalized tied head."""

    model_type = "tiednorm_causal"
    # Where its models keep the token embedding (module path from the LM; families/tie_topology.py reads it). No field.
    input_embedding_path = "model.embed_tokens"

    vocab_size: int = size_field(default=8000)
    hidden_size: int = size_field(default=256)
    # Width of the SwiGLU feed-forward block.
    intermediate_size: int = size_field(default=768)
    num_hidden_layers: int = layer_count_field(default=4)
    num_attention_heads: int = size_field(default=4)
    max_position_embeddings: int = size_field(default=512)
    pad_token_id: int | None = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    # Input embedding = output embedding (Press & Wolf, 2017). False gives the untied control.
    tie_word_embeddings: bool = True


# ------------------------------ hf_tiednorm/modeling/families/configuration_wrapped.py --------------------------
"""Configuration of a normalized tied head around any transformers causal LM or encoder-decoder.

``TiedNormWrappedConfig`` holds the wrapped model's own config as ``text_config`` (a config of a native
``transformers`` model: gpt2, qwen3, gemma2, t5, m2m_100, ...) next to the fields of the normalized tied head. Every
attribute the wrapper config does not define itself (``vocab_size``, ``hidden_size``, ``max_position_embeddings``,
``decoder_start_token_id``, ``tie_word_embeddings``, ...) is read from ``text_config``, so code written for the
wrapped architecture reads the wrapper's config unchanged.
"""


try:  # transformers >= 5.20 declares a composite config's parts with SubConfigSpec
    from transformers.configuration_utils import SubConfigSpec
except ImportError:  # 5.17-5.19 (the lowest setup.cfg declares): a plain {name: config class} dict, `sub_configs`
    SubConfigSpec = None


# Fields of hf_tiednorm's own families that a wrapped model has no code for: it trains with the wrapped model's own
# loss and head, so accepting them would silently ignore them. Refused by name however they arrive: in config.json,
# as from_pretrained keyword arguments, or set as attributes.
OWN_FAMILY_FIELDS = (*(field.name for field in fields(TiedNormTechniquesConfigMixin)), "tie_topology")

# The settings of what a forward returns, defined by every PreTrainedConfig: set on the wrapper, they are set on the
# wrapped model's config too, whose forward reads them.
OUTPUT_SETTINGS = ("output_hidden_states", "output_attentions", "return_dict")


def refuse_own_family_fields(names, how: str) -> None:
    """``ValueError`` naming the own-family fields among ``names`` (``how``: where they were given)."""
    unsupported = sorted(set(names) & set(OWN_FAMILY_FIELDS))
    if unsupported:
        hint = (" (label smoothing: the Trainer's label_smoothing_factor / --label_smoothing_factor applies it to a "
                "wrapped model)" if "label_smoothing" in unsupported else "")
        raise ValueError(
            f"{unsupported} are fields of hf_tiednorm's own model families ({how}); a wrapped model (any "
            "architecture, trained with its own loss) has no code for them, so they would be ignored: drop them, or, "
            f"for a marian/bart/llama source, convert without --generic to get the own family{hint}"
        )


@strict
class TiedNormWrappedConfig(TiedNormHeadConfigMixin, PreTrainedConfig):
    r"""
    text_config (`dict` or `PreTrainedConfig`):
        The config of the wrapped model (its ``model_type`` selects the architecture); it must tie its output layer to
        its input embedding (``tie_word_embeddings=True``).

    The head fields (``head_mode``, ``logit_scale_kind``, ``logit_scale_init``, ``logit_bias``, ``norm_eps``) are
    ``TiedNormHeadConfigMixin``'s; ``head_mode="baseline"`` computes exactly the wrapped model's logits.
    """

    model_type = "tiednorm_wrapped"
    # The wrapped model's config is a sub-config, as in HF's composite models: get_text_config() returns it, and the
    # attention implementation chosen for the wrapper is set on it too (PreTrainedConfig's own propagation). Its class
    # follows text_config's model_type (AutoConfig); "llama" is only the spec's nominal default, never built: a
    # text_config without model_type is refused below.
    if SubConfigSpec is not None:
        sub_configs_defaults = {"text_config": SubConfigSpec(config_class=AutoConfig, model_type="llama")}
    else:
        sub_configs = {"text_config": AutoConfig}

    text_config: dict | PreTrainedConfig | None = None

    def __post_init__(self, **kwargs):
        refuse_own_family_fields(kwargs, "given to TiedNormWrappedConfig or read from its config.json")
        if self.text_config is None:
            raise ValueError("text_config is required: the config (or config dict) of the model to wrap")
        if isinstance(self.text_config, dict):
            fields = dict(self.text_config)
            if "model_type" not in fields:
                raise ValueError("text_config needs a model_type (e.g. 'gpt2', 't5') to choose the architecture")
            self.text_config = AutoConfig.for_model(fields.pop("model_type"), **fields)
        if self.text_config.model_type.startswith("tiednorm"):
            raise ValueError(
                f"text_config is already an hf_tiednorm config ({self.text_config.model_type!r}); its head is "
                "normalized already: set its head_mode instead of wrapping it"
            )
        # PreTrainedConfig defines is_encoder_decoder itself (default False), so it would not fall through.
        self.is_encoder_decoder = self.text_config.is_encoder_decoder
        inner_attention = self.text_config._attn_implementation  # that of an adopted model's live config
        super().__post_init__(**kwargs)
        if kwargs.get("attn_implementation") is None:  # PreTrainedConfig set None on every sub-config: restore it
            self._attn_implementation = inner_attention
        for name in OUTPUT_SETTINGS:  # what the wrapper was given reaches the wrapped model (a default is no choice)
            if getattr(self, name) != getattr(PreTrainedConfig, name, None):
                setattr(self.text_config, name, getattr(self, name))

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any):
        # from_pretrained(folder, loss_chunk_size=16) hands such keywords here; unknown to the config, they would
        # reach the model's __init__ as a bare TypeError.
        refuse_own_family_fields(kwargs, "from_pretrained keyword arguments")
        return super().from_dict(config_dict, **kwargs)

    def __getattr__(self, name: str) -> Any:
        # Called only when normal lookup fails: fall through to the wrapped model's config. Private names and
        # text_config itself (absent while the config is being built or copied) are never delegated.
        text_config = self.__dict__.get("text_config")
        if name.startswith("_") or text_config is None or isinstance(text_config, dict):
            raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
        return getattr(text_config, name)

    def _get_generation_parameters(self) -> dict[str, Any]:
        # Only this config's own entries: the wrapped config's fields (BART's forced_eos_token_id) reach the check
        # through __getattr__ but are saved, legitimately, inside text_config.
        return {k: v for k, v in super()._get_generation_parameters().items() if k in self.__dict__}

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_own_family_fields([name], "set as an attribute")
        if name == "text_config":
            drop_source_auto_map(value)  # the folder's auto_map is the wrapper's own (modeling/auto_map.py)
        # An attribute of the wrapped architecture (use_cache, vocab_size, ...) is set where its model reads it; an
        # output setting both here and there (the wrapped model's forward reads its own config).
        text_config = self.__dict__.get("text_config")
        if name in OUTPUT_SETTINGS and isinstance(text_config, PreTrainedConfig):
            setattr(text_config, name, value)
        if (
            isinstance(text_config, PreTrainedConfig)
            and not name.startswith("_")
            and name not in self.__dataclass_fields__
            and not hasattr(type(self), name)
            and hasattr(text_config, name)
        ):
            setattr(text_config, name, value)
            return
        super().__setattr__(name, value)
