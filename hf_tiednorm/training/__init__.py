"""The training layer: what scripts/run_translation.py and scripts/run_clm.py need beyond the model (the model layer:
the flat ``hf_tiednorm/*.py``, from which a saved model's code is generated). Nothing here is imported by a model
file.

* ``arguments``: the shared flags (model, data, output folder, run) and ``parse_arguments`` (config file + flags).
* ``precision``: CPU detection, the bf16 default, the fp32-softmax attention for bf16 on CPU.
* ``run_directory``: the run's lock on --output_dir, refuse / overwrite / resume it, complete checkpoints, scoring a
  finished run, the staged final save (docs/run_safety.md).
* ``callbacks``: the tie check, the time budget, early stopping.
* ``steps``: the ``main()`` steps both scripts share.
* ``trainers``, ``data``, ``tokenization``, ``vocab_order``, ``cpu_memory``, ``plots``: the Trainers with per-term
  loss logs, data loading, the joint tokenizer, frequency-ordered vocabularies, freed CPU memory kept for reuse, and
  the embedding-norm plots.
"""
