"""What scripts/run_translation.py and scripts/run_clm.py share, so that each script keeps only its own task.

* ``parse_arguments``: flags, or a .json/.yaml config file followed by flags that override it.
* ``TiedNormModelArguments``: the model flags of both scripts (checkpoint, tokenizer, the tied output layer and the
  technique flags of its loss) with their checks and the fine-tuning rules; each script subclasses it with the
  architecture flags of its model family.
* ``check_world_size``, ``configure_threads``, ``resolve_resume_checkpoint``: launch and run set-up.
* ``frequency_ordered``: the tokenizer renumbering that adaptive input/softmax needs.
* ``TiedWeightsCheck``: a Trainer callback that checks the tie after the Trainer prepared the model, on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml
from transformers import (
    AutoConfig,
    AutoTokenizer,
    HfArgumentParser,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

from .adaptive import AdaptiveInput
from .normalized_head import HEAD_MODES, LOGIT_SCALES
from .tokenization import TOKENIZER_MODELS
from .vocab_order import frequency_order, remap_tokenizer

logger = logging.getLogger(__name__)


def parse_arguments(dataclass_types: tuple[type, ...]) -> tuple:
    """Flags, or a .json/.yaml config file as first argument followed by flags that override it."""
    parser = HfArgumentParser(dataclass_types)
    argv = sys.argv[1:]
    if argv and argv[0].endswith((".json", ".yaml", ".yml")):
        if not Path(argv[0]).is_file():
            raise FileNotFoundError(f"config file not found: {argv[0]}")
        text = Path(argv[0]).read_text()
        values = json.loads(text) if argv[0].endswith(".json") else yaml.safe_load(text)
        if not isinstance(values, dict):
            raise ValueError(f"config file {argv[0]} must hold a mapping of argument names to values")
        flags = []
        for key, value in values.items():
            if key == "adaptive_cutoffs" and isinstance(value, list):  # the flag takes one comma-separated string
                value = ",".join(map(str, value))
            items = value if isinstance(value, list) else [value]
            flags += [f"--{key}", *(str(item) for item in items)]
        argv = flags + argv[1:]
    return parser.parse_args_into_dataclasses(args=argv)


def parse_cutoffs(text: str) -> list[int]:
    """--adaptive_cutoffs "2000,6000" -> [2000, 6000]; the config checks that they increase and fit the vocabulary."""
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(
            f"--adaptive_cutoffs must be comma-separated token ids such as '2000,6000', got {text!r}"
        ) from None


@dataclass
class TiedNormModelArguments:
    """Model flags of both training scripts. A script subclasses it with its architecture flags and appends their
    names to ``config_fields`` (and to ``finetune_fields`` those that change no parameter)."""

    # Flags that map one-to-one onto fields of both TiedNorm configs (adaptive_cutoffs once parsed).
    config_fields: ClassVar[tuple[str, ...]] = (
        "head_mode", "logit_scale", "logit_scale_init", "label_smoothing", "projection_regularization",
        "weight_norm_regularization", "weight_norm_target", "adaptive_cutoffs", "adaptive_div_value",
        "adaptive_tie_projections", "loss_chunk_size",
    )
    # Those that may still change when fine-tuning a saved checkpoint: loss weights, which change no parameter;
    # projection_regularization only when the saved model has the projection P already.
    finetune_fields: ClassVar[tuple[str, ...]] = (
        "label_smoothing", "projection_regularization", "weight_norm_regularization", "weight_norm_target",
        "loss_chunk_size",
    )

    # A saved model folder to fine-tune (its tokenizer is used); None trains a new model from our config.
    model_name_or_path: str | None = field(default=None)
    # A saved tokenizer folder for a new model; None trains a (joint) tokenizer on the training text.
    tokenizer_name: str | None = field(default=None)
    # Size of the subword vocabulary trained when there is no tokenizer.
    vocab_size: int = field(default=8000)
    # Subword model of that tokenizer: bpe or unigram.
    tokenizer_model: str = field(default="bpe")
    # The flags below and a script's architecture flags override config defaults for a new model (None keeps them).
    head_mode: str | None = field(default=None, metadata={"help": f"one of {HEAD_MODES}"})
    logit_scale: str | None = field(default=None, metadata={"help": f"one of {LOGIT_SCALES}"})
    logit_scale_init: float | None = field(default=None)
    # Label smoothing of the model's own loss (a config field; do not use --label_smoothing_factor).
    label_smoothing: float | None = field(default=None)
    # Press & Wolf's projection P before the tied head, with penalty λ·‖P‖_F (paper: λ = 0.15; 0 = P unregularized).
    projection_regularization: float | None = field(default=None)
    # Herold et al.'s weight-norm regularization ρ·Σ_k (‖w_k‖ − ν)² (paper: ρ = 1e-3) and its target ν (paper: 2).
    weight_norm_regularization: float | None = field(default=None)
    weight_norm_target: float | None = field(default=None)
    # Herold et al.'s weight-norm initialization: sigma of the row norms sigma*log(count) of a new model's
    # embedding, counts from the tokenized training data (hf_tiednorm/weight_norm_init.py); None = HF's random init.
    # Not in config_fields: the config records it once weight_norm_init_ has rescaled the embedding.
    weight_norm_init_sigma: float | None = field(default=None)
    # Adaptive input + tied adaptive softmax (Baevski & Auli): band edges in the frequency-ordered vocabulary
    # (the encoder-decoder needs --tie_topology three_way, its default).
    adaptive_cutoffs: str | None = field(default=None, metadata={"help": 'comma-separated token ids, e.g. "2000,6000"'})
    # Band i has width d_model (hidden_size) // div_value^i.
    adaptive_div_value: float | None = field(default=None)
    # Tie each band's output projection to its input projection as well.
    adaptive_tie_projections: bool | None = field(default=None)
    # Compute the training loss this many tokens at a time, never materializing the (tokens x V) logits.
    loss_chunk_size: int | None = field(default=None)

    def __post_init__(self):
        if self.tokenizer_model not in TOKENIZER_MODELS:
            raise ValueError(f"--tokenizer_model must be one of {TOKENIZER_MODELS}, got {self.tokenizer_model!r}")
        if self.model_name_or_path is not None:
            if not Path(self.model_name_or_path, "config.json").is_file():
                raise FileNotFoundError(f"--model_name_or_path {self.model_name_or_path} holds no config.json")
            fixed = [name for name in self.config_fields
                     if name not in self.finetune_fields and getattr(self, name) is not None]
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
        if self.adaptive_cutoffs is not None:
            parse_cutoffs(self.adaptive_cutoffs)  # fail on a malformed value before any work

    def config_overrides(self) -> dict[str, Any]:
        """The config fields given as flags; for a saved model (checked above) only fine-tunable ones."""
        overrides = {name: getattr(self, name) for name in self.config_fields if getattr(self, name) is not None}
        if self.adaptive_cutoffs is not None:
            overrides["adaptive_cutoffs"] = parse_cutoffs(self.adaptive_cutoffs)
        return overrides

    def finetune_config(self) -> PretrainedConfig:
        """The saved model's config with the fine-tunable flags given (``__post_init__`` refuses the others);
        ``from_dict`` re-checks the changed combination against the saved architecture."""
        config = AutoConfig.from_pretrained(self.model_name_or_path)
        return type(config).from_dict({**config.to_dict(), **self.config_overrides()})

    def tokenizer_source(self, output_dir: Path) -> str | None:
        """The tokenizer folder to load: the checkpoint's, a given one, or the one a previous run saved in
        ``output_dir`` (so that a resumed run keeps its vocabulary); None when a new one is to be trained."""
        source = self.model_name_or_path or self.tokenizer_name
        if source is None and (output_dir / "tokenizer.json").is_file():
            source = str(output_dir)
        return source

    def check_new_model(self, config_class: type[PretrainedConfig]) -> None:
        """Build the config a new model would get, so that bad flag combinations fail before any work. Its vocabulary
        is the one to train, or a given tokenizer's own."""
        vocab_size = self.vocab_size
        if self.tokenizer_name is not None:
            vocab_size = len(AutoTokenizer.from_pretrained(self.tokenizer_name))
        config_class(
            vocab_size=vocab_size, weight_norm_init_sigma=self.weight_norm_init_sigma, **self.config_overrides()
        )


