"""The command-line flags of config fields, made from their descriptions (``field_help.py``): the training scripts'
model flags (``hf_tiednorm.training.arguments``) and the converter's head flags (``tiednorm-convert``:
``add_head_setting_flags``), so a head term described once is a flag of both with nothing else to edit.
"""

from __future__ import annotations

import argparse
import dataclasses
import warnings
from types import UnionType
from typing import Any, Literal, Optional, Union, get_args, get_origin, get_type_hints

from ..modeling.families.configuration import TiedNormHeadConfigMixin
from ..modeling.head.settings import HEAD_TERMS, RENAMED_FIELDS, HeadSettings
from ..registration.head_terms import switched_terms
from .field_help import flag_of

# A renamed field's flag keeps its old name as an alias, so command lines written before the rename still run,
# with a FutureWarning naming the new flag (RenamedFlagAction).
_OLD_NAMES = {new: old for old, new in RENAMED_FIELDS.items()}


def old_flags(name: str) -> list[str]:
    """The flags of config field ``name``'s old name (``--logit_scale`` and ``--logit-scale`` for
    ``logit_scale_kind``), as a release before the rename spelled them; [] for a field never renamed."""
    old = _OLD_NAMES.get(name)
    return [] if old is None else list(dict.fromkeys((f"--{old}", f"--{old.replace('_', '-')}")))


class RenamedFlagAction(argparse._StoreAction):
    """Stores a renamed field's flag; given under an old name (``old_flags``), it warns (FutureWarning) with the
    new flag, as a config.json under the old field name does (head/terms.py)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        if option_string in old_flags(self.dest):
            new, old = self.option_strings[0], _OLD_NAMES[self.dest]
            warnings.warn(
                f"the flag {option_string} is renamed {new} (TRL, vLLM and transformers read config.{old} as a float "
                f"multiplier of the logits); reading {option_string} {values} as {new} {values}. Write "
                f"{new}; the old flag will stop working in a future release",
                FutureWarning,
                stacklevel=2,
            )
        super().__call__(parser, namespace, values, option_string)


def flag_type(annotation: Any) -> Any:
    """The flag type of a config field's type, optional: HfArgumentParser takes ``X | None`` only, so a config's
    ``float | int`` is a float flag; a ``Literal`` is a str flag whose value the config checks (its error names the
    field and the choices, which the help lists)."""
    kinds = [arg for arg in get_args(annotation) if arg is not type(None)]
    if get_origin(annotation) not in (Union, UnionType):
        kinds = [annotation]
    if set(kinds) == {float, int}:
        kinds = [float]
    (kind,) = kinds
    if get_origin(kind) is Literal:
        kind = str
    return Optional[kind]  # noqa: UP045 (list[int] | None would need a runtime union of a generic alias)


def flag_help(config_field: dataclasses.Field, annotation: Any, default: str | None = None) -> str:
    """The help of a config-field flag: the field's help (``field_help.flag_of``), its choices (a ``Literal`` type)
    and the config's default (the flag's own default, None, keeps it)."""
    kinds = [arg for arg in get_args(annotation) if get_origin(arg) is Literal] or [annotation]
    choices = get_args(kinds[0]) if get_origin(kinds[0]) is Literal else ()
    listed = f"; one of {', '.join(choices)}" if choices else ""
    if "choices" in flag_of(config_field):  # a registry read at parse time (the head modes): argparse lists it
        listed = "; one of %(choices)s"
    default = f"{config_field.default}, the config's" if default is None else default
    renamed = old_flags(config_field.name)
    if renamed:  # argparse formats the help with %: a literal % would not survive
        listed += f"; {' / '.join(renamed)}: its old name, deprecated (FutureWarning)"
    return f"{flag_of(config_field)['help']}{listed} (default: {default})"


def flag_metadata(config_field: dataclasses.Field, annotation: Any) -> dict[str, Any]:
    """The HfArgumentParser metadata of a config-field flag: its help, its ``choices`` when the field names them, and
    the flag of its old name (``--logit_scale`` for ``--logit_scale_kind``) as an alias."""
    metadata = {"help": flag_help(config_field, annotation)}
    if "choices" in flag_of(config_field):
        metadata["choices"] = flag_of(config_field)["choices"]
    if config_field.name in _OLD_NAMES:
        metadata["aliases"] = old_flags(config_field.name)
        metadata["action"] = RenamedFlagAction
    return metadata


def head_setting_fields() -> list[tuple[dataclasses.Field, Any]]:
    """(config field, its type) of every ``HeadSettings`` field, as ``TiedNormHeadConfigMixin`` declares it."""
    fields = {f.name: f for f in dataclasses.fields(TiedNormHeadConfigMixin)}
    types = get_type_hints(TiedNormHeadConfigMixin)
    return [(fields[name], types[name]) for name in HeadSettings.field_names()]


def add_head_setting_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--dashed-name`` flag per ``HeadSettings`` field (``--head-mode``, ..., ``--norm-eps``), with the field's
    help, choices and default: a bool field is a switch, every other flag's default is the config's."""
    for config_field, annotation in head_setting_fields():
        flags = [f"--{config_field.name.replace('_', '-')}", *old_flags(config_field.name)]
        metadata = flag_metadata(config_field, annotation)
        if annotation is bool or annotation == "bool":
            parser.add_argument(*flags, action="store_true", help=flag_help(config_field, annotation, "off"))
            continue
        metadata["help"] = flag_help(config_field, annotation, "%(default)s")
        kind = get_args(flag_type(annotation))[0]
        literal = [arg for arg in (*get_args(annotation), annotation) if get_origin(arg) is Literal]
        choices = metadata.get("choices") or (get_args(literal[0]) if literal else None)
        parser.add_argument(*flags, type=kind, default=config_field.default, choices=choices, help=metadata["help"],
                            action=metadata.get("action", "store"))


def add_extra_term_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--dashed-name`` switch per registered head term (hf_tiednorm.register_head_term), added after
    every other flag of ``parser``: a name whose flag or destination ``parser`` has already (``--generic``, the
    ``output_dir`` argument) is refused naming the term, since the switch would be shadowed or read the other
    argument's value."""
    taken = {action.dest: action for action in parser._actions}
    for option in map(HEAD_TERMS.get, switched_terms()):  # a built-in term's flags are its config fields'
        flag = f"--{option.name.replace('_', '-')}"
        clash = taken.get(option.name) or parser._option_string_actions.get(flag)
        if clash is not None:
            raise ValueError(
                f"head term {option.name!r} (register_head_term) would be the flag {flag} of {parser.prog}, "
                f"which already has {'/'.join(clash.option_strings) or clash.dest}; register the term under "
                "another name"
            )
        # An identifier name (register_head_term) is its flag's destination: head_settings_from_flags reads it.
        parser.add_argument(flag, action="store_true", help=f"{option.help} (default: off)")


def head_settings_from_flags(args: argparse.Namespace) -> HeadSettings:
    """The ``HeadSettings`` of the flags ``add_head_setting_flags`` and ``add_extra_term_flags`` added (checked
    once, as every HeadSettings is)."""
    extra = tuple(name for name in switched_terms() if getattr(args, name) is True)
    return HeadSettings(**{name: getattr(args, name) for name in HeadSettings.field_names()}, extra_terms=extra)


__all__ = ["RenamedFlagAction", "add_extra_term_flags", "add_head_setting_flags", "flag_help", "flag_metadata",
           "flag_type", "head_setting_fields", "head_settings_from_flags", "old_flags"]
