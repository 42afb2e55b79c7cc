"""``generate`` of every family (cosine and baseline) and of the wrapper (around a tied Llama, Qwen3, GPT-2 and
BART) passes the generation checks of tests/generation_checks.py, our equivalent of HF's generation mixin (issue 46),
the static cache with transformers' automatic compile and what HF's mixin reads of a model's forward and class
included (issue 57: the wrapper generates on itself, not through the model it wraps), and what HF's mixin skipped the
wrapper for (its class flags read on the class: assisted decoding and sampling, packed sequences).

Contrastive search is not checked: transformers 5 no longer implements it (``penalty_alpha`` dispatches to the Hub
repository transformers-community/contrastive-search, remote code this offline suite does not fetch).
"""

from __future__ import annotations

import copy

import generation_checks as checks
import pytest
from testing_utils import tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head

FAMILIES = ("causal", "seq2seq", "bart")
WRAPPED = ("llama", "qwen3", "gpt2", "bart")
MODELS = [f"{family}-{mode}" for family in FAMILIES for mode in ("cosine", "baseline")] + [
    f"wrapped_{name}-{mode}" for name in WRAPPED for mode in ("cosine", "baseline")]
# The default run: one of each kind (the rest is marked slow).
FAST = {"causal-cosine", "seq2seq-cosine", "wrapped_qwen3-cosine", "wrapped_bart-cosine"}


def build(name: str):
    kind, mode = name.split("-")
    if kind.startswith("wrapped_"):
        model = normalize_tied_head(source_model(kind.removeprefix("wrapped_")), mode, generic=True)
    else:
        model = tiny_model(kind, head_mode=mode, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           **({"decoder_start_token_id": 0} if kind != "causal" else {}))
    return model.eval()


PARAMS = [pytest.param(name, marks=() if name in FAST else pytest.mark.slow) for name in MODELS]
CHECKS = {
    "greedy_and_cache": checks.check_greedy_equals_full_forward,
    "sampling": checks.check_sampling,
    "beam": checks.check_beam_search,
    "left_padding": checks.check_left_padding,
    "inputs_embeds": checks.check_inputs_embeds,
    "compiled_static_cache": checks.check_compiled_static_cache,
    "compiled_fullgraph": checks.check_compiled_forward_fullgraph,
    "static_cache_shorter": checks.check_static_cache_no_recompile_when_shorter,
    "logits_to_keep": checks.check_logits_to_keep,
    "position_ids": checks.check_position_ids,
    "padding_free": checks.check_padding_free,
}


@pytest.fixture(scope="module")
def models():
    return {}


# torch.compile's checks take 5-15 s each; by default they run on the wrapper (issue 57: HF's compile tests failed
# there), the own families' with -m slow (HF's common model tests compile them too).
COMPILED = {"compiled_static_cache", "compiled_fullgraph", "static_cache_shorter"}
CHECK_PARAMS = [
    pytest.param(name.values[0], check, marks=[*name.marks, *(
        [pytest.mark.slow] if check in COMPILED and not name.values[0].startswith("wrapped_") else [])])
    for name in PARAMS for check in CHECKS
]


@pytest.mark.parametrize(("name", "check"), CHECK_PARAMS)
def test_generation(name, check, models):
    if name not in models:
        models[name] = build(name)
    CHECKS[check](models[name])


@pytest.mark.parametrize("name", PARAMS)
def test_backend_flags(name, models):
    """The wrapper's flags are those of the class it wraps; a family's are its own class's."""
    if name not in models:
        models[name] = build(name)
    model = models[name]
    checks.check_backend_flags(model, type(model.model) if name.startswith("wrapped_") else None)


@pytest.mark.parametrize("sampling", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("name", PARAMS)
def test_assisted_decoding(name, sampling, models):
    """The assistant is a copy of the model with noisy embeddings, so that it proposes tokens the model rejects: the
    output is still the model's greedy one (``logits_to_keep`` set to the candidates' length at each check, as
    transformers sets it for a forward that names it); so is it with the model as its own assistant."""
    if name not in models:
        models[name] = build(name)
    model = models[name]
    assistant = copy.deepcopy(model)
    head = assistant.get_output_embeddings()
    head.weight.data.add_(0.5 * head.weight.data.std() * __import__("torch").randn_like(head.weight))
    (checks.check_assisted_sampling if sampling else checks.check_assisted_decoding)(model, assistant)
