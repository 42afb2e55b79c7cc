"""``TrainingArguments(use_liger_kernel=True)`` with an hf_tiednorm model: served by hf_tiednorm's fused loss or
refused early, by name, never silently nothing.

transformers applies Liger by model type (``_apply_liger_kernel_to_instance``); hf_tiednorm's types are not in
liger-kernel's table, so it would log at INFO level and change nothing, and without liger-kernel the run would fail
only at ``trainer.train()``, after loading and tokenizing. Here instead:

* ``check_liger_installed`` (at argument parsing, before any work): training must have a CUDA device (on a CPU the
  message says so and recommends no install, issue 51) and liger-kernel must be installed;
* ``check_use_liger_kernel`` (once the model is loaded, and in the Trainers' ``__init__``): the model's fused path
  must be able to run liger-kernel's kernel (``liger_refusal``: CUDA, a plain normalized head, a loss
  path that allows it); ``loss_implementation="auto"`` then becomes ``"fused"``, so that every training step runs
  the fused kernel, as Liger's patched forwards do.
"""

from __future__ import annotations

import logging

import torch

from ..modeling.families.table import family_of_config, on_family_registered
from ..modeling.families.wrapped_loss import FUSED_CAUSAL_BODIES
from ..modeling.head.layer import TiedNormHead
from ..modeling.loss.policy import liger_installed

# Why use_liger_kernel cannot run on a machine without CUDA, whether liger-kernel is installed or not.
LIGER_NEEDS_CUDA = (
    "liger-kernel's kernels need CUDA and no CUDA device is available, so installing liger-kernel (the gpu extra) "
    "cannot help here; on this device hf_tiednorm's own fused loss serves the head without the flag "
    "(loss_implementation='fused': the chunked loop)"
)

logger = logging.getLogger(__name__)


def check_liger_installed(training_args) -> None:
    """Raise at once when ``use_liger_kernel`` is set and cannot run: ``ValueError`` where training has no CUDA device
    (``--use_cpu``, or none available; an install cannot help there, issue 51), ``ImportError`` where liger-kernel is
    not installed."""
    if not getattr(training_args, "use_liger_kernel", False):
        return
    if getattr(training_args, "use_cpu", False) or not torch.cuda.is_available():
        where = "--use_cpu is set" if getattr(training_args, "use_cpu", False) else "this machine has no CUDA device"
        raise ValueError(f"--use_liger_kernel is set but {where}: {LIGER_NEEDS_CUDA}; drop --use_liger_kernel")
    if not liger_installed():
        raise ImportError(
            "--use_liger_kernel is set but liger-kernel is not installed: python -m pip install -e '.[gpu]' from a "
            "clone (or drop --use_liger_kernel: hf_tiednorm's fused loss, loss_implementation, needs no flag)"
        )


def _base_model(model):
    get_base = getattr(model, "get_base_model", None)  # a PeftModel
    return get_base() if callable(get_base) else model


def check_use_liger_kernel(model, training_args) -> None:
    """With ``use_liger_kernel`` set, make ``model`` (an hf_tiednorm model, possibly under PEFT) train with
    liger-kernel's fused linear cross-entropy on its normalized head, or raise ``ValueError`` saying why it cannot.
    A model of another library is left to transformers."""
    if not getattr(training_args, "use_liger_kernel", False) or model is None:
        return
    base = _base_model(model)
    config = getattr(base, "config", None)
    if family_of_config(config) is None:  # not a row of the family table: transformers' own Liger patching
        return
    reason = liger_refusal(base)
    if reason is not None:
        raise ValueError(
            f"use_liger_kernel=True cannot run liger-kernel on this {type(base).__name__}: {reason}. transformers' "
            "own Liger patches do not know hf_tiednorm's model types (they would change nothing); drop "
            "use_liger_kernel, hf_tiednorm's loss_implementation chooses the fused loss itself"
        )
    if config.loss_implementation == "auto":
        config.loss_implementation = "fused"
    logger.info("use_liger_kernel: the normalized head's training loss runs liger-kernel's fused linear cross-entropy")


