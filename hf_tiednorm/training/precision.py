"""The precision of a run: the CPU's native bf16 support read from /proc/cpuinfo, bf16 autocast as the detected
default on such CPUs (``resolve_bf16``, ``TiedNormTrainingArguments``, ``TiedNormSeq2SeqTrainingArguments``, with
``--bf16 true`` working on a CPU-only machine), and ``choose_attention``: eager attention with an fp32 softmax for bf16
on CPU, where torch's fused kernel is slow. That attention is registered with transformers when a run chooses it,
not when this module is imported (the benchmarks import it only for ``cpu_description``).
"""

from __future__ import annotations

import os
import platform
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import (
    AttentionInterface,
    AttentionMaskInterface,
    Seq2SeqTrainingArguments,
    TrainingArguments,
)
from transformers.masking_utils import eager_mask
from transformers.modeling_utils import PreTrainedModel

from ..modeling.families.table import family_of_config, family_of_source

# Batches on an accelerator are padded to a multiple of this many tokens (``padding_multiple``): with
# group_by_length and no padding multiple, the main job's batches took about 209 distinct (batch, length) shapes an
# epoch, against 25 with 8, and a GPU's attention kernels (cuDNN) plan anew for every new shape. The suspected cause
# of bf16 at 0.097x fp32 on an H200 (issue 38); not verified on a GPU.
GPU_PAD_TO_MULTIPLE_OF = 8

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


def accelerator_bf16() -> str | None:
    """The accelerator's name when it computes in bf16 natively (a CUDA GPU of compute capability >= 8.0: A100, H100,
    H200, ...), else None (no accelerator, an older GPU, or one whose bf16 support torch does not report)."""
    if not torch.cuda.is_available() or not torch.cuda.is_bf16_supported(including_emulation=False):
        return None
    return torch.cuda.get_device_name()


def resolve_bf16(
    requested: bool | None, use_cpu: bool, accelerator: bool, cpu_flag: str | None, gpu_bf16: str | None = None
) -> tuple[bool, str]:
    """(bf16, why): --bf16 as given, or when not given bf16 autocast where training runs on a CPU with native bf16
    matmuls (``cpu_flag``) or on a GPU with native bf16 (``gpu_bf16``: its name, ``accelerator_bf16``); with another
    accelerator HF's own default (fp32) stands."""
    on_cpu = use_cpu or not accelerator
    if requested is not None:
        why = f"--bf16 {str(requested).lower()}"
        if requested and on_cpu and cpu_flag is None:
            why += (
                f" (this CPU has none of {BF16_CPU_FLAGS}: bf16 matmuls are emulated and may be slower than fp32; "
                f"{EMULATED_BF16_SLOWDOWN})"
            )
        return requested, why
    if not on_cpu and gpu_bf16 is not None:
        return True, (
            f"the GPU ({gpu_bf16}) has native bf16: bf16 autocast, loss/norms/softmax fp32 (--bf16 false; its "
            "speed-up is not yet measured: scripts/gpu_check.sh)"
        )
    if not on_cpu:
        return False, "an accelerator without native bf16: HF's default fp32 (pass --bf16 true for bf16 autocast)"
    if cpu_flag is None:
        return False, f"the CPU has none of {BF16_CPU_FLAGS} (bf16 would be emulated): fp32 (--bf16 true to force)"
    return True, f"the CPU has {cpu_flag} (native bf16 matmuls): bf16 autocast, loss/norms/softmax fp32 (--bf16 false)"


def resolve_padding(requested: int | None, on_accelerator: bool) -> int:
    """--pad_to_multiple_of as given (0: none), or unset ``GPU_PAD_TO_MULTIPLE_OF`` on an accelerator and 0 on CPU
    (where padding only adds work)."""
    if requested is None:
        return GPU_PAD_TO_MULTIPLE_OF if on_accelerator else 0
    if requested < 0:
        raise ValueError(f"--pad_to_multiple_of must be >= 0 (0: no padding multiple), got {requested}")
    return requested


