"""The model card's rows of the head's learned terms: the logit scale g and bias b as the weights hold them, and the
line of each term added from outside (``ExtraHeadTerm.card``)."""

from __future__ import annotations

from pathlib import Path

from safetensors import safe_open

from ..modeling.families.table import family_of_config
from ..modeling.head.settings import HeadSettings
from ..modeling.head.terms import active_terms, default_logit_scale, head_terms


def term_rows(config, folder: Path | None = None) -> tuple[dict, list]:
    """The card's rows of the head's learned terms (``_BUILT_IN_ROWS``, an added term's ``card``): the built-ins' by
    name (the template's own rows), and (name, text) of each registered term the config switches on. A learned term
    is described by its saved values where ``folder`` holds them."""
    hidden_size = family_of_config(config).head_hidden_size(config)

    def stored(name: str) -> tuple[float, float] | None:
        return _stored_range(folder, f".{name}") if folder is not None else None

    settings = HeadSettings.from_config(config)
    built_in = {t.name: _BUILT_IN_ROWS[t.name](config, stored, hidden_size) for t in head_terms() if t.config_fields}
    added = [(t.name, t.card) for t in active_terms(settings) if not t.config_fields]  # ExtraHeadTerm.card
    return built_in, added


def _logit_scale_row(config, stored, hidden_size: int) -> str:
    """The logit scale as the weights hold it: a learned scale by its saved values (``stored(name)``: their (min,
    max); a lossless start sets g_i = ‖w_i‖, not the configured initial value), the initial value only without
    weights."""
    kind = config.logit_scale_kind
    if kind == "none":
        return "none"
    saved = stored("logit_scale") if kind != "fixed" else None
    if saved is not None:
        low, high = saved
        if kind == "scalar":
            return f"one learned g (g = {low:.4g} in these weights)"
        return (
            f"a learned g_i per token (g_i in {low:.4g}–{high:.4g} in these weights; a lossless start sets "
            "g_i = ‖w_i‖ of the source)"
        )
    g = config.logit_scale_init if config.logit_scale_init is not None else default_logit_scale(kind, hidden_size)
    return {
        "fixed": f"fixed g = {g:.4g}",
        "scalar": f"one learned g (initialized to {g:.4g})",
        "vector": f"a learned g_i per token (initialized to {g:.4g})",
    }[kind]


# The card's row of each built-in learned term (head/terms.py), by name: (config, stored, hidden size) -> text.
_BUILT_IN_ROWS = {
    "logit_scale": _logit_scale_row,
    "logit_bias": lambda config, stored, hidden_size: (
        "a learned b_i per token, added to the scores (zero at initialization)" if config.logit_bias else "none"),
}


def _stored_range(folder: Path, suffix: str) -> tuple[float, float] | None:
    """(min, max) of the saved tensor whose name ends with ``suffix`` (e.g. the learned logit scale), or None."""
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as weights:
            for name in weights.keys():  # noqa: SIM118 (safe_open is no dict)
                if name.endswith(suffix):
                    tensor = weights.get_tensor(name).float()
                    return tensor.min().item(), tensor.max().item()
    return None


__all__ = ["term_rows"]
