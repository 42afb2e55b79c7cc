"""What scripts/run_translation.py and scripts/run_clm.py share, so that each script keeps only its own task.

* ``parse_arguments``: flags, or a .json/.yaml config file followed by flags that override it.
* ``TiedNormModelArguments``: the model flags of both scripts (checkpoint, tokenizer, the tied output layer and the
  technique flags of its loss) with their checks and the fine-tuning rules; each script subclasses it with the
  architecture flags of its model family.
* ``check_world_size``, ``configure_threads``, ``setup_run``: launch set-up (and, on CPU, freed tensor memory kept for
  reuse: ``cpu_memory.keep_freed_memory``).
* ``TiedNormTrainingArguments``, ``TiedNormSeq2SeqTrainingArguments``: HF's arguments with bf16 autocast as the
  detected default on CPUs with native bf16 matmuls (``resolve_bf16``), and ``--bf16 true`` working on CPU;
  ``choose_attention``: eager attention with an fp32 softmax for bf16 on CPU, where torch's fused kernel is slow.
* ``OutputDirArguments``, ``prepare_output_dir``, ``resolve_resume_checkpoint``, ``check_resume_config``,
  ``save_final_model``: one run per --output_dir (HF examples' --overwrite_output_dir rule), resuming only the last
  *complete* checkpoint of a run with the same architecture, and a final save that never leaves a new config.json
  over old weights.
* ``TiedWeightsCheck``: a Trainer callback that checks the tie after the Trainer prepared the model, on every rank.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
import yaml
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    AutoConfig,
    AutoTokenizer,
    EarlyStoppingCallback,
    HfArgumentParser,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Seq2SeqTrainingArguments,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.masking_utils import eager_mask
from transformers.modeling_utils import PreTrainedModel
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
from transformers.utils import CONFIG_NAME

from .adaptive import AdaptiveInput
from .cpu_memory import keep_freed_memory
from .data import token_counts
from .model_card import write_model_card
from .normalized_head import HEAD_MODES, LOGIT_SCALES
from .plots import plot_embedding_norms
from .tokenization import TOKENIZER_MODELS, train_joint_tokenizer
from .vocab_order import frequency_ordered
from .weight_norm_init import weight_norm_init_

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
            vocab_size = len(AutoTokenizer.from_pretrained(self.tokenizer_name))
        return config_class(
            vocab_size=vocab_size, weight_norm_init_sigma=self.weight_norm_init_sigma, **self.config_overrides()
        )


# The Multi30k files the training scripts read by default (outside the repository, beside it under shared/).
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def is_multi30k(path: str | os.PathLike) -> bool:
    """Whether ``path`` is one of Multi30k's files: in MULTI30K, or named as they are in a folder named multi30k
    (a copy elsewhere, or the default path of an installed package that does not lie beside shared/)."""
    path = Path(path)
    named = path.parent.name.lower() == "multi30k" and re.fullmatch(r"(train|val|test_\w+)\.\w+(\.gz)?", path.name)
    return path.parent.resolve() == MULTI30K.resolve() or bool(named)


@dataclass
class DataArgumentsBase:
    """The data flags both training scripts share; each script's DataArguments adds its files (``train_file`` among
    them) and lengths."""

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
            self.dataset_name = "bentrevett/multi30k" if is_multi30k(self.train_file) else Path(self.train_file).name


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


# CPU flags of native bf16 matrix multiplication (x86). Without them oneDNN emulates bf16 through fp32, and
# autocast would only add casts.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16")


def cpuinfo_field(name: str, cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The value of the first ``name`` line of /proc/cpuinfo; None without it or without the file (not Linux)."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == name:
            return value.strip()
    return None


# What emulated bf16 cost where it was measured (issue 27): SmolLM2-135M fine-tuned with scripts/run_clm.py on an
# avx2-only AMD EPYC ran 120.6 s/step under --bf16 true against 4.9 s/step in fp32.
EMULATED_BF16_SLOWDOWN = "measured 24x slower per step than fp32 (120.6 vs 4.9 s, SmolLM2-135M on an avx2-only CPU)"


def cpu_bf16_flags(cpuinfo: Path = Path("/proc/cpuinfo")) -> list[str]:
    """Those of ``BF16_CPU_FLAGS`` that the CPU reports, in that order; [] without /proc/cpuinfo (not Linux)."""
    flags = set((cpuinfo_field("flags", cpuinfo) or "").split())
    return [flag for flag in BF16_CPU_FLAGS if flag in flags]


def cpu_bf16_flag(cpuinfo: Path = Path("/proc/cpuinfo")) -> str | None:
    """The first of ``BF16_CPU_FLAGS`` that the CPU reports; None without them or without /proc/cpuinfo (not Linux)."""
    return next(iter(cpu_bf16_flags(cpuinfo)), None)


def cpu_description(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The CPU as "CPU (<model name>, <bf16 flags>, <n> cores)". Machines of one kind differ (an AMD EPYC with
    avx512_bf16, an Intel Xeon with AMX too), and wall times and bf16 speed-ups compare only on the same processor."""
    model = cpuinfo_field("model name", cpuinfo) or platform.processor() or platform.machine()
    flags = "+".join(cpu_bf16_flags(cpuinfo)) or "no native bf16"
    return f"CPU ({model}, {flags}, {os.cpu_count()} cores)"


