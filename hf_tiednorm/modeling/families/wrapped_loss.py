"""A wrapped causal LM's fused training loss, and the guard that no patched ``forward`` bypasses its head: for an
architecture whose forward is exactly ``lm_head(last hidden state)`` + ``ForCausalLMLoss`` (``FUSED_CAUSAL_BODIES``) the
wrapper computes that loss from the last hidden state on the head's folded weight, never holding the logits;
liger-kernel's class-level forward patches (which would score with the raw tied matrix) are refused by name.
(docs/code_notes.md)"""

from __future__ import annotations

import inspect

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutputWithPast

from ..loss.head_loss import head_linear_cross_entropy
from ..loss.policy import choose_loss_path
from ..loss.token import token_count
from .outputs import CACHE_FIELD

# Causal LMs of transformers whose forward is lm_head(hidden_states) + ForCausalLMLoss and nothing else (Gemma 2/3
# soft-cap the logits, Granite and Cohere scale them: not listed).
FUSED_CAUSAL_BODIES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gpt2", "phi3", "gemma", "smollm3", "olmo2"})
_CHECKED = "_tiednorm_forward_checked"


def _defining_class(cls: type, name: str) -> type | None:
    return next((klass for klass in cls.__mro__ if name in vars(klass)), None)


def patched_forward(body: nn.Module) -> str | None:
    """Where ``body``'s ``forward`` was replaced (a description naming the function), or None when it is the one its
    class's own module defines."""
    if "forward" in vars(body):
        function = getattr(vars(body)["forward"], "__func__", vars(body)["forward"])
        return f"the instance's forward was set to {getattr(function, '__module__', '?')}.{function.__qualname__}"
    owner = _defining_class(type(body), "forward")
    if owner is None:
        return None
    function = inspect.unwrap(vars(owner)["forward"])
    module = getattr(function, "__module__", None)
    if module != owner.__module__:
        return f"{owner.__name__}.forward is {module}.{function.__qualname__}, not the one of {owner.__module__}"
    return None


def refuse_patched_forward(model: nn.Module, body: nn.Module) -> None:
    """Raise ``ValueError`` when ``body``'s ``forward`` was patched (liger-kernel's class-level patches compute the
    training loss from ``lm_head.weight`` directly, bypassing the normalized head); checked once per forward
    function, so a training step costs an attribute comparison."""
    current = vars(body).get("forward") or getattr(type(body), "forward", None)
    if model.__dict__.get(_CHECKED) is current:
        return
    where = patched_forward(body)
    if where is not None:
        raise ValueError(
            f"the wrapped {type(body).__name__}'s forward was patched ({where}): a patched forward such as "
            "liger-kernel's apply_liger_kernel_to_*() / AutoLigerKernelForCausalLM computes the training loss from "
            "lm_head.weight directly, bypassing the normalized head (its normalization and logit scale), while "
            "evaluation and generation still use the head. Load the model without the patch (in a fresh process, "
            "without apply_liger_kernel_to_* or AutoLigerKernelForCausalLM) and use the fused loss of hf_tiednorm "
            "instead (config.loss_implementation='auto' or 'fused': liger-kernel's kernel on the normalized head)"
        )
    model.__dict__[_CHECKED] = current  # not a module attribute: no registration, no state dict entry


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
        raise ValueError(
            f"loss_implementation={implementation!r}: the wrapped {model_type!r} {kind}'s forward does more around "
            "its head than lm_head + cross-entropy, or is not checked for it; the wrapper's fused loss serves the "
            f"causal LMs {sorted(FUSED_CAUSAL_BODIES)}. Set loss_implementation='auto' or 'plain'"
        )
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


__all__ = ["FUSED_CAUSAL_BODIES", "fused_causal_lm_loss", "patched_forward", "refuse_patched_forward"]
