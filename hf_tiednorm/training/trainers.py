"""The Trainers of the training scripts: ``TiedNormTrainer`` (scripts/run_clm.py) and ``TiedNormSeq2SeqTrainer``
(scripts/run_translation.py, which also evaluates in dataset order). Both log each term of the model's loss
(cross-entropy, projection and weight-norm penalties) next to ``loss``; ``add_perplexity`` completes evaluation metrics.

transformers' ``Trainer`` logs only the total ``loss`` (as of v5 there is no built-in hook for auxiliary loss
terms; huggingface/transformers#45270 and #45558 propose one), and its documented extension points are
``compute_loss`` and ``log`` ("Subclass and override"). ``LossTermsLoggingMixin`` overrides exactly those two;
``TiedNormTrainer`` and ``TiedNormSeq2SeqTrainer`` put it in front of the HF classes::

    class TiedNormSeq2SeqTrainer(LigerRequestMixin, NamedWriteErrorsMixin, LossTermsLoggingMixin, Seq2SeqTrainer): ...

Every training log then carries ``cross_entropy`` and each enabled penalty, averaged over the same optimizer
steps as ``loss``, so that ``loss == cross_entropy + projection_penalty + weight_norm_penalty`` in the logs too.

An evaluation loss is the mean cross-entropy plus the same penalties (they depend on the weights only, not on the
batch); the model's ``penalty_terms()`` gives them (``penalty_values``), and ``add_perplexity`` takes the perplexity
of the cross-entropy alone.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import Dataset, Sampler, SequentialSampler
from transformers import Seq2SeqTrainer, Trainer
from transformers.trainer_pt_utils import nested_gather
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, has_length

from ..modeling.loss.model_loss import TiedNormLossMixin
from ..modeling.loss.regularizers import LOSS_TERMS
from .liger import check_liger_installed, check_use_liger_kernel
from .run_directory import describe_write_error


class LossTermsLoggingMixin:
    """Put before ``Trainer`` (or ``Seq2SeqTrainer``) in the bases of a Trainer class."""

    def __init__(self, *args, **kwargs):
        # Per-term sums of the training steps since the last log, and the last step completed before they began.
        self._loss_term_sums: dict[str, torch.Tensor] = {}
        self._loss_terms_last_step = 0
        super().__init__(*args, **kwargs)

    def compute_loss(self, model, inputs, return_outputs: bool = False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(
            model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch
        )
        if model.training and isinstance(outputs, dict):
            sums = self._loss_term_sums
            if not sums:  # the first micro-batch since the last log: remember the last completed step
                self._loss_terms_last_step = self.state.global_step
            # The Trainer divides a per-batch loss by the accumulation steps; a loss normalized by
            # num_items_in_batch is already a share of the step (see loss.TiedNormLossMixin.compose_loss).
            divisor = 1 if num_items_in_batch is not None else self.current_gradient_accumulation_steps
            scale = self._device_loss_scale(num_items_in_batch)
            for name in LOSS_TERMS:
                if outputs.get(name) is not None:
                    term = outputs[name].detach().float() * scale / divisor
                    sums[name] = sums.get(name, 0.0) + term
        return (loss, outputs) if return_outputs else loss

    def _device_loss_scale(self, num_items_in_batch) -> int:
        """The factor by which ``Trainer.compute_loss`` multiplies the model's loss (and so the logged ``loss``) but
        not the terms in its outputs: with ``average_tokens_across_devices`` the model divides by the token count of
        all processes, and the Trainer multiplies by the number of processes so that DDP's gradient mean comes out
        right (the same condition and factor as transformers 5's ``Trainer.compute_loss``). Without it the logged
        terms were a 1/processes share: ``cross_entropy`` 3.943 beside ``loss`` 7.886 on 2 processes."""
        args = self.args
        if not (args.average_tokens_across_devices and num_items_in_batch is not None
                and (self.model_accepts_loss_kwargs or self.compute_loss_func)):
            return 1
        return self.accelerator.num_processes // self.get_tp_size() if args.n_gpu <= 1 else args.n_gpu

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        sums = self._loss_term_sums
        if "loss" in logs and sums:  # a training log: average the terms over the steps since the last one
            # Counted from the first step that added to the sums (not from 0), so a resumed run averages right too.
            steps = max(self.state.global_step - self._loss_terms_last_step, 1)
            for name, total in sums.items():
                logs[name] = nested_gather(torch.as_tensor(total), self.args.parallel_mode).mean().item() / steps
            sums.clear()
        super().log(logs, start_time)


class NamedWriteErrorsMixin:
    """A checkpoint save that fails says which checkpoint and why: a full disk reads "no space left on device while
    writing <output_dir>/checkpoint-N" instead of torch's ``RuntimeError: basic_ios::clear: iostream error``. The
    half-written folder lacks trainer_state.json, so resuming skips it (``run_directory.checkpoint_problems``)."""

    def _save_checkpoint(self, model, trial):
        try:
            return super()._save_checkpoint(model, trial)
        except (OSError, RuntimeError) as error:
            path = f"{self._get_output_dir(trial=trial)}/{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            raise describe_write_error(error, path) from error


@torch.no_grad()
def penalty_values(model) -> dict[str, float]:
    """The values of the enabled penalties of ``model``'s loss (its ``penalty_terms()``, ``loss.TiedNormLossMixin``)
    at its current weights, as they enter a loss without gradient accumulation (an evaluation loss); none for a model
    without hf_tiednorm's loss (a wrapped architecture, the HF Marian contender of scripts/run_translation.py)."""
    if not isinstance(model, TiedNormLossMixin):
        return {}
    return {name: float(value) for name, value in model.penalty_terms().items()}


def add_perplexity(metrics: dict[str, float], prefix: str, model) -> None:
    """Add ``{prefix}_cross_entropy`` (``{prefix}_loss`` without ``model``'s penalties) and ``{prefix}_perplexity``
    (its exp, capped at exp(50) so that a diverged run still writes a finite number) to evaluation ``metrics``."""
    cross_entropy = metrics[f"{prefix}_loss"] - sum(penalty_values(model).values())
    metrics[f"{prefix}_cross_entropy"] = cross_entropy
    metrics[f"{prefix}_perplexity"] = math.exp(min(cross_entropy, 50.0))


class LigerRequestMixin:
    """``use_liger_kernel=True`` served by the model's fused loss or refused here, at construction (liger.py)."""

    def __init__(self, *args, **kwargs):
        model = kwargs.get("model", args[0] if args else None)
        training_args = kwargs.get("args", args[1] if len(args) > 1 else None)
        check_liger_installed(training_args)
        check_use_liger_kernel(model, training_args)
        super().__init__(*args, **kwargs)


class TiedNormTrainer(LigerRequestMixin, NamedWriteErrorsMixin, LossTermsLoggingMixin, Trainer):
    """``Trainer`` whose training logs carry each loss term next to ``loss`` (scripts/run_clm.py)."""


class TiedNormSeq2SeqTrainer(LigerRequestMixin, NamedWriteErrorsMixin, LossTermsLoggingMixin, Seq2SeqTrainer):
    """``Seq2SeqTrainer`` whose training logs carry each loss term next to ``loss`` (scripts/run_translation.py),
    which evaluates in dataset order, and during training with ``--generation_num_beams_during_training`` beams."""

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs):
        # An evaluation during training (the Trainer's documented ``is_in_train``) decodes with
        # --generation_num_beams_during_training when set; one called with its own num_beams keeps it.
        beams = getattr(self.args, "generation_num_beams_during_training", None)
        if self.is_in_train and beams is not None and gen_kwargs.get("num_beams") is None:
            gen_kwargs["num_beams"] = beams
        return super().evaluate(eval_dataset, ignore_keys, metric_key_prefix, **gen_kwargs)

    def _get_eval_sampler(self, eval_dataset: Dataset) -> Sampler | None:
        # transformers 5 length-groups evaluation batches too under train_sampling_strategy="group_by_length";
        # generated predictions would then come back shuffled against the references they are scored with.
        # Keep HF's ungrouped choice: sequential on one process, accelerate's ordered split on several.
        if eval_dataset is None or not has_length(eval_dataset):
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None


__all__ = ["LossTermsLoggingMixin", "TiedNormSeq2SeqTrainer", "TiedNormTrainer", "add_perplexity", "penalty_values"]
