"""How a saved folder gets its code. ``save_pretrained`` of a config or a model of the package runs inside
``CODE_WRITER[0]``, which the package sets when it is imported (hf_tiednorm/conversion/saved_code.py: the two
generated files of the model's family, and ``auto_map`` naming them). In a folder's own code nothing sets it, and
transformers copies that code as it copies any remote code (``custom_object_save``).
"""

from contextlib import nullcontext

# A callable (the config or model being saved, its folder) -> a context manager around the save; None: transformers'.
CODE_WRITER: list = [None]


class SavesItsCode:
    """First among the bases of a config or model class: its ``save_pretrained`` writes the folder's code through
    ``CODE_WRITER``."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        writer = CODE_WRITER[0]
        with nullcontext() if writer is None else writer(self, save_directory):
            return super().save_pretrained(save_directory, *args, **kwargs)


__all__ = ["CODE_WRITER", "SavesItsCode"]
