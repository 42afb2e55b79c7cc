"""The flags both training scripts share, read by ``HfArgumentParser``.

* ``parse_arguments``: flags, or a .json/.yaml config file followed by flags that override it.
* ``TiedNormModelArguments``: the model flags (checkpoint, tokenizer, the tied output layer and the technique flags of
  its loss) with their checks and the fine-tuning rules; each script subclasses it with the architecture flags of its
  model family. Its config-field flags are derived from the fields' descriptions (``model_arguments_class``): the
  help text and the fine-tuning rule of a field are written once, in ``conversion/field_help.py``.
* ``DataArgumentsBase``: the data flags both scripts share; each script adds its files and lengths (and names the
  folder of its default files in ``default_data_dir``: the library assumes no checkout).
* ``OutputDirArguments``: --overwrite_output_dir (see ``run_directory.prepare_output_dir``).
* ``RunArguments``: how a run uses the machine and when its training stops.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, get_type_hints

import torch
import yaml
from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, PretrainedConfig

from ..conversion.field_flags import flag_metadata, flag_type
from ..conversion.field_help import flag_of
from ..modeling.families.configuration import TiedNormHeadConfigMixin
from ..modeling.families.configuration_techniques import TiedNormTechniquesConfigMixin
from .tokenization import TOKENIZER_MODELS

# --dtype's values: HF's run_clm.py's (transformers' from_pretrained dtype names).
LOAD_DTYPES = ("auto", "bfloat16", "float16", "float32")
# The usage line and the note that --help prints first: how scripts/main_job.sh calls the scripts.
USAGE = "%(prog)s [CONFIG.yaml | CONFIG.json] [--FLAG VALUE ...]"
CONFIG_FILE_NOTE = (
    "A .yaml or .json config file may come first: its values are the defaults, and the flags after it override "
    "them, e.g. %(prog)s CONFIG.yaml --output_dir runs/x (scripts/main_job.sh runs run_translation.py with "
    "scripts/configs/multi30k_de_en.yaml this way)."
)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """HF's help formatter, except that a help text that states its default itself ("default: ...") keeps it: the
    config-field flags default to None (keep the config's value) and name the config's default instead."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        return text if "default:" in text else super()._get_help_string(action)


def argument_parser(dataclass_types: tuple[type, ...], description: str | None = None) -> HfArgumentParser:
    """The parser of a training script: its dataclasses' flags, the config-file usage and ``description``."""
    text = CONFIG_FILE_NOTE if description is None else f"{description.strip()}\n\n{CONFIG_FILE_NOTE}"
    return HfArgumentParser(dataclass_types, usage=USAGE, description=text, formatter_class=HelpFormatter)


# The flags of the script's main(argv) when it was given them (a caller in this process); None: the command line.
_MAIN_ARGV: list[str] | None = None


def config_file_argument() -> str | None:
    """The .json/.yaml config file the script was started from (its first argument), or None."""
    argv = sys.argv[1:] if _MAIN_ARGV is None else _MAIN_ARGV
    return argv[0] if argv and argv[0].endswith((".json", ".yaml", ".yml")) else None


def parse_arguments(
    dataclass_types: tuple[type, ...], description: str | None = None, argv: list[str] | None = None
) -> tuple:
    """Flags, or a .json/.yaml config file as first argument followed by flags that override it: ``argv`` (a
    script's ``main(argv)``, called in-process), else the command line."""
    global _MAIN_ARGV
    parser = argument_parser(dataclass_types, description)
    _MAIN_ARGV = None if argv is None else [str(arg) for arg in argv]
    argv = sys.argv[1:] if _MAIN_ARGV is None else _MAIN_ARGV
    if argv and argv[0].endswith((".json", ".yaml", ".yml")):
        if not Path(argv[0]).is_file():
            raise FileNotFoundError(f"config file not found: {argv[0]}")
        try:
            text = Path(argv[0]).read_text(encoding="utf-8-sig")
            values = json.loads(text) if argv[0].endswith(".json") else yaml.safe_load(text)
        except (UnicodeDecodeError, json.JSONDecodeError, yaml.YAMLError) as error:
            raise ValueError(f"config file {argv[0]} cannot be read: {error}") from None
        if not isinstance(values, dict):
            raise ValueError(f"config file {argv[0]} must hold a mapping of argument names to values")
        flags = []
        for key, value in values.items():
            items = value if isinstance(value, list) else [value]
            flags += [f"--{key}", *(str(item) for item in items)]
        argv = flags + argv[1:]
    return parser.parse_args_into_dataclasses(args=argv)


@dataclass
class ModelSourceArguments:
    """The model flags that are no config field (the checkpoint or tokenizer to start from), and the rules of the
    config-field flags that ``model_arguments_class`` adds: which a saved model fixes, which fine-tuning may change.
    A script subclasses the result with its architecture flags and appends their names to ``config_fields`` (and to
    ``finetune_fields`` those that change no parameter)."""

    # Flags that map one-to-one onto config fields; those of them that fine-tuning a saved checkpoint may still
    # change; and those that only a new model takes (applied when it is built). Filled by model_arguments_class.
    config_fields: ClassVar[tuple[str, ...]] = ()
    finetune_fields: ClassVar[tuple[str, ...]] = ()
    new_model_fields: ClassVar[tuple[str, ...]] = ()

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "saved model folder to fine-tune (its tokenizer is used); None: train a new model"},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "saved tokenizer folder for a new model; None: train a (joint) tokenizer on the train text"},
    )
    dtype: str | None = field(
        default=None,
        metadata={
            "help": "load --model_name_or_path in this dtype (transformers 5's name; --torch_dtype is its alias): "
            "bfloat16 trains bf16 weights, whose head's learned logit scale and bias stay float32; auto: the dtype "
            "the checkpoint was saved in; None: from_pretrained's default (auto). A new model is built in float32",
            "choices": LOAD_DTYPES,
            "aliases": ["--torch_dtype"],
        },
    )
    vocab_size: int = field(default=8000, metadata={"help": "size of the subword vocabulary trained if none is given"})
    tokenizer_model: str = field(default="bpe", metadata={"help": f"its subword model, one of {TOKENIZER_MODELS}"})

    def __post_init__(self):
        if self.tokenizer_model not in TOKENIZER_MODELS:
            raise ValueError(f"--tokenizer_model must be one of {TOKENIZER_MODELS}, got {self.tokenizer_model!r}")
        if self.dtype is not None and self.dtype not in LOAD_DTYPES:  # set in code or a config file
            raise ValueError(f"--dtype must be one of {LOAD_DTYPES}, got {self.dtype!r}")
        if self.model_name_or_path is None and self.dtype not in (None, "auto", "float32"):
            raise ValueError(
                f"--dtype {self.dtype} loads a saved model (--model_name_or_path) in that dtype; a new model is built "
                "in float32 (--bf16 true trains it under bf16 autocast): drop --dtype or pass --model_name_or_path"
            )
        if self.model_name_or_path is not None:
            if not Path(self.model_name_or_path, "config.json").is_file():
                raise FileNotFoundError(f"--model_name_or_path {self.model_name_or_path} holds no config.json")
            fixed = [name for name in self.architecture_fields() if getattr(self, name) is not None]
            if fixed:
                raise ValueError(f"--{' --'.join(fixed)} cannot change a saved model (--model_name_or_path); drop them")
            saved = json.loads(Path(self.model_name_or_path, "config.json").read_text())
            if self.projection_regularization is not None and saved.get("projection_regularization") is None:
                raise ValueError(
                    "--projection_regularization adds a projection P, which the saved model (--model_name_or_path) "
                    "does not have; drop it (it may only change the penalty of a model trained with P)"
                )
            for name in self.new_model_fields:
                if getattr(self, name) is not None:
                    raise ValueError(f"--{name} initializes a new model; drop it or --model_name_or_path")

    def card_settings(self) -> dict[str, Any]:
        """What the model card lists of these flags: the config fields given and the weights' --dtype."""
        return {**self.config_overrides(), **({"dtype": self.dtype} if self.dtype else {})}

    def load_kwargs(self) -> dict[str, Any]:
        """The ``from_pretrained`` keyword of --dtype (``dtype=torch.bfloat16``, ``"auto"``), or none."""
        if self.dtype is None:
            return {}
        return {"dtype": "auto" if self.dtype == "auto" else getattr(torch, self.dtype)}

    @classmethod
    def architecture_fields(cls) -> tuple[str, ...]:
        """The config fields that a saved model fixes: all but the fine-tunable ones."""
        return tuple(name for name in cls.config_fields if name not in cls.finetune_fields)

    def config_overrides(self) -> dict[str, Any]:
        """The config fields given as flags; for a saved model (checked above) only fine-tunable ones."""
        return {name: getattr(self, name) for name in self.config_fields if getattr(self, name) is not None}

    def finetune_config(self) -> PretrainedConfig:
        """The saved model's config with the fine-tunable flags given (``__post_init__`` refuses the others);
        ``from_dict`` re-checks the changed combination against the saved architecture."""
        config = AutoConfig.from_pretrained(self.model_name_or_path)
        return type(config).from_dict({**config.to_dict(), **self.config_overrides()})

    def tokenizer_source(self, resume: str | None, output_dir: Path) -> str | None:
        """The tokenizer folder to load: on resume the run's own (the resumed checkpoint's, else the one saved in
        ``output_dir``), whose ids are those of the checkpoint's weights, even when --tokenizer_name is given again;
        else the saved model's or a given one; None when a new one is to be trained."""
        if resume is not None:  # the run's own tokenizer first: its ids are the checkpoint's weights' ids
            folders = (Path(resume), output_dir)
            source = next((str(folder) for folder in folders if (folder / "tokenizer.json").is_file()), None)
            if source is not None:
                return source
        return self.model_name_or_path or self.tokenizer_name

    def run_config(self, config_class: type[PretrainedConfig]) -> PretrainedConfig:
        """The config this run trains, built before any work so that bad flags fail first: the saved model's with the
        fine-tunable flags, or a new model's from the flags. A new model's vocabulary is the one to train or a given
        tokenizer's (the final config takes the trained tokenizer's size and special tokens)."""
        if self.model_name_or_path is not None:
            return self.finetune_config()
        vocab_size = self.vocab_size
        if self.tokenizer_name is not None:
            try:
                vocab_size = len(AutoTokenizer.from_pretrained(self.tokenizer_name))
            except Exception as error:  # tokenizers' JSON errors name no file
                raise ValueError(f"--tokenizer_name {self.tokenizer_name}: cannot load the tokenizer: "
                                 f"{type(error).__name__}: {error}") from error
        new_model = {name: getattr(self, name) for name in self.new_model_fields}
        return config_class(vocab_size=vocab_size, **new_model, **self.config_overrides())


