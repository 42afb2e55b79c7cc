"""What a registered head mode returns is checked, not trusted (``register_head_mode`` wraps the mode's
``column_terms`` and ``lossless_terms`` with these checks and runs them on a probe; the conversion's lossless start
verifies a start on the weights it converts):

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
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from ..modeling.head.terms import MODE_LOSSLESS_TERMS

ColumnTerms = tuple["torch.Tensor | None", "torch.Tensor | None"]

# A lossless start may be off by this fraction of a row's score scale (‖w_i‖ + |g_i·bias_i| + |b_i|), plus eps: fp32
# rounding of g_i·scale_i is ~1e-7, a bias the start forgets is of the order of the bias itself.
LOSSLESS_RTOL = 1e-5
COLUMN_TERM_NAMES = ("scale", "bias")
LOSSLESS_TERM_NAMES = tuple(f"{name} {symbol}" for name, symbol in zip(MODE_LOSSLESS_TERMS, "gb", strict=True))


def check_terms(mode_name: str, method: str, terms, weight: torch.Tensor, names=COLUMN_TERM_NAMES) -> ColumnTerms:
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


def check_lossless(mode, weight: torch.Tensor, eps: float, g, b) -> None:
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


def checked_column_terms(method: Callable) -> Callable:
    """``method`` (a ``column_terms``) with its result checked by ``check_terms``."""
    if getattr(method, "_checked_terms", False):
        return method

    @functools.wraps(method)
    def column_terms(self, weight, eps, *args, **kwargs):
        return check_terms(self.name, "column_terms", method(self, weight, eps, *args, **kwargs), weight)

    column_terms._checked_terms = True
    return column_terms


def checked_lossless_terms(method: Callable) -> Callable:
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


def probe_head_mode(mode) -> None:
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


__all__ = [
    "LOSSLESS_RTOL",
    "check_lossless",
    "check_terms",
    "checked_column_terms",
    "checked_lossless_terms",
    "probe_head_mode",
]