def resolve_bf16(requested: bool | None, use_cpu: bool, accelerator: bool, cpu_flag: str | None) -> tuple[bool, str]:
    """(bf16, why): --bf16 as given, or when not given bf16 autocast where training runs on a CPU with native bf16
    matmuls (``cpu_flag``); with an accelerator (CUDA, ...) HF's own default (fp32) stands."""
    on_cpu = use_cpu or not accelerator
    if requested is not None:
        why = f"--bf16 {str(requested).lower()}"
        if requested and on_cpu and cpu_flag is None:
            why += (
                f" (this CPU has none of {BF16_CPU_FLAGS}: bf16 matmuls are emulated and may be slower than fp32; "
                f"{EMULATED_BF16_SLOWDOWN})"
            )
        return requested, why
    if not on_cpu:
        return False, "an accelerator is present: HF's default fp32 (pass --bf16 true for bf16 autocast)"
    if cpu_flag is None:
        return False, f"the CPU has none of {BF16_CPU_FLAGS} (bf16 would be emulated): fp32 (--bf16 true to force)"
    return True, f"the CPU has {cpu_flag} (native bf16 matmuls): bf16 autocast, loss/norms/softmax fp32 (--bf16 false)"


@dataclass
class Bf16DefaultMixin:
    """``--bf16`` left unset picks the precision (``resolve_bf16``); ``precision_note`` says which and why, for the
    scripts to log. Put before HF's ``TrainingArguments`` (or ``Seq2SeqTrainingArguments``) in the bases."""

    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision (autocast; master weights, loss, norms and softmax stay fp32). Unset: on "
            f"if training runs on a CPU with native bf16 matmuls ({', '.join(BF16_CPU_FLAGS)}), HF's default (off) "
            "with a GPU. --bf16 false opts out; --bf16 true also works on a CPU-only machine without --use_cpu."
        },
    )

    def __post_init__(self) -> None:
        self.bf16, self.precision_note = resolve_bf16(
            self.bf16, self.use_cpu, torch.accelerator.is_available(), cpu_bf16_flag()
        )
        if EMULATED_BF16_SLOWDOWN in self.precision_note:  # asked for, and slow enough to say so loudly
            warnings.warn(f"bf16 on this CPU: {self.precision_note}; --bf16 false trains in fp32", stacklevel=2)
        super().__post_init__()

    def _validate_args(self) -> None:
        # HF refuses bf16 without a bf16 GPU unless --use_cpu is set. On a machine without any accelerator the CPU is
        # the device anyway; setting use_cpu for it would change how a torchrun launch forms its process group.
        cpu_only = self.bf16 and not self.use_cpu and not torch.accelerator.is_available()
        if cpu_only:
            self.bf16 = False
        try:
            super()._validate_args()
        finally:
            if cpu_only:
                self.bf16 = True


@dataclass
class TiedNormTrainingArguments(Bf16DefaultMixin, TrainingArguments):
    """``TrainingArguments`` with the detected bf16 default (scripts/run_clm.py)."""