EXTRA_TERMS = "extra_terms"  # the config's list of registered head terms (head/settings.HeadSettings)


def model_arguments_class(*config_mixins: type, name: str = "TiedNormModelArguments") -> type:
    """The model flags of both training scripts: ``ModelSourceArguments`` plus one flag per field of
    ``config_mixins`` described as a flag (``field_help.flag_of``: the package's ``FIELD_FLAGS``, or a field's own
    ``script_flag`` metadata), with its help text, its choices (a ``Literal`` type) and the config's default named in
    the help; the flag's own default None keeps the config's value. ``config_fields``, ``finetune_fields`` and
    ``new_model_fields`` follow from the descriptions, so a described field becomes a flag of both scripts."""
    flags = [
        config_field for mixin in config_mixins for config_field in dataclasses.fields(mixin)
        if flag_of(config_field) is not None
    ]
    types = {name: kind for mixin in config_mixins for name, kind in get_type_hints(mixin).items()}
    fields = [
        (
            config_field.name,
            flag_type(types[config_field.name]),
            field(default=None, metadata=flag_metadata(config_field, types[config_field.name])),
        )
        for config_field in flags
    ]
    # The head terms registered from outside the package (register_head_term), by name: a new model's head
    # learns them (the config's extra_terms); the names are checked when the config is built.
    fields.append((EXTRA_TERMS, list[str] | None, field(default=None, metadata={
        "help": "head terms registered with hf_tiednorm.register_head_term that a new model's head learns "
                "(per-token terms folded into the scores), by name"})))  # fmt: skip
    new_model = tuple(f.name for f in flags if flag_of(f).get("new_model_only"))
    namespace = {
        "__module__": __name__,
        "__doc__": ModelSourceArguments.__doc__,
        "config_fields": (*(f.name for f in flags if f.name not in new_model), EXTRA_TERMS),
        "finetune_fields": tuple(f.name for f in flags if flag_of(f).get("finetune")),
        "new_model_fields": new_model,
    }
    return dataclasses.make_dataclass(name, fields, bases=(ModelSourceArguments,), namespace=namespace)