def serve_liger_request(model=None, **_kernel_options) -> None:
    """What ``TrainingArguments(use_liger_kernel=True)`` does to an hf_tiednorm model through liger-kernel's own
    dispatch (``_apply_liger_kernel_to_instance`` looks the model type up in its table): train with liger-kernel's
    fused linear cross-entropy on the normalized head (``auto`` becomes ``fused``), or raise ``ValueError`` naming
    why it cannot. Liger's per-module kernels (RMSNorm, RoPE, SwiGLU) are not applied."""
    reason = liger_refusal(model)
    if reason is not None:
        raise ValueError(f"use_liger_kernel=True cannot run liger-kernel on this {type(model).__name__}: {reason}")
    if model.config.loss_implementation == "auto":
        model.config.loss_implementation = "fused"


def register_with_liger(model_type: str, table: dict | None = None) -> bool:
    """Enter ``model_type`` (a row of the family table, when the package is imported or the row registered) in
    liger-kernel's model-type table (``MODEL_TYPE_TO_APPLY_LIGER_FN``, or ``table``), so that ``use_liger_kernel=True``
    with a plain ``transformers.Trainer`` reaches ``serve_liger_request`` instead of an INFO line that changes nothing.
    Where liger-kernel is not installed or there is no CUDA (it cannot run), nothing is registered: the Trainer's own
    check then fails, or the Trainers of hf_tiednorm refuse by name. Registered without CUDA too: liger-kernel installed
    on a CPU then refuses at ``train()``, naming CUDA (``serve_liger_request``), where the Trainer would train with
    nothing applied and no message (issue 51). Returns whether the type is registered."""
    if table is None:
        if not liger_installed():
            return False
        try:  # an optional extra: in a try block so that remote code does not require it
            from liger_kernel.transformers.monkey_patch import MODEL_TYPE_TO_APPLY_LIGER_FN as table
        except ImportError:
            return False
    table.setdefault(model_type, serve_liger_request)
    return True




def liger_refusal(model) -> str | None:
    """Why ``TrainingArguments(use_liger_kernel=True)`` cannot be served by hf_tiednorm's fused path (liger-kernel's
    fused linear cross-entropy on the normalized head) for ``model``; None when it can. transformers' own Liger
    patching does not know hf_tiednorm's model types and only logs that at INFO level: this says why instead."""
    config = model.config
    head = model.get_output_embeddings()
    if not torch.cuda.is_available():  # asked first: on a CPU no install can help (issue 51)
        return LIGER_NEEDS_CUDA
    if not liger_installed():
        return 'liger-kernel is not installed (python -m pip install liger-kernel, or the gpu extra: -e ".[gpu]")'
    if not isinstance(head, TiedNormHead):
        return "the adaptive softmax head (adaptive_cutoffs) has no fused loss"
    implementation = getattr(config, "loss_implementation", "auto")
    if implementation in ("plain", "chunked"):
        return f"config.loss_implementation={implementation!r} asks for another loss path; set 'auto' or 'fused'"
    if getattr(model, "body_auto_class", None) is not None:  # the wrapper (families/wrapped.py)
        body = config.text_config.model_type  # the wrapped transformers architecture, not a row of the family table
        if config.is_encoder_decoder or body not in FUSED_CAUSAL_BODIES:
            return (
                f"the wrapped {body!r} model has no fused loss in hf_tiednorm (it serves the causal LMs "
                f"{sorted(FUSED_CAUSAL_BODIES)})"
            )
    return None


def register_families_with_liger() -> None:
    """Enter every row of the family table in liger-kernel's model-type table, now and whenever a row is registered
    later (``register_family``): the package's import calls this (``hf_tiednorm/__init__.py``), so a plain
    ``transformers.Trainer(use_liger_kernel=True)`` reaches ``serve_liger_request``."""
    on_family_registered(lambda family: register_with_liger(family.model_type))


__all__ = [
    "check_liger_installed",
    "check_use_liger_kernel",
    "liger_refusal",
    "register_families_with_liger",
    "register_with_liger",
    "serve_liger_request",
]