@dataclass
class TiedNormSeq2SeqTrainingArguments(Bf16DefaultMixin, Seq2SeqTrainingArguments):
    """``Seq2SeqTrainingArguments`` with the detected bf16 default (scripts/run_translation.py)."""


# The attention of bf16 autocast on CPU (choose_attention), and the model types whose own eager attention it
# reproduces exactly (Marian / BART / Llama bodies); others (converted checkpoints: soft-capping, sliding windows, ...)
# keep theirs.
CPU_BF16_ATTENTION = "eager_fp32_softmax"
CPU_BF16_ATTENTION_MODEL_TYPES = ("tiednorm_seq2seq", "tiednorm_bart", "tiednorm_causal", "marian")


def eager_attention_fp32_softmax(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' eager attention (query/key/value: (batch, heads, length, head_dim); additive float mask) with
    the softmax always in fp32, as Llama's eager attention has it and Marian's does not: under bf16 autocast the two
    matmuls run in bf16, the scores' softmax in fp32."""
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:  # grouped-query attention: each key/value head serves `groups` query heads (repeat_kv)
        key, value = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    scaling = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        scores = scores + attention_mask[:, :, :, : key.shape[-2]]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    weights = torch.nn.functional.dropout(weights, p=dropout, training=module.training)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


AttentionInterface.register(CPU_BF16_ATTENTION, eager_attention_fp32_softmax)
AttentionMaskInterface.register(CPU_BF16_ATTENTION, eager_mask)  # the additive float mask of "eager"


def choose_attention(model: PreTrainedModel, training_args: TrainingArguments) -> str:
    """The attention a run trains with: ``CPU_BF16_ATTENTION`` under bf16 autocast on CPU for the model types of
    ``CPU_BF16_ATTENTION_MODEL_TYPES``, else the model's own.
    torch's CPU flash-attention kernel (SDPA) is 2-4x slower in bf16 than in fp32 at these lengths (fwd+bwd of
    batch 64 × 4 heads × 24 tokens: 20 ms vs 7.5 ms, eager bf16 5 ms; in a profiled main-job bf16 step SDPA took
    a quarter of the time), so there the eager matmuls win. Returns a line for the log."""
    on_cpu = training_args.use_cpu or not torch.accelerator.is_available()
    if not (training_args.bf16 and on_cpu and model.config.model_type in CPU_BF16_ATTENTION_MODEL_TYPES):
        return f"attention: {model.config._attn_implementation} (the model's)"
    model.set_attn_implementation(CPU_BF16_ATTENTION)
    return f"attention: {CPU_BF16_ATTENTION} (bf16 on CPU, where SDPA's fused bf16 kernel is slower than eager)"


# A launcher may create --output_dir with the run's own log in it before the run starts (scripts/reproduce_paper.py
# writes run.log there): log files are neither another run's outputs nor deleted by --overwrite_output_dir.
LOG_PATTERN = "*.log"
# What a run writes after training; stale once a resumed run goes on training (save_metrics would merge into them).
END_OF_RUN_FILES = (
    "all_results.json", "train_results.json", "eval_results.json", "test_results.json", "test_predictions.txt",
)


def is_complete_checkpoint(folder: Path) -> bool:
    """A checkpoint folder is complete once its trainer_state.json parses: the Trainer writes that file last, after
    the weights, optimizer, scheduler and RNG states (``Trainer._save_checkpoint``), so a save killed half-way leaves a
    folder without it (or with a truncated one)."""
    try:
        json.loads((folder / TRAINER_STATE_NAME).read_text())
    except (OSError, ValueError):
        return False
    return True


def last_complete_checkpoint(output_dir: Path) -> Path | None:
    """The complete ``checkpoint-N`` folder of ``output_dir`` with the highest N, skipping (with a warning) newer ones
    whose save was interrupted."""
    steps = {}
    for folder in output_dir.glob(f"{PREFIX_CHECKPOINT_DIR}-*"):
        step = folder.name.removeprefix(f"{PREFIX_CHECKPOINT_DIR}-")
        if folder.is_dir() and step.isdigit():
            steps[int(step)] = folder
    for step in sorted(steps, reverse=True):
        if is_complete_checkpoint(steps[step]):
            return steps[step]
        logger.warning("skipping %s: its save did not complete (no valid %s)", steps[step], TRAINER_STATE_NAME)
    return None


def resolve_resume_checkpoint(training_args: TrainingArguments) -> str | None:
    """--resume_from_checkpoint as a checkpoint folder: "last" (or "true") is the newest *complete* one in
    --output_dir (``last_complete_checkpoint``). Fails before any work when there is none or the folder given is
    incomplete, rather than after the data is prepared."""
    output_dir = Path(training_args.output_dir)
    resume = training_args.resume_from_checkpoint
    if resume in ("last", "true", "True"):
        last = last_complete_checkpoint(output_dir) if output_dir.is_dir() else None
        if last is None:
            raise FileNotFoundError(
                f"--resume_from_checkpoint {resume}: no complete checkpoint in {output_dir} "
                f"(a complete one holds a valid {TRAINER_STATE_NAME})"
            )
        return str(last)
    if resume is not None:
        if not Path(resume).is_dir():
            raise FileNotFoundError(f"--resume_from_checkpoint {resume} is not a checkpoint folder")
        if not is_complete_checkpoint(Path(resume)):
            raise ValueError(
                f"--resume_from_checkpoint {resume} is incomplete (no valid {TRAINER_STATE_NAME}: its save was "
                "interrupted); pass an earlier checkpoint or 'last' (the newest complete one)"
            )
    return resume


def _inside(path: str | os.PathLike, folder: Path) -> bool:
    resolved = Path(path).resolve()
    return resolved == folder or folder in resolved.parents


def prepare_output_dir(
    training_args: TrainingArguments, overwrite: bool, resume: str | None, inputs: dict[str, str | None]
) -> None:
    """One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
    --overwrite_output_dir, which deletes them so the run starts clean (no old checkpoints, results, predictions or
    tokenizer left beside the new ones). A run resuming a checkpoint of --output_dir continues that folder; only the
    previous end-of-run results go. ``inputs`` maps flags to the paths they read (--model_name_or_path, data files),
    which --overwrite_output_dir must not delete. Every rank checks before any rank writes; the main process cleans."""
    output_dir = Path(training_args.output_dir).resolve()
    previous = []
    if output_dir.is_dir():
        previous = sorted(path for path in output_dir.iterdir() if not path.match(LOG_PATTERN))
    stale: list[Path] = []
    if resume is not None and _inside(resume, output_dir):
        if overwrite:
            raise ValueError(
                f"--overwrite_output_dir would delete --resume_from_checkpoint {resume}; drop one of the two flags"
            )
        stale = [output_dir / name for name in END_OF_RUN_FILES]
    elif previous:
        if not overwrite:
            names = ", ".join(path.name for path in previous[:5]) + (", ..." if len(previous) > 5 else "")
            raise FileExistsError(
                f"--output_dir {training_args.output_dir} already holds another run's outputs ({names}). Pass "
                "--overwrite_output_dir to delete them and start clean, --resume_from_checkpoint last to continue "
                "that run, or choose a new --output_dir"
            )
        for flag, path in inputs.items():
            if path is not None and _inside(path, output_dir):
                raise ValueError(f"--overwrite_output_dir would delete {flag} {path}, which lies in --output_dir")
        logger.warning("--overwrite_output_dir: deleting the contents of %s", output_dir)
        stale = previous
    with training_args.main_process_first(local=False, desc="preparing --output_dir"):
        if training_args.process_index == 0:
            for path in stale:
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path)
                else:
                    path.unlink(missing_ok=True)


