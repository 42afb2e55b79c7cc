"""``python -m hf_tiednorm.export FOLDER OUT``: the command line of ``hf_tiednorm.publishing.export``
(``tiednorm-export``), under the name ``python -m hf_tiednorm.convert`` has for the way in.

Only a name: the export is a training-wing tool (publishing/export.py). The model wing imports nothing of the other
wings, so this file reaches it by name when called, never at import: importing it (no saved model's remote code
names it) loads nothing of the publishing wing.
"""

from __future__ import annotations

import argparse
import importlib

_CLI = "hf_tiednorm.publishing.export"


def build_parser() -> argparse.ArgumentParser:
    """The ``tiednorm-export`` command line."""
    return importlib.import_module(_CLI).build_parser()


def main(argv: list[str] | None = None) -> None:
    importlib.import_module(_CLI).main(argv)


if __name__ == "__main__":
    main()