# The model flags of scripts/run_translation.py and scripts/run_clm.py: the head's and the techniques' config fields.
TiedNormModelArguments = model_arguments_class(TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin)


def is_multi30k(path: str | os.PathLike) -> bool:
    """Whether ``path`` is named as one of Multi30k's files (train / val / test_*, one language, .gz or not) in a
    folder named multi30k: the data set wherever its copy lies (the scripts' default folder or another)."""
    path = Path(path)
    named = re.fullmatch(r"(train|val|test_\w+)\.\w+(\.gz)?", path.name)
    return path.parent.name.lower() == "multi30k" and named is not None


@dataclass
class DataArgumentsBase:
    """The data flags both training scripts share; each script's DataArguments adds its files (``train_file`` among
    them) and lengths, and sets ``default_data_dir`` to the folder of its default files (the Multi30k copy that
    scripts/ reads): a training file there names the data set bentrevett/multi30k in the model card."""

    default_data_dir: ClassVar[Path | None] = None

    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes for the tokenization map"}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "the model card's name (a Hub id) for the data set that --train_file holds: a label, the script "
            "does not download it; None: bentrevett/multi30k for the Multi30k files, else the training file's name"
        },
    )

    def __post_init__(self):
        # The help says "None: no evaluation / no test": the word None (or an empty value) on the command line or in
        # a config file means no file, not a file named "None".
        for name in ("validation_file", "test_file"):
            if str(getattr(self, name, None)).strip().lower() in ("none", ""):
                setattr(self, name, None)
        default = self.default_data_dir is not None and Path(self.train_file).parent == self.default_data_dir
        multi30k = default or is_multi30k(self.train_file)
        if self.dataset_name is None:
            self.dataset_name = "bentrevett/multi30k" if multi30k else Path(self.train_file).name
        elif multi30k and "multi30k" not in self.dataset_name.lower():
            # HF's example scripts download --dataset_name; ours only name the files in the card, so a card saying
            # "Trained on wmt16" for a run on Multi30k would name data the run never saw.
            raise ValueError(
                f"--dataset_name {self.dataset_name} would name the model card's data, but the run reads the Multi30k "
                f"files ({self.train_file}): this script does not download data sets. Pass --train_file (and "
                "--validation_file / --test_file) with that data set's files, or drop --dataset_name"
            )


