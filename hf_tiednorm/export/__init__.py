"""``hf_tiednorm.export``: the public name of the way out (``export_plain``, the ``tiednorm-export`` command line,
``python -m hf_tiednorm.export FOLDER OUT``), beside ``hf_tiednorm.convert`` for the way in. The code lives in the
conversion and export layer, ``hf_tiednorm/conversion/export.py``; this is a package, not a flat module, because the
flat ``hf_tiednorm/*.py`` are exactly the model layer (docs/layout.md).
"""

from ..conversion.export import *  # noqa: F403
from ..conversion.export import build_parser, main  # noqa: F401
