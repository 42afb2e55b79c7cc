"""Each of ``post_init`` and ``resize_token_embeddings`` is overridden by one class of this package in a model's
bases, so that what runs (the tie declaration; the special-token check, the resize and the head's per-token terms)
is written in one place; and the behaviour those overrides carried is kept."""

from __future__ import annotations

import pytest
import torch
from testing_utils import FAMILIES, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head


def models():
    yield from ((family, tiny_model(family)) for family in FAMILIES)
    yield "wrapped", normalize_tied_head(source_model("llama"), "cosine", generic=True)


def own_overrides(model, method: str) -> list[str]:
    return [
        klass.__qualname__
        for klass in type(model).__mro__
        if method in vars(klass) and klass.__module__.split(".")[0] == "hf_tiednorm"
    ]


@pytest.mark.parametrize("method", ["post_init", "resize_token_embeddings"])
def test_each_hook_is_overridden_once(method):
    for name, model in models():
        assert len(own_overrides(model, method)) <= 1, (name, own_overrides(model, method))


def test_the_overrides_behaviour_is_kept():
    for name, model in models():
        eos = model.config.get_text_config().eos_token_id
        with pytest.raises(ValueError, match="would drop the special token"):
            model.resize_token_embeddings(eos)
        if name != "wrapped":  # the PEFT guard: one forward pre-hook, however often post_init runs
            model.post_init()
            hooks = [hook for hook in model._forward_pre_hooks.values() if hook.__name__ == "refuse_bypassed_head"]
            assert len(hooks) == 1, name
        vocab = model.get_output_embeddings().weight.shape[0]
        model.resize_token_embeddings(vocab + 2)
        assert model.get_output_embeddings().weight.shape[0] == vocab + 2, name
        assert torch.isfinite(model.get_output_embeddings().weight).all()
