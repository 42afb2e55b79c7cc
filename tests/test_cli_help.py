"""The console scripts' --help (tiednorm-convert, tiednorm-card, tiednorm-push): every option says what it does, and
an option with a default names it, so ``--help`` is enough to use them."""

from __future__ import annotations

import argparse
import importlib

import pytest

# console script -> module with build_parser() (setup.cfg [options.entry_points]).
CLIS = {
    "tiednorm-convert": "hf_tiednorm.convert",
    "tiednorm-card": "hf_tiednorm.publishing.model_card",
    "tiednorm-push": "hf_tiednorm.publishing.hub",
    "tiednorm-export": "hf_tiednorm.export",
}


@pytest.mark.parametrize("name", sorted(CLIS))
def test_every_option_has_help_and_names_its_default(name, capsys):
    parser = importlib.import_module(CLIS[name]).build_parser()
    assert parser.prog == name
    assert parser.description
    defaults = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        label = action.option_strings[0] if action.option_strings else action.dest
        assert action.help and len(action.help) > 10, f"{name} {label} has no help"
        has_default = action.default not in (None, False, argparse.SUPPRESS) and action.option_strings
        assert not has_default or "%(default)s" in action.help, f"{name} {label}: help does not name its default"
        if has_default:
            defaults.append(f"(default: {action.default})")
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    assert all(default in shown for default in defaults), (defaults, shown)
