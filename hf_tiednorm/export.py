"""``python -m hf_tiednorm.export FOLDER OUT``: the command line of ``hf_tiednorm.publishing.export``
(``tiednorm-export``), under the name ``python -m hf_tiednorm.convert`` has for the way in.

Only a name: the export is a training-wing tool (publishing/export.py). This file imports nothing, so importing it
(or a saved model's remote code, which never names it) loads nothing of the publishing wing; running it hands over
to that module.
"""

if __name__ == "__main__":
    import runpy

    runpy.run_module("hf_tiednorm.publishing.export", run_name="__main__", alter_sys=True)
