"""``hf_tiednorm.convert``: the public name of the way in (``normalize_tied_head``, ``convert_checkpoint``, the
``tiednorm-convert`` command line, ``python -m hf_tiednorm.convert``), kept where users and docs have always called
it. The code lives in the conversion and export layer, ``hf_tiednorm/conversion/convert.py``; this is a package, not a
flat module, because the flat ``hf_tiednorm/*.py`` are exactly the model layer (docs/layout.md).
"""

from ..conversion.convert import *  # noqa: F403
from ..conversion.convert import build_parser, main  # noqa: F401
