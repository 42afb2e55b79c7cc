"""A wrapped causal LM's fused training loss, and the guard that no patched ``forward`` bypasses its head: for an
architecture whose forward is exactly ``lm_head(last hidden state)`` + ``ForCausalLMLoss`` (``FUSED_CAUSAL_BODIES``) the
wrapper computes that loss from the last hidden state on the head's folded weight, never holding the logits; a body
forward that computed the training loss without running its output layer (liger-kernel's patches) is refused by name,
judged by what ran. (docs/code_notes.md)"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..head.scoring_guard import forward_name
from ..loss.head_loss import head_linear_cross_entropy
from ..loss.policy import choose_loss_path
from ..loss.token import token_count
from .outputs import CACHE_FIELD

# Causal LMs of transformers whose forward is lm_head(hidden_states) + ForCausalLMLoss and nothing else (Gemma 2/3
# soft-cap the logits, Granite and Cohere scale them: not listed).
FUSED_CAUSAL_BODIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "smollm3", "olmo2"})
_CHECKED = "_tiednorm_forward_checked"


@contextmanager
def judging_the_body(model: nn.Module, body: nn.Module, computes_training_loss: bool) -> Iterator[None]:
    """Around the call of the wrapped ``body``: raise ``ValueError`` when it computed the training loss without
    calling its output layer, the normalized head (liger-kernel's patches compute it from ``lm_head.weight``).
    Judged once per forward in effect (a training step then costs an identity comparison): a hook on the head counts
    its calls during that one call, and is removed after it."""
    forward = vars(body).get("forward") or type(body).forward
    if not computes_training_loss or model.__dict__.get(_CHECKED) is forward or torch.compiler.is_compiling():
        yield
        return
    calls = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda *_: calls.append(1))
    try:
        yield
    finally:
        hook.remove()
    if not calls:
        owner = next((k for k in type(body).__mro__ if "forward" in vars(k)), type(body))
        where = "set on the instance" if "forward" in vars(body) else f"{owner.__name__}.forward"
        raise ValueError(f"the wrapped {type(body).__name__}'s forward ({where}, {forward_name(forward)}) computed the "
                         "training loss without calling its output layer, the normalized head: a patched forward such "
                         "as liger-kernel's apply_liger_kernel_to_*() / AutoLigerKernelForCausalLM computes it from "
                         "lm_head.weight directly, bypassing the head (its normalization and logit scale), while "
                         "evaluation and generation still use the head. Load the model without the patch (in a fresh "
                         "process, without apply_liger_kernel_to_* or AutoLigerKernelForCausalLM) and use the fused "
                         "loss of hf_tiednorm instead (config.loss_implementation='auto' or 'fused': liger-kernel's "
                         "kernel on the normalized head)")
    model.__dict__[_CHECKED] = forward  # not a module attribute: no registration, no state dict entry


def fused_causal_lm_loss(model, body, input_ids, attention_mask, labels, num_items_in_batch, skip_logits, kwargs):
    """The wrapped causal LM's output with the loss from a fused path and ``logits=None``, or None when the
    architecture's own forward computes it (evaluation, small logits under ``auto``, ``plain``)."""
    implementation = model.config.loss_implementation
    if not (model.training if skip_logits is None else bool(skip_logits)) or implementation == "plain":
        return None
    model_type = body.config.model_type
    if model_type not in FUSED_CAUSAL_BODIES:
        if implementation == "auto":
            return None
        kind = "encoder-decoder" if body.config.is_encoder_decoder else "causal LM"
        raise ValueError(f"loss_implementation={implementation!r}: the wrapped {model_type!r} {kind}'s forward does "
                         "more around its head than lm_head + cross-entropy, or is not checked for it; the wrapper's "
                         f"fused loss serves the causal LMs {sorted(FUSED_CAUSAL_BODIES)}. Set "
                         "loss_implementation='auto' or 'plain'")
    shift_labels = kwargs.pop("shift_labels", None)
    targets = shift_labels if shift_labels is not None else F.pad(labels, (0, 1), value=-100)[..., 1:]
    head = model.get_output_embeddings()
    path = choose_loss_path(implementation, head, targets.numel())
    if path == "plain":
        if shift_labels is not None:
            kwargs["shift_labels"] = shift_labels
        return None
    kwargs.pop("logits_to_keep", None)  # every position is scored for the loss
    outputs = body.base_model(input_ids=input_ids, attention_mask=attention_mask, **kwargs | {"return_dict": True})
    hidden = outputs.last_hidden_state
    flat_targets = targets.reshape(-1).to(hidden.device)
    total = head_linear_cross_entropy(head, hidden.reshape(-1, hidden.shape[-1]), flat_targets, path)
    loss = total / token_count(flat_targets, num_items_in_batch).to(total.device)
    return CausalLMOutputWithPast(
        loss=loss.to(torch.float32) if loss.dtype != torch.float64 else loss,
        logits=None,
        **{CACHE_FIELD: getattr(outputs, CACHE_FIELD, None)},
        hidden_states=getattr(outputs, "hidden_states", None),
        attentions=getattr(outputs, "attentions", None),
    )


__all__ = ["FUSED_CAUSAL_BODIES", "fused_causal_lm_loss", "judging_the_body"]