@dataclass
class Bf16DefaultMixin:
    """``--bf16`` left unset picks the precision (``resolve_bf16``); ``precision_note`` says which and why, for the
    scripts to log. ``--dataloader_pin_memory`` left unset pins memory only where there is an accelerator to copy
    to. Put before HF's ``TrainingArguments`` (or ``Seq2SeqTrainingArguments``) in the bases."""

    bf16: bool | None = field(
        default=None,
        metadata={
            "help": "bf16 mixed precision (autocast; master weights, loss, norms and softmax stay fp32). Unset: on "
            f"if training runs on a CPU with native bf16 matmuls ({', '.join(BF16_CPU_FLAGS)}) or on a GPU with "
            "native bf16 (compute capability >= 8.0), else off. --bf16 false opts out; --bf16 true also works on a "
            "CPU-only machine without --use_cpu."
        },
    )

    dataloader_pin_memory: bool | None = field(
        default=None,
        metadata={
            "help": "Pin the data loader's batches in page-locked memory for faster copies to an accelerator. Unset: "
            "on when training runs on an accelerator, off on CPU (pinning needs one; torch warns on every CPU run)."
        },
    )

    pad_to_multiple_of: int | None = field(
        default=None,
        metadata={
            "help": "pad every batch to a multiple of this many tokens (the collator's pad_to_multiple_of; 0: no "
            f"padding beyond the longest row). Unset: {GPU_PAD_TO_MULTIPLE_OF} when training runs on an "
            "accelerator (fewer distinct batch shapes for its kernels to plan), none on CPU."
        },
    )

    def __post_init__(self) -> None:
        self.bf16, self.precision_note = resolve_bf16(
            self.bf16, self.use_cpu, torch.accelerator.is_available(), cpu_bf16_flag(),
            None if self.use_cpu else accelerator_bf16(),
        )
        self.pad_to_multiple_of = resolve_padding(
            self.pad_to_multiple_of, torch.accelerator.is_available() and not self.use_cpu
        )
        if self.pad_to_multiple_of:
            self.precision_note += f"; batches padded to a multiple of {self.pad_to_multiple_of} (--pad_to_multiple_of)"
        if EMULATED_BF16_SLOWDOWN in self.precision_note:  # asked for, and slow enough to say so loudly
            warnings.warn(f"bf16 on this CPU: {self.precision_note}; --bf16 false trains in fp32", stacklevel=2)
        if self.dataloader_pin_memory is None:
            self.dataloader_pin_memory = torch.accelerator.is_available() and not self.use_cpu
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
    """``Seq2SeqTrainingArguments`` with the detected bf16 default and a beam size of its own for the evaluations
    during training (scripts/run_translation.py)."""

    # A validation BLEU after every epoch is a learning curve; with beam 4 each point costs several times a greedy
    # one. The points of one curve must share their decoding, the final score keeps the beam search (issue 25).
    generation_num_beams_during_training: int | None = field(
        default=None,
        metadata={
            "help": "beam size of the evaluations during training (--eval_strategy steps/epoch, e.g. 1: greedy, a "
            "cheap learning curve); the evaluation and prediction after training keep --generation_num_beams. "
            "Unset: --generation_num_beams throughout."
        },
    )


def padding_multiple(training_args: TrainingArguments) -> int | None:
    """The collators' ``pad_to_multiple_of`` of a run: --pad_to_multiple_of (``Bf16DefaultMixin``), None for 0 or
    for arguments without the field (HF's own)."""
    return getattr(training_args, "pad_to_multiple_of", None) or None


# The attention of bf16 autocast on CPU (choose_attention), and the model types whose own eager attention it
# reproduces exactly (Marian / BART / Llama bodies); others (converted checkpoints: soft-capping, sliding windows, ...)
# keep theirs.
CPU_BF16_ATTENTION = "eager_fp32_softmax"


def reproduces_eager_attention(config) -> bool:
    """Whether ``config``'s model asks for ``CPU_BF16_ATTENTION`` (its row of the family table, families/table.py), or
    is the HF parent of such a family (run_translation.py's Marian contender)."""
    row = family_of_config(config) or family_of_source(getattr(config, "model_type", None))
    return row is not None and row.cpu_bf16_eager_attention


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


def register_cpu_bf16_attention() -> None:
    """Register ``eager_attention_fp32_softmax`` (and the additive float mask of "eager") with transformers as
    ``CPU_BF16_ATTENTION``. Called by ``choose_attention`` when a run chooses it, never on import: importing this module
    (the benchmarks do, for ``cpu_description``) changes nothing in transformers. Registering again is harmless."""
    AttentionInterface.register(CPU_BF16_ATTENTION, eager_attention_fp32_softmax)
    AttentionMaskInterface.register(CPU_BF16_ATTENTION, eager_mask)


def choose_attention(model: PreTrainedModel, training_args: TrainingArguments) -> str:
    """The attention a run trains with: ``CPU_BF16_ATTENTION`` under bf16 autocast on CPU for the model types of
    ``reproduces_eager_attention``, else the model's own.
    torch's CPU flash-attention kernel (SDPA) is 2-4x slower in bf16 than in fp32 at these lengths (fwd+bwd of
    batch 64 × 4 heads × 24 tokens: 20 ms vs 7.5 ms, eager bf16 5 ms; in a profiled main-job bf16 step SDPA took
    a quarter of the time), so there the eager matmuls win. Returns a line for the log."""
    on_cpu = training_args.use_cpu or not torch.accelerator.is_available()
    if not (training_args.bf16 and on_cpu and reproduces_eager_attention(model.config)):
        return f"attention: {model.config._attn_implementation} (the model's)"
    register_cpu_bf16_attention()
    model.set_attn_implementation(CPU_BF16_ATTENTION)
    return f"attention: {CPU_BF16_ATTENTION} (bf16 on CPU, where SDPA's fused bf16 kernel is slower than eager)"
