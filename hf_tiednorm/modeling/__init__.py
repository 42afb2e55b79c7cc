"""The model layer: what a model needs to load, train and generate, and nothing else. A saved model's two code
files (``hf_tiednorm/remote_code/``) are generated from the modules of this package (docs/layout.md).

* ``head/``: the normalized tied output layer: the head modes, the head's options and learned terms, the layer.
* ``loss/``: the training loss: the token cross-entropy, the loss-path policy, the chunked kernel, the one entry point
  of the head's fused loss, the regularizers.
* ``families/``: the model families built from them (the family table, the configs, the models, the wrapper).
* ``save_checks``, ``load_checks``, ``weight_checks``, ``auto_map``, ``translation_pipeline``: saving and loading
  checks, ``auto_map`` rules and the translation pipeline, shared by the families.
"""
