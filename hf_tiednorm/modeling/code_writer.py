"""How a saved folder gets its code: the package sets ``CODE_HOOKS`` when imported (conversion/saved_code.py: a save
writes the family's generated files, a load reports a folder whose own code does not run); in a folder's own code
they are None, and transformers copies that code as any remote code."""

from contextlib import nullcontext

CODE_HOOKS: dict = {"save": None, "load": None}  # (config or model, folder) -> context manager; (model, source) -> None


class SavesItsCode:
    """First among a config's or model's bases: its ``save_pretrained`` and ``from_pretrained`` run ``CODE_HOOKS``."""

    def save_pretrained(self, save_directory, *args, **kwargs):
        with nullcontext() if CODE_HOOKS["save"] is None else CODE_HOOKS["save"](self, save_directory):
            return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        loaded = super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        if CODE_HOOKS["load"] is not None:
            CODE_HOOKS["load"](loaded[0] if isinstance(loaded, tuple) else loaded, pretrained_model_name_or_path)
        return loaded


__all__ = ["CODE_HOOKS", "SavesItsCode"]