def check_resume_config(resume: str | None, config: PretrainedConfig, fields: tuple[str, ...]) -> None:
    """Refuse to resume a checkpoint whose model differs from the one this run builds in any of ``fields`` (the
    architecture flags): the Trainer would load, say, cosine-trained weights into an l2 model without a word."""
    if resume is None:
        return
    saved = AutoConfig.from_pretrained(resume)
    for name in ("model_type", *fields):
        if getattr(saved, name, None) != getattr(config, name, None):
            raise ValueError(
                f"--resume_from_checkpoint {resume} holds a model with {name}={getattr(saved, name, None)!r}, but this "
                f"run builds {name}={getattr(config, name, None)!r}; give the flags of the run that wrote the "
                "checkpoint, or start over in a new --output_dir (or with --overwrite_output_dir)"
            )


def save_final_model(trainer: Trainer) -> None:
    """``trainer.save_model()`` (model, tokenizer, training arguments) into --output_dir, safe against a kill: every
    file is first written to a sibling staging folder, then the old config.json is removed and the files are renamed
    into --output_dir, config.json last. A kill at any point leaves either the previous complete model or a folder
    without config.json (which from_pretrained refuses), never a new config.json over old weights."""
    output_dir = Path(trainer.args.output_dir).resolve()
    staging = output_dir.with_name(f".{output_dir.name}.saving")
    if trainer.is_world_process_zero():
        shutil.rmtree(staging, ignore_errors=True)  # left by a killed save
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))  # on every rank: FSDP and DeepSpeed gather the weights
    if trainer.is_world_process_zero():
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / CONFIG_NAME).unlink(missing_ok=True)
        for path in sorted(staging.iterdir(), key=lambda path: path.name == CONFIG_NAME):
            os.replace(path, output_dir / path.name)
        staging.rmdir()
    trainer.accelerator.wait_for_everyone()


