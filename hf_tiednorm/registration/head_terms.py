"""Adding a learned head term: ``register_head_term`` checks its name against everything it could shadow.

A term's name becomes a parameter of the head (``lm_head.<name>``), a state-dict key and a converter flag, so it must
be a Python identifier not starting with ``_`` that the head does not hold already: a parameter set over
``norm_eps`` changed the logits by 1.77 at its neutral init, with no error. The registry itself (``HEAD_TERMS``)
belongs to the modeling code; a folder's own code never registers a term, and refuses a config naming one it lacks.
"""

from __future__ import annotations

import dataclasses
import keyword

from ..modeling.head.layer import TiedNormHead
from ..modeling.head.settings import HEAD_TERMS, RENAMED_FIELDS, HeadSettings
from ..modeling.head.terms import ExtraHeadTerm, HeadTerm


def taken_head_names() -> frozenset[str]:
    """What a term's parameter must not replace: every name a ``TiedNormHead`` holds (attributes, methods,
    parameters; a built-in term's name even when it is off) and every ``HeadSettings`` field, old names included."""
    head = TiedNormHead(2, 3, settings=HeadSettings(), device="meta")
    fields = {f.name for f in dataclasses.fields(HeadSettings)} | set(RENAMED_FIELDS)
    return frozenset({*dir(head), *vars(head), *fields})


def register_head_term(term: ExtraHeadTerm) -> ExtraHeadTerm:
    """Make ``term`` available to every head, config (``extra_terms``), converter flag (``--<name>``), export and
    card; returns it. ``ValueError`` naming the name and the rule it breaks, ``TypeError`` for no ``HeadTerm``."""
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
    if term.config_fields:  # the configs declare the built-ins' fields only
        raise ValueError(
            f"head term {name!r} (register_head_term) declares config_fields {term.config_fields}, which no "
            "config has: a term added from outside is switched on by naming it in extra_terms; leave config_fields ()"
        )
    if name in taken_head_names():
        raise ValueError(
            f"head term name {name!r} (register_head_term) is taken by the head itself (an attribute, method "
            "or setting of TiedNormHead): its parameter would replace it; register the term under another name"
        )
    HEAD_TERMS[name] = term
    return term


def switched_terms() -> tuple[str, ...]:
    """The names of the registered terms a model switches on by naming them in ``extra_terms``."""
    return tuple(name for name, term in HEAD_TERMS.items() if not term.config_fields)


__all__ = ["register_head_term", "switched_terms", "taken_head_names"]