@dataclass
class OutputDirArguments:
    """--overwrite_output_dir, which transformers 5 dropped from TrainingArguments; the scripts keep HF examples'
    rule (see ``prepare_output_dir``)."""

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Delete the contents of a non-empty --output_dir (another run's outputs) and start clean; without "
            "it such a folder is refused, unless --resume_from_checkpoint continues the run it holds."
        },
    )
    allow_run_change: list[str] = field(
        default_factory=list,
        metadata={
            "help": "flags (names without --, e.g. dropout seed) that a --resume_from_checkpoint may knowingly change "
            "from the run's record (run_record.json); any other difference from the flags that started the run is "
            "refused by name (docs/run_safety.md)"
        },
    )


@dataclass
class RunArguments:
    """How a run uses the machine and when its training stops: the same flags in both training scripts."""

    num_threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads per process; None: all cores shared among the launch's processes"},
    )
    keep_freed_cpu_memory: bool = field(
        default=True,
        metadata={
            "help": "training on CPU: keep the memory freed tensors release in the process for the next step (glibc "
            "malloc without mmap/trim) instead of page-faulting it in again every step "
            "(hf_tiednorm.training.cpu_memory)"
        },
    )
    max_train_minutes: float | None = field(
        default=None,
        metadata={"help": "stop training after this many minutes (all ranks at one step), then evaluate as usual"},
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "stop after N evaluations without improving --metric_for_best_model (needs "
            "--load_best_model_at_end)"
        },
    )