class TiedWeightsCheck(TrainerCallback):
    """Checks on every rank, once the Trainer has prepared (wrapped) the model, that the output layer still shares
    the decoder's input embedding matrix (one per band of an adaptive model), and logs how many steps each rank
    trained: with both lines from every rank, a multi-process launch shows that all its processes trained."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if not model.config.tie_word_embeddings:
            return
        # The decoder of an encoder-decoder, the whole causal LM; through the accessor, since a converted model keeps
        # its architecture's module names (GPT-2's decoder calls its embedding wte).
        embedding = model.get_decoder().get_input_embeddings()
        adaptive = isinstance(embedding, AdaptiveInput)
        inputs = [band.weight for band in embedding.bands] if adaptive else [embedding.weight]
        if hasattr(model, "output_embedding_weights"):
            outputs = model.output_embedding_weights()  # one matrix, or one per adaptive band
        else:  # a transformers model (the HF Marian contender)
            outputs = [model.get_output_embeddings().weight]
        tied = len(inputs) == len(outputs) and all(a is b for a, b in zip(inputs, outputs, strict=True))
        logger.warning(
            "rank %d: output layer tied to the decoder embedding after prepare: %s", args.process_index, tied
        )
        if not tied:
            raise RuntimeError("the output layer lost its tie to the decoder input embedding after prepare")

    def on_train_end(self, args, state, control, **kwargs):
        logger.warning("rank %d: trained %d steps", args.process_index, state.global_step)


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
            "malloc without mmap/trim) instead of page-faulting it in again every step (hf_tiednorm.cpu_memory)"
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


def setup_run(run_args: RunArguments, training_args: TrainingArguments) -> None:
    """The checks and settings a training script makes before any work: every launched process joined the group,
    torch's CPU threads, freed CPU memory kept for reuse, and the flags that cannot serve (the Trainer's label
    smoothing, early stopping without a best model to return to)."""
    check_world_size(training_args)
    configure_threads(run_args.num_threads)
    if run_args.keep_freed_cpu_memory and training_args.device.type == "cpu":
        logger.info(keep_freed_memory())
    if training_args.label_smoothing_factor:
        raise ValueError("use --label_smoothing (the model's loss) instead of --label_smoothing_factor")
    if run_args.early_stopping_patience is not None and not training_args.load_best_model_at_end:
        raise ValueError("--early_stopping_patience needs --load_best_model_at_end true and an eval/save strategy")


class TimeBudgetCallback(TrainerCallback):
    """Stops training once the budget is spent; ranks agree through an all-reduce so that none waits forever."""

    def __init__(self, minutes: float):
        self.deadline = time.monotonic() + 60 * minutes

    def on_step_end(self, args, state, control, **kwargs):
        over = torch.tensor(float(time.monotonic() > self.deadline))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(over, op=torch.distributed.ReduceOp.MAX)
        if over.item():
            logger.warning("max_train_minutes reached at step %d: stopping training", state.global_step)
            control.should_training_stop = True
            control.should_save = True


def run_callbacks(run_args: RunArguments) -> list[TrainerCallback]:
    """The Trainer callbacks of a run: the tie check, and the time limit and early stopping when asked for."""
    callbacks: list[TrainerCallback] = [TiedWeightsCheck()]
    if run_args.max_train_minutes is not None:
        callbacks.append(TimeBudgetCallback(run_args.max_train_minutes))
    if run_args.early_stopping_patience is not None:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=run_args.early_stopping_patience))
    return callbacks


def split_files(train_file: str, validation_file: str | None, test_file: str | None) -> dict[str, str]:
    """The data files by split name; a split without a file (None or empty) is left out."""
    files = {"train": train_file}
    if validation_file:
        files["validation"] = validation_file
    if test_file:
        files["test"] = test_file
    return files


def run_inputs(model_args: TiedNormModelArguments, files: dict[str, str]) -> dict[str, str | None]:
    """The paths a run reads, by flag, for ``prepare_output_dir`` (which refuses an --output_dir holding one)."""
    return {"--model_name_or_path": model_args.model_name_or_path, "--tokenizer_name": model_args.tokenizer_name,
            **{f"--{split}_file": path for split, path in files.items()}}


def select_first(raw: dict, limits: dict[str, int | None]) -> None:
    """Keep only the first ``limits[split]`` rows of each split of ``raw`` (in place); None keeps them all."""
    for split, limit in limits.items():
        if split in raw and limit is not None:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))


def load_or_train_tokenizer(
    model_args: TiedNormModelArguments,
    training_args: TrainingArguments,
    resume: str | None,
    texts: Callable[[], Iterable[list[str]]],
    model_max_length: int,
    count_tokens: Callable[[PreTrainedTokenizerBase], torch.Tensor],
) -> PreTrainedTokenizerBase:
    """The run's tokenizer: the checkpoint's, a given one, the one a previous run saved in --output_dir, or a new
    one trained on ``texts()`` (batches of training text). With --adaptive_cutoffs it is renumbered by decreasing
    ``count_tokens(tokenizer)`` (training-data frequencies), special tokens first. A trained or renumbered
    tokenizer is saved in --output_dir by the main process, which goes first so that the others load nothing
    half-written."""
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(desc="tokenizer"):
        source = model_args.tokenizer_source(resume, output_dir)
        if source is not None:
            tokenizer = AutoTokenizer.from_pretrained(source)
        else:
            tokenizer = train_joint_tokenizer(
                texts(), vocab_size=model_args.vocab_size, model=model_args.tokenizer_model,
                model_max_length=model_max_length,
            )
        if model_args.adaptive_cutoffs is not None:  # a new model (fine-tuning refuses the flag)
            tokenizer = frequency_ordered(tokenizer, count_tokens(tokenizer), model_args.tokenizer_name, output_dir)
        if (source is None or model_args.adaptive_cutoffs is not None) and training_args.process_index == 0:
            tokenizer.save_pretrained(output_dir)
    logger.info("tokenizer from %s: %d tokens", source or "training data", len(tokenizer))
    return tokenizer


def check_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, training_args: TrainingArguments) -> None:
    """Choose the model's attention for the run's precision (logged), and fail when the tokenizer has more tokens
    than the model has embedding rows."""
    logger.info(choose_attention(model, training_args))
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")


def save_token_counts_and_init(
    model: PreTrainedModel,
    train_dataset,
    columns: tuple[str, ...],
    model_args: TiedNormModelArguments,
    training_args: TrainingArguments,
) -> None:
    """For a new model: the token frequencies of the tokenized training data (``columns``) saved as
    token_counts.pt in --output_dir (for the embedding-norm plots and analyses), and Herold et al.'s weight-norm
    initialization from them with --weight_norm_init_sigma, on every process, before the Trainer wraps the model."""
    if model_args.model_name_or_path is not None:
        return
    counts = token_counts(train_dataset, model.config.vocab_size, columns)
    if training_args.process_index == 0:
        output_dir = Path(training_args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        torch.save(counts, output_dir / "token_counts.pt")
    if model_args.weight_norm_init_sigma is not None:
        weight_norm_init_(model, counts, model_args.weight_norm_init_sigma)


def train_and_save(trainer: Trainer, resume: str | None, num_examples: dict[str, int]) -> dict:
    """Train (continuing ``resume``), save the final model and tokenizer (``save_final_model``), and log and save the
    training metrics with ``num_examples`` (e.g. ``{"train_samples": n}``) and the minutes spent; returns them."""
    start = time.monotonic()
    train_result = trainer.train(resume_from_checkpoint=resume)
    save_final_model(trainer)  # model + tokenizer
    minutes = (time.monotonic() - start) / 60
    metrics = dict(train_result.metrics, **num_examples, train_minutes=minutes)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def card_training(
    model_args: TiedNormModelArguments, training_args: TrainingArguments, state=None, **extra: Any
) -> dict:
    """The training settings a model card lists: the model flags, the schedule that bounded the run (``max_steps``
    when set, since it overrides the epochs; else ``num_train_epochs``), what the run did (``state``: the Trainer's
    ``TrainerState`` after training: steps and epochs trained), and ``extra``."""
    schedule = (
        {"max_steps": training_args.max_steps}
        if training_args.max_steps > 0
        else {"num_train_epochs": training_args.num_train_epochs}
    )
    done = {}
    if state is not None and state.global_step > 0:
        done = {"steps trained": state.global_step, "epochs trained": round(state.epoch or 0.0, 4)}
    return {
        **model_args.config_overrides(),
        **schedule,
        **done,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "learning_rate": training_args.learning_rate,
        **extra,
        "seed": training_args.seed,
    }


def write_plots_and_card(trainer: Trainer, model: PreTrainedModel, card: dict[str, Any] | None) -> None:
    """On the main process: the embedding-norm plots (with token_counts.pt when the run saved it; not under FSDP,
    whose sharded weights would need a gather) and, unless ``card`` is None, the model card rendered from
    ``write_model_card(output_dir, **card)``."""
    if not trainer.is_world_process_zero():
        return
    output_dir = Path(trainer.args.output_dir)
    if not trainer.is_fsdp_enabled:
        counts_file = output_dir / "token_counts.pt"
        counts = torch.load(counts_file) if counts_file.is_file() else None
        plot_embedding_norms(model, output_dir, counts, title=output_dir.name)
    if card is not None and not (output_dir / CONFIG_NAME).is_file():
        # An evaluation-only run (--do_eval without --do_train) saves no model in output_dir: a card would describe
        # nothing there.
        logger.info("no model saved in %s (evaluation only): no model card written", output_dir)
    elif card is not None:
        write_model_card(output_dir, **card)
    logger.info("model, tokenizer, metrics and card are in %s", output_dir.resolve())


__all__ = [
    "BF16_CPU_FLAGS",
    "EMULATED_BF16_SLOWDOWN",
    "CPU_BF16_ATTENTION",
    "CPU_BF16_ATTENTION_MODEL_TYPES",
    "Bf16DefaultMixin",
    "DataArgumentsBase",
    "MULTI30K",
    "OutputDirArguments",
    "RunArguments",
    "TimeBudgetCallback",
    "TiedNormSeq2SeqTrainingArguments",
    "TiedNormTrainingArguments",
    "TiedNormModelArguments",
    "TiedWeightsCheck",
    "check_resume_config",
    "card_training",
    "check_model",
    "check_world_size",
    "configure_threads",
    "choose_attention",
    "cpu_bf16_flag",
    "cpu_bf16_flags",
    "cpu_description",
    "cpuinfo_field",
    "eager_attention_fp32_softmax",
    "is_complete_checkpoint",
    "is_multi30k",
    "load_or_train_tokenizer",
    "last_complete_checkpoint",
    "parse_arguments",
    "prepare_output_dir",
    "resolve_bf16",
    "resolve_resume_checkpoint",
    "run_callbacks",
    "run_inputs",
    "save_final_model",
    "save_token_counts_and_init",
    "select_first",
    "setup_run",
    "split_files",
    "train_and_save",
    "write_plots_and_card",
]
