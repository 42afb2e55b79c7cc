"""The head modes (Liu, Zhai & Chen 2020): one object per mode, holding everything the mode *is*, so that no other
module compares a mode's name. Each scores ``s = (W·h) * scale + bias`` with vocabulary-sized (scale, bias) made of
the rows' norms: one matmul plus O(V) work per decoding step, no normalized copy of W. A saved config records the
mode's name only; a name this code does not define is refused (``get_head_mode``). (docs/code_notes.md)"""

from __future__ import annotations

import torch

from .folded_weight import squared_row_norms
from .settings import BUILTIN_HEAD_MODES, HEAD_MODE_REGISTRY, check_head_mode
from .terms import MODE_LOSSLESS_TERMS

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


__all__ = ["HeadMode", "get_head_mode", "inverse_row_norms", "unit_rows"]
