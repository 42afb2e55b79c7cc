"""The configuration fields every hf_tiednorm model shares: the normalized tied head's (``TiedNormHeadConfigMixin``,
the wrapper's too) and the training techniques' (``TiedNormTechniquesConfigMixin``), listed before a family's HF parent
config. ``@strict`` checks each field's type and range when set, then the ``validate_*`` methods; the head mode's math
is checked where the model is built."""

from dataclasses import dataclass

from ..code_writer import SavesItsCode
from ..head.settings import DEFAULT_HEAD_MODE, RENAMED_FIELDS, HeadSettings, LogitScale, renamed_value
from .config_fields import LossImplementation, head_mode_field, positive_finite_field


@dataclass(init=False, repr=False, eq=False, kw_only=True)
class TiedNormHeadConfigMixin(SavesItsCode):
    """Fields of the normalized tied output head (docs/head.md): ``HeadSettings``' fields, the loss path, and whether
    a conversion started the head's terms losslessly."""

    # How the output layer scores token i against h: baseline w_i·h, l2, square, distance, cosine (head/modes.py).
    head_mode: str = head_mode_field(default=DEFAULT_HEAD_MODE)
    # A multiplier g on the logits: none, fixed (a constant), scalar or vector (learned, one g_i per token).
    logit_scale_kind: LogitScale = "none"
    # g for "fixed", the first g for "scalar"/"vector"; None: 1 when learned, sqrt(hidden size) when fixed.
    logit_scale_init: float | int | None = positive_finite_field(default=None)
    # A learned per-token bias b added to the scores (s_i = g·score_i + b_i), zero at first.
    logit_bias: bool = False
    # A row with norm <= norm_eps is dead: it scores 0 and gets no gradient through its norm.
    norm_eps: float = positive_finite_field(default=1e-6)
    # What computes the training loss: auto, fused, chunked or plain (loss/policy.py).
    loss_implementation: LossImplementation = "auto"
    # Set by a conversion's lossless start: g_i / b_i started from the rows' norms, and so are a resize's new tokens.
    lossless_start: bool = False

    def __post_init__(self, **kwargs):
        for old, new in RENAMED_FIELDS.items():  # config.json or a keyword under a field's old name
            if old in kwargs:
                setattr(self, new, renamed_value(old, kwargs.pop(old), getattr(self, new), "config field", 4))
        super().__post_init__(**kwargs)

    @property
    def head_settings(self) -> HeadSettings:
        """The head's settings as the one value a head is built from (head/settings.py)."""
        return HeadSettings.from_config(self)

    def validate_head_settings(self) -> None:
        HeadSettings.from_config(self)  # every check of the head's settings, once (head/settings.py)


__all__ = ["TiedNormHeadConfigMixin"]
