"""The Trainer callbacks of a training run (``run_callbacks``): ``TiedWeightsCheck`` checks the tie after the Trainer
prepared the model, on every rank; ``TimeBudgetCallback`` stops training after --max_train_minutes; HF's
``EarlyStoppingCallback`` with --early_stopping_patience."""

from __future__ import annotations

import logging
import time

import torch
from transformers import EarlyStoppingCallback, TrainerCallback

from ..modeling.head.adaptive import embedding_matrices
from ..modeling.weight_checks import check_finite_weights
from .arguments import RunArguments

logger = logging.getLogger(__name__)


class TiedWeightsCheck(TrainerCallback):
    """Checks on every rank, once the Trainer has prepared (wrapped) the model, that its weights are finite (a
    resumed checkpoint's too, which the Trainer loads without ``from_pretrained``'s check) and that the output layer
    still shares the decoder's input embedding matrix (one per band of an adaptive model), and logs how many steps
    each rank trained: with both lines from every rank, a multi-process launch shows that all its processes trained."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # The weights training starts from: a new model's, a saved one's or a resumed checkpoint's (which the Trainer
        # loads without from_pretrained's check), so a NaN there is named instead of training to a nan loss.
        check_finite_weights(model, "the model training starts from (a resumed checkpoint's included)")
        if not model.config.tie_word_embeddings:
            return
        # The decoder's input embedding (of an encoder-decoder; the whole causal LM's) through the accessor, since a
        # converted model keeps its architecture's module names (GPT-2's decoder calls its embedding wte). One matrix
        # each side, or one per band of an adaptive input / softmax, for every model (ours, wrapped, HF's Marian).
        inputs = embedding_matrices(model.get_decoder().get_input_embeddings())
        outputs = embedding_matrices(model.get_output_embeddings())
        tied = len(inputs) == len(outputs) and all(a is b for a, b in zip(inputs, outputs, strict=True))
        logger.info("rank %d: output layer tied to the decoder embedding after prepare: %s", args.process_index, tied)
        if not tied:
            raise RuntimeError("the output layer lost its tie to the decoder input embedding after prepare")

    def on_train_end(self, args, state, control, **kwargs):
        logger.info("rank %d: trained %d steps", args.process_index, state.global_step)


class TimeBudgetCallback(TrainerCallback):
    """Stops training once the budget is spent. One process reads its clock after every step (no tensor, no host
    sync). Several agree every ``agree_every`` steps through one all-reduce (MAX) of a flag on the Trainer's device
    (``args.device``: NCCL serves no CPU tensor), so that no rank waits forever in a collective the others left; all
    ranks count the same steps, so they all reach the same agreement step. The one host read of the agreed flag
    is paid every ``agree_every`` steps, not every step."""

    def __init__(self, minutes: float, agree_every: int = 10):
        if agree_every < 1:
            raise ValueError(f"agree_every must be >= 1, got {agree_every}")
        self.deadline = time.monotonic() + 60 * minutes
        self.agree_every = agree_every

    @staticmethod
    def ranks_over(over: bool, device: torch.device) -> torch.Tensor:
        """The all-reduced (MAX) 0/1 flag of every rank's ``over``, a 0-dim tensor on ``device`` (the device the
        process group's backend serves: the Trainer's)."""
        flag = torch.tensor(float(over), device=device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return flag

    def on_step_end(self, args, state, control, **kwargs):
        over = time.monotonic() > self.deadline
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            if state.global_step % self.agree_every:
                return
            over = bool(self.ranks_over(over, args.device).item())
        if over:
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
