"""The flags both training scripts share, read by ``HfArgumentParser``.

* ``parse_arguments``: flags, or a .json/.yaml config file followed by flags that override it.
* ``TiedNormModelArguments``: the model flags (checkpoint, tokenizer, the tied output layer and the technique flags of
  its loss) with their checks and the fine-tuning rules; each script subclasses it with the architecture flags of its
  model family.
* ``DataArgumentsBase``: the data flags both scripts share; each script adds its files and lengths (and names the
  folder of its default files in ``default_data_dir``: the library assumes no checkout).
* ``OutputDirArguments``: --overwrite_output_dir (see ``run_directory.prepare_output_dir``).
* ``RunArguments``: how a run uses the machine and when its training stops.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import yaml
from transformers import AutoConfig, AutoTokenizer, HfArgumentParser, PretrainedConfig

from ..normalized_head import HEAD_MODES, LOGIT_SCALES
from .tokenization import TOKENIZER_MODELS


def parse_arguments(dataclass_types: tuple[type, ...]) -> tuple:
    """Flags, or a .json/.yaml config file as first argument followed by flags that override it."""
    parser = HfArgumentParser(dataclass_types)
    argv = sys.argv[1:]
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
class TiedNormModelArguments:
    """Model flags of both training scripts. A script subclasses it with its architecture flags and appends their
    names to ``config_fields`` (and to ``finetune_fields`` those that change no parameter)."""

    # Flags that map one-to-one onto fields of both TiedNorm configs.
    config_fields: ClassVar[tuple[str, ...]] = (
        "head_mode", "logit_scale", "logit_scale_init", "label_smoothing", "projection_regularization",
        "weight_norm_regularization", "weight_norm_target", "adaptive_cutoffs", "adaptive_div_value",
        "adaptive_tie_projections", "loss_chunk_size", "embedding_init_std",
    )
    # Those that may still change when fine-tuning a saved checkpoint: loss weights, which change no parameter;
    # projection_regularization only when the saved model has the projection P already.
    finetune_fields: ClassVar[tuple[str, ...]] = (
        "label_smoothing", "projection_regularization", "weight_norm_regularization", "weight_norm_target",
        "loss_chunk_size",
    )

    model_name_or_path: str | None = field(
        default=None,
        metadata={"help": "saved model folder to fine-tune (its tokenizer is used); None: train a new model"},
    )
    tokenizer_name: str | None = field(
        default=None,
        metadata={"help": "saved tokenizer folder for a new model; None: train a (joint) tokenizer on the train text"},
    )
    vocab_size: int = field(default=8000, metadata={"help": "size of the subword vocabulary trained if none is given"})
    tokenizer_model: str = field(default="bpe", metadata={"help": f"its subword model, {TOKENIZER_MODELS}"})
    # The flags below and a script's architecture flags override config defaults for a new model (None keeps them).
    head_mode: str | None = field(default=None, metadata={"help": f"one of {HEAD_MODES}"})
    logit_scale: str | None = field(default=None, metadata={"help": f"one of {LOGIT_SCALES}"})
    logit_scale_init: float | None = field(default=None, metadata={"help": "initial value of the head's logit scale"})
    label_smoothing: float | None = field(
        default=None,
        metadata={"help": "label smoothing of the model's own loss (a config field; not --label_smoothing_factor)"},
    )
    projection_regularization: float | None = field(
        default=None,
        metadata={
            "help": "Press & Wolf's projection P before the tied head with penalty λ·‖P‖_F (paper: λ = 0.15; "
            "0 = P unregularized)"
        },
    )
    weight_norm_regularization: float | None = field(
        default=None,
        metadata={"help": "Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² (paper: ρ = 1e-3)"},
    )
    weight_norm_target: float | None = field(
        default=None, metadata={"help": "target row norm ν of --weight_norm_regularization (paper: 2)"}
    )
    # Not in config_fields: the config records it once weight_norm_init_ has rescaled the embedding.
    weight_norm_init_sigma: float | None = field(
        default=None,
        metadata={
            "help": "Herold et al.'s weight-norm init: a new model's embedding rows get norm sigma*log(count), counts "
            "from the tokenized training data; None: HF's random init"
        },
    )
    adaptive_cutoffs: list[int] | None = field(
        default=None,
        metadata={
            "help": "adaptive input + tied adaptive softmax: band edges in the frequency-ordered vocabulary, token "
            "ids such as 2000 6000 (the config checks that they increase and fit; encoder-decoder: --tie_topology "
            "three_way)"
        },
    )
    adaptive_div_value: float | None = field(
        default=None, metadata={"help": "band i of the adaptive input/softmax has width d_model // div_value**i"}
    )
    adaptive_tie_projections: bool | None = field(
        default=None, metadata={"help": "tie each adaptive band's output projection to its input projection as well"}
    )
    loss_chunk_size: int | None = field(
        default=None,
        metadata={"help": "compute the training loss this many tokens at a time, never materializing all logits"},
    )
    embedding_init_std: float | None = field(
        default=None,
        metadata={
            "help": "Std of a new model's token embeddings (and untied output matrix); None: the config's init_std "
            "(0.02). The paper's fairseq init is d**-0.5 (row norms ≈ 1), e.g. 0.0625 at d = 256; square mode needs it."
        },
    )

    def __post_init__(self):
        if self.tokenizer_model not in TOKENIZER_MODELS:
            raise ValueError(f"--tokenizer_model must be one of {TOKENIZER_MODELS}, got {self.tokenizer_model!r}")
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
            if self.weight_norm_init_sigma is not None:
                raise ValueError("--weight_norm_init_sigma initializes a new model; drop it or --model_name_or_path")

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
        """The tokenizer folder to load: the checkpoint's, a given one, or on resume the run's own (the resumed
        checkpoint's, else the one saved in ``output_dir``), so that a resumed run keeps its vocabulary; None when a
        new one is to be trained."""
        source = self.model_name_or_path or self.tokenizer_name
        if source is None and resume is not None:
            folders = (Path(resume), output_dir)
            source = next((str(folder) for folder in folders if (folder / "tokenizer.json").is_file()), None)
        return source

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
        return config_class(
            vocab_size=vocab_size, weight_norm_init_sigma=self.weight_norm_init_sigma, **self.config_overrides()
        )


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
            "help": "data set named in the model card (a Hub id); None: bentrevett/multi30k for the default files, "
            "else the training file's name"
        },
    )

    def __post_init__(self):
        if self.dataset_name is None:
            default = self.default_data_dir is not None and Path(self.train_file).parent == self.default_data_dir
            self.dataset_name = "bentrevett/multi30k" if default else Path(self.train_file).name


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
