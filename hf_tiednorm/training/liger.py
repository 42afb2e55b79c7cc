"""``TrainingArguments(use_liger_kernel=True)`` with an hf_tiednorm model: served by hf_tiednorm's fused loss or
refused early, by name, never silently nothing.

transformers applies Liger by model type (``_apply_liger_kernel_to_instance``); hf_tiednorm's types are not in
liger-kernel's table, so it would log at INFO level and change nothing, and without liger-kernel the run would fail
only at ``trainer.train()``, after loading and tokenizing. Here instead:

* ``check_liger_installed`` (at argument parsing, before any work): training must have a CUDA device (on a CPU the
  message says so and recommends no install, issue 51) and liger-kernel must be installed;
* ``check_use_liger_kernel`` (once the model is loaded, and in the Trainers' ``__init__``): the model's fused path
  must be able to run liger-kernel's kernel (``fused_loss.liger_refusal``: CUDA, a plain normalized head, a loss
  path that allows it); ``loss_implementation="auto"`` then becomes ``"fused"``, so that every training step runs
  the fused kernel, as Liger's patched forwards do.
"""

from __future__ import annotations

import logging

import torch

from ..fused_loss import LIGER_NEEDS_CUDA, liger_installed, liger_refusal

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
    if not str(getattr(config, "model_type", "")).startswith("tiednorm"):
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


__all__ = ["check_liger_installed", "check_use_liger_kernel"]
