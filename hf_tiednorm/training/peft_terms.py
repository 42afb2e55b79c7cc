"""Train the head's learned terms (the logit scale g, the logit bias b, any registered term) beside a PEFT adapter,
saved with it and restored by ``PeftModel.from_pretrained``.

Under ``get_peft_model`` every base parameter is frozen, the head's g and b too: LoRA on attention trains around the
per-token prior a lossless start put into g. Unfreezing them by hand (``requires_grad_(True)``) trains them, but
PEFT's ``save_pretrained`` writes only what an adapter owns, so they were lost at save with no warning (a reloaded
SmolLM2 gave logits 0.55 off, issue 60); the model now refuses that at its next call (``head/peft_guard.py``).
PEFT's own ways do not fit: ``modules_to_save=["lm_head"]`` trains a copy of the whole head, shared matrix included
(it unties it), and ``save_embedding_layers=True`` writes the V × d matrix twice to keep two V-vectors.

``train_head_terms(model)`` makes the head take part in PEFT as one more auxiliary module, the protocol of PEFT's
``modules_to_save`` (``peft.utils.other.AuxiliaryTrainingWrapper``), for its learned terms only and without a copy of
W: the head's class is extended in place (so it stays the model's ``TiedNormHead``, tied, served to TRL as before)
and its terms train for one adapter:

* saved: ``save_pretrained`` writes them into ``adapter_model.safetensors`` under the base model's own names
  (``base_model.model.lm_head.logit_scale``), beside the adapter's weights, V floats each;
* restored: ``PeftModel.from_pretrained(base, folder)`` loads every saved key that names a base parameter, so they
  land in the fresh base model's head (the load needs no hf_tiednorm: remote code does), and so does a Trainer's
  resume (``load_adapter``);
* the base model stays the base: with the adapter disabled or another one active (``disable_adapter()``, TRL's
  reference adapter in DPO) the head scores with the terms it had before training, a frozen copy kept beside them
  (non-persistent buffers: moved with the model, never saved);
* ``merge_and_unload()`` keeps the trained terms in the plain head, as PEFT keeps a trained ``modules_to_save``.

This module needs peft (``python -m pip install -e ".[peft]"``) and is never part of a saved model's code.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from peft.utils.other import AuxiliaryTrainingWrapper
from torch import nn

from ..modeling.head.peft_guard import check_again

# Where a head under train_head_terms keeps the frozen start of each term it trains (non-persistent buffers).
_BASE_PREFIX = "peft_base_"


class HeadTermsTraining(AuxiliaryTrainingWrapper):
    """What ``train_head_terms`` adds to the class of a ``TiedNormHead``: PEFT's auxiliary-module protocol for the
    head's learned terms. Never built on its own: mixed into the head's own class, in front of it, and removed again
    by ``merge_and_unload``, ``unload`` or deleting the adapter.

    State kept on the head: ``peft_trained_terms`` (the names of the parameters it trains), ``peft_head_class`` (its
    class before), PEFT's ``_adapters`` / ``_active_adapter`` / ``_disable_adapters``, and a frozen buffer
    ``peft_base_<name>`` per term.
    """

    adapter_layer_names: tuple[str, ...] = ()
    other_param_names: tuple[str, ...] = ()

    # -- which values the head scores with ------------------------------------------------------------------------
    def __getattr__(self, name: str):
        # nn.Module keeps parameters in _parameters, so reading head.logit_scale ends here: the trained parameter while
        # the adapter that trains it is active, the frozen start otherwise (adapters disabled, another adapter).
        terms = self.__dict__.get("peft_trained_terms", ())
        if name in terms and not self._terms_active():
            return nn.Module.__getattr__(self, _BASE_PREFIX + name)
        return nn.Module.__getattr__(self, name)

    def _terms_active(self) -> bool:
        return not self._disable_adapters and any(name in self._adapters for name in self.active_adapters)

    def forward(self, hidden_states: torch.Tensor, *args, adapter_names=None, **kwargs) -> torch.Tensor:
        if adapter_names is not None:  # PEFT's mixed-adapter batches (one adapter per row): the head has one set
            raise ValueError(
                "a batch mixing adapters (adapter_names=...) cannot score with the head's terms trained by "
                "train_head_terms: the head holds one trained set; call the model with one active adapter"
            )
        return super(AuxiliaryTrainingWrapper, self).forward(hidden_states, *args, **kwargs)

    # -- PEFT's protocol (peft.utils.other.AuxiliaryTrainingWrapper) ----------------------------------------------
    def _error_message_name(self) -> str:
        return "train_head_terms"

    def _get_available_adapters(self) -> set[str]:
        return set(self._adapters)

    def update(self, adapter_name, **kwargs) -> None:
        raise ValueError(
            f"the head's terms train with one adapter ({sorted(self._adapters)}); to train them with "
            f"{adapter_name!r} instead, merge_and_unload() or delete that adapter first"
        )

    def _trained(self) -> list[nn.Parameter]:
        return [self._parameters[name] for name in self.peft_trained_terms]

    def check_set_adapter(self, adapter_name: str | list[str]) -> str | None:
        if isinstance(adapter_name, str):
            return adapter_name
        ours = [name for name in adapter_name if name in self._adapters]
        return ours[0] if ours else None

    def set_adapter(self, adapter_names: str | list[str], inference_mode: bool = False) -> None:
        names = [adapter_names] if isinstance(adapter_names, str) else list(adapter_names)
        self._active_adapter = [name for name in names if name in self._adapters]
        for parameter in self._trained():
            parameter.requires_grad_(bool(self._active_adapter) and not inference_mode)

    def enable_adapters(self, enabled: bool) -> None:
        self._disable_adapters = not enabled
        for parameter in self._trained():
            parameter.requires_grad_(enabled and self._terms_active())

    def set_requires_grad(self, adapter_names: str | Iterable[str], requires_grad: bool = True) -> None:
        names = {adapter_names} if isinstance(adapter_names, str) else set(adapter_names)
        if names & self._adapters:
            for parameter in self._trained():
                parameter.requires_grad_(requires_grad)

    def adapter_state_dict(self, adapter_name: str, state_dict: dict) -> dict:
        # Keys relative to the head ("logit_scale"): get_peft_model_state_dict prefixes the head's own name, which is
        # the base model's, so PeftModel.from_pretrained loads them into a fresh base model's head as they are.
        if adapter_name not in self._adapters:
            return {}
        return {name: state_dict[name] for name in self.peft_trained_terms}

    def adapter_state_dict_load_map(self, adapter_name: str) -> dict:
        # Nothing to translate: the saved keys are the head's own names, which set_peft_model_state_dict passes to
        # load_state_dict as they are (it deletes a translated key after storing it, so a 1:1 entry would drop it).
        return {}

    def delete_adapter(self, adapter_name: str, new_active_adapters) -> None:
        if adapter_name in self._adapters:
            release_head_terms(self, keep_trained=False)

    def unload_and_optionally_merge_module(self, merge: bool, safe_merge: bool, adapter_names) -> nn.Module:
        # As PEFT's modules_to_save: the trained values stay in the unloaded model (merged or not), if they were active.
        release_head_terms(self, keep_trained=self._terms_active())
        return self


def _head_of(model: nn.Module) -> tuple[str, nn.Module]:
    """(name, head) of the model's normalized tied head, by class name: the package's ``TiedNormHead`` or the one a
    folder's remote code defines."""
    found = [(name, module) for name, module in model.named_modules()
             if any(cls.__name__ == "TiedNormHead" for cls in type(module).__mro__)]  # fmt: skip
    if len(found) != 1:
        raise ValueError(
            f"train_head_terms needs a model with one normalized tied head (TiedNormHead), found {len(found)}: "
            "an hf_tiednorm model (own family or converted) under get_peft_model"
        )
    return found[0]