def check_world_size(training_args: TrainingArguments) -> None:
    """Fail when the launcher started more processes than joined the Trainer's process group. Under torchrun on a
    machine without GPUs (scripts/accelerate/ddp.yaml), accelerate forms a gloo group only when told to use the CPU;
    otherwise every process trains the whole run alone as rank 0, all writing the same output folder."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != training_args.world_size:
        raise RuntimeError(
            f"the launcher started {launched} processes (WORLD_SIZE) but the Trainer's process group has "
            f"{training_args.world_size}, so each process would train alone as rank 0. On CPUs, set "
            "ACCELERATE_USE_CPU=true (or pass --use_cpu true) to make the processes one gloo group: "
            "ACCELERATE_USE_CPU=true accelerate launch --config_file scripts/accelerate/ddp.yaml <script> ..."
        )


def configure_threads(num_threads: int | None) -> None:
    """torch CPU threads of this process: ``num_threads``, or the machine's cores shared among the launch's processes
    (each process defaulting to all cores would oversubscribe them)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(num_threads or max(1, (os.cpu_count() or 1) // world_size))


def resolve_resume_checkpoint(training_args: TrainingArguments) -> str | None:
    """--resume_from_checkpoint as a checkpoint folder: "last" (or "true") is the newest one in --output_dir. Fails
    before any work when there is none, rather than after the data is prepared."""
    output_dir = Path(training_args.output_dir)
    resume = training_args.resume_from_checkpoint
    if resume in ("last", "true", "True"):
        resume = get_last_checkpoint(output_dir) if output_dir.is_dir() else None
        if resume is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {training_args.resume_from_checkpoint}: no checkpoint in {output_dir}"
            )
    elif resume is not None and not Path(resume).is_dir():
        raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder")
    return resume


def frequency_ordered(
    tokenizer: PreTrainedTokenizerBase, counts: torch.Tensor, tokenizer_name: str | None, output_dir: Path
) -> PreTrainedTokenizerBase:
    """``tokenizer`` renumbered by decreasing ``counts`` (its token counts in the training data), its special tokens
    first: adaptive bands need band 0 to hold the frequent tokens (hf_tiednorm/vocab_order.py). Warns when that
    renumbers the tokenizer given as ``tokenizer_name``, whose ids then no longer fit the new model."""
    order = frequency_order(counts, keep_first=sorted(tokenizer.all_special_ids))
    try:
        ordered = remap_tokenizer(tokenizer, order)
    except ValueError as error:
        raise ValueError(f"--adaptive_cutoffs needs a frequency-ordered vocabulary, but {error}") from None
    if tokenizer_name is not None and ordered.get_vocab() != tokenizer.get_vocab():
        logger.warning(
            "--adaptive_cutoffs: the ids of --tokenizer_name %s were renumbered by training-data frequency; "
            "the renumbered tokenizer is saved in %s and must be used with this model",
            tokenizer_name, output_dir,
        )
    return ordered


class TiedWeightsCheck(TrainerCallback):
    """Checks on every rank, once the Trainer has prepared (wrapped) the model, that the output layer still shares
    the decoder's input embedding matrix (one per band of an adaptive model), and logs how many steps each rank
    trained: with both lines from every rank, a multi-process launch shows that all its processes trained."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not model.config.tie_word_embeddings:
            return
        embedding = model.get_decoder().embed_tokens  # the decoder of an encoder-decoder, the whole causal LM
        adaptive = isinstance(embedding, AdaptiveInput)
        inputs = [band.weight for band in embedding.bands] if adaptive else [embedding.weight]
        outputs = model.output_embedding_weights()  # one matrix, or one per adaptive band
        tied = len(inputs) == len(outputs) and all(a is b for a, b in zip(inputs, outputs, strict=True))
        logger.warning(
            "rank %d: output layer tied to the decoder embedding after prepare: %s", args.process_index, tied
        )
        if not tied:
            raise RuntimeError("the output layer lost its tie to the decoder input embedding after prepare")

    def on_train_end(self, args, state, control, **kwargs):
        logger.warning("rank %d: trained %d steps", args.process_index, state.global_step)


__all__ = [
    "TiedNormModelArguments",
    "TiedWeightsCheck",
    "check_world_size",
    "configure_threads",
    "frequency_ordered",
    "parse_arguments",
    "parse_cutoffs",
    "resolve_resume_checkpoint",
]
