"""The conversion and export layer: every way between a plain checkpoint and an hf_tiednorm one, and nothing that
travels with a saved model (docs/layout.md).

- In: ``convert`` (``normalize_tied_head``, ``convert_checkpoint``, ``tiednorm-convert``; public name
  ``hf_tiednorm.convert``), ``convert_checks`` (what a source must be), ``gguf_checks`` (a GGUF file read whole, the
  loader's quantization state dropped), ``source_provenance`` (the source's Hub id and license, recorded in the
  converted config for every later card).
- Out: ``export`` (``export_plain``, ``tiednorm-export``; public name ``hf_tiednorm.export``), ``export_checks`` (what
  an export checks before writing), ``export_card`` (its card and the command back), ``staging_checks`` (what must
  not leave this machine, atomic staging; tiednorm-push stages through it too).
- Engines: ``engines/`` (ONNX Runtime, llama.cpp): serving an export with an engine nobody here wrote.

It imports the model layer, never the publishing or training layers (tests/test_layout.py).
"""