def _is_peft(model: nn.Module) -> bool:
    names = {cls.__name__ for module in model.modules() for cls in type(module).__mro__}
    return "BaseTunerLayer" in names or "PeftModel" in names


_EXTENDED: dict[type, type] = {}


def _extended(head_class: type) -> type:
    """``head_class`` with ``HeadTermsTraining`` in front, made once per class."""
    if head_class not in _EXTENDED:
        _EXTENDED[head_class] = type(head_class.__name__, (HeadTermsTraining, head_class), {
            "__module__": __name__, "__qualname__": f"HeadTermsTraining[{head_class.__qualname__}]"})  # fmt: skip
    return _EXTENDED[head_class]


def train_head_terms(
    model: nn.Module, terms: Iterable[str] | None = None, adapter_name: str | None = None
) -> list[str]:
    """Train the head's learned terms with a PEFT adapter, saved with it and restored by
    ``PeftModel.from_pretrained``.

    Call it after ``get_peft_model`` and before training (a Trainer or TRL trainer given the returned ``PeftModel``
    then trains, checkpoints and resumes them with the adapter)::

        model = get_peft_model(model, LoraConfig(target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
        train_head_terms(model)            # g and b train beside LoRA
        ...                                # train
        model.save_pretrained("adapter")   # LoRA + g and b, V floats each
        PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), "adapter")  # the same logits

    Args:
        model: the ``PeftModel`` (any PEFT method) of an hf_tiednorm model, or a model PEFT injected adapters into.
        terms: the head's parameters to train, by name (``"logit_scale"``, ``"logit_bias"``, a registered term's
            name); None: every learned term the head holds.
        adapter_name: the adapter they train with (and are saved with); None: the active one.

    Returns:
        The trained parameters' names in ``model`` (``named_parameters``), e.g.
        ``["base_model.model.lm_head.logit_scale", "base_model.model.lm_head.logit_bias"]``.
    """
    if not _is_peft(model):
        raise ValueError(
            "train_head_terms takes the model get_peft_model returned (or one PEFT injected adapters into): without "
            "an adapter there is nothing to save the terms with; a model trained whole trains and saves its head's "
            "terms as it is"
        )
    head_name, head = _head_of(model)
    if isinstance(head, HeadTermsTraining):
        raise ValueError(f"{head_name}'s terms train with adapter {sorted(head._adapters)} already")
    held = [name for name, _ in head.named_parameters(recurse=False) if name != "weight"]
    chosen = held if terms is None else list(terms)
    unknown = [name for name in chosen if name not in held]
    if unknown or not chosen:
        raise ValueError(
            f"{head_name} holds no learned term {unknown or ''}: its learned terms are {held or 'none'} (a head with "
            "none scores with the shared matrix alone; convert with --lossless-start or a learned --logit-scale-kind "
            "/ --logit-bias to have terms to train)"
        )
    active = getattr(model, "active_adapter", None)
    adapter_name = adapter_name or (active if isinstance(active, str) else active[0] if active else "default")
    if adapter_name not in getattr(model, "peft_config", {adapter_name: None}):
        raise ValueError(f"no adapter {adapter_name!r} in the model (its adapters: {sorted(model.peft_config)})")
    original = type(head)
    for name in chosen:
        head.register_buffer(_BASE_PREFIX + name, head._parameters[name].detach().clone(), persistent=False)
    head.peft_trained_terms = tuple(chosen)
    head.peft_head_class = original
    head._adapters, head._active_adapter, head._disable_adapters = {adapter_name}, [adapter_name], False
    head.__class__ = _extended(original)
    head.set_adapter([adapter_name])  # the terms require grad while their adapter is active
    check_again(model)  # the guard judges the head again: its terms are now saved with the adapter
    return [f"{head_name}.{name}" for name in chosen]


def release_head_terms(head: nn.Module, keep_trained: bool) -> None:
    """Give ``head`` its own class back and drop what ``train_head_terms`` added; ``keep_trained``: keep the trained
    values (a merge), else put the frozen start back (the adapter deleted)."""
    if not isinstance(head, HeadTermsTraining):
        return
    with torch.no_grad():
        for name in head.peft_trained_terms:
            base = head._buffers.pop(_BASE_PREFIX + name)
            if not keep_trained:
                head._parameters[name].copy_(base)
    head.__class__ = head.peft_head_class
    check_again(head)
    for attribute in ("peft_trained_terms", "peft_head_class", "_adapters", "_active_adapter", "_disable_adapters"):
        head.__dict__.pop(attribute, None)


__all__ = ["HeadTermsTraining", "release_head_terms", "train_head_terms"]
