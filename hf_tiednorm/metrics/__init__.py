"""Metric modules shipped with the package, loadable offline with ``evaluate.load(path)``."""

from pathlib import Path

SACREBLEU_LOCAL = str(Path(__file__).resolve().parent / "sacrebleu_local")

__all__ = ["SACREBLEU_LOCAL"]
