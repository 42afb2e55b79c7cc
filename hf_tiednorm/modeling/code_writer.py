"""How a saved folder gets its code: the package sets ``CODE_WRITER`` (hf_tiednorm/conversion/saved_code.py, its
family's two generated files); in a folder's own code it is None and transformers copies the code itself."""

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
