"""Checks of ``generate`` that hold for any HF generative model, written once and run over every family and the
wrapper (tests/modeling/families/test_hf_common_generation.py). The transformers sdist ships no
``tests/generation/``; these are our own checks of what its ``GenerationTesterMixin`` covers: greedy, sampling, beam,
assisted decoding, the KV cache against a full forward, left padding, ``inputs_embeds``, ``output_scores`` /
``output_logits`` and ``num_return_sequences``; generation with a static cache and transformers' automatic compile
(the compiled call kept on the model itself, a full graph, no recompile for a shorter generation:
``test_generate_compilation_all_outputs``, ``test_generate_compile_model_forward_fullgraph``,
``test_static_cache_no_recompile_with_smaller_length`` of HF's mixin); and what HF's mixin skips a model for when its
forward does not name it (``logits_to_keep``, ``position_ids``) or its class does not declare it, read on the class
(``_supports_attention_backend``, ``_is_stateful``): assisted decoding with
an assistant whose proposals are rejected and with one whose proposals are all accepted, assisted sampling, and
packed (padding-free) sequences with eager attention and SDPA.

Every check compares ``generate`` with full forwards of the model itself (no cache), so a cache, a padding or a head
that ``generate`` used differently from ``forward`` shows. ``min_new_tokens`` keeps every sequence to the same length
(the end token is barred until then), and a fresh ``GenerationConfig`` holding only the special tokens keeps the
checkpoint's processors (forced tokens, banned words) out of the comparison.
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager

import pytest
import torch
from transformers import CompileConfig, GenerationConfig

NEW = 4  # new tokens per check


def generation_config(model, **settings) -> GenerationConfig:
    """The special tokens of ``model`` and ``settings``, every new token generated (no early end)."""
    own = model.generation_config
    pad = own.pad_token_id if own.pad_token_id is not None else model.config.pad_token_id
    return GenerationConfig(
        pad_token_id=0 if pad is None else pad,
        eos_token_id=own.eos_token_id,
        bos_token_id=own.bos_token_id,
        decoder_start_token_id=own.decoder_start_token_id,
        max_new_tokens=NEW,
        min_new_tokens=NEW,
        **settings,
    )


@contextmanager
def without_forced_tokens(model):
    """``model``'s generation config without forced first/last tokens (BART's ``forced_eos_token_id``), which
    ``generate`` applies from the model's own config even under another one, and which overrule the scores."""
    own = model.generation_config
    saved = own.forced_bos_token_id, own.forced_eos_token_id
    own.forced_bos_token_id = own.forced_eos_token_id = None
    try:
        yield
    finally:
        own.forced_bos_token_id, own.forced_eos_token_id = saved


def prompt(model, batch: int = 2, length: int = 6, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, model.config.get_text_config().vocab_size, (batch, length), generator=generator)
    return {"input_ids": ids.to(model.device), "attention_mask": torch.ones_like(ids).to(model.device)}


def new_tokens(model, sequences: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The generated part of ``sequences`` (an encoder-decoder's start token and a decoder-only's prompt dropped)."""
    return sequences[:, 1:] if model.config.is_encoder_decoder else sequences[:, inputs["input_ids"].shape[1]:]


@torch.no_grad()
def full_forward_logits(model, inputs: dict, generated: torch.Tensor) -> torch.Tensor:
    """(batch, NEW, V) logits for each generated token, from one forward over the whole sequence without a cache."""
    if model.config.is_encoder_decoder:
        start = torch.full_like(generated[:, :1], model.generation_config.decoder_start_token_id)
        decoder = torch.cat([start, generated[:, :-1]], dim=1)
        return model(**inputs, decoder_input_ids=decoder, use_cache=False).logits
    ids = torch.cat([inputs["input_ids"], generated], dim=1)
    mask = torch.cat([inputs["attention_mask"], torch.ones_like(generated)], dim=1)
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return logits[:, inputs["input_ids"].shape[1] - 1 : -1]


def check_greedy_equals_full_forward(model) -> None:
    """Greedy decoding with the cache: each step's raw logits (``output_logits``) are the full forward's, each
    token is the argmax of its processed scores (``output_scores``)."""
    inputs = prompt(model)
    with without_forced_tokens(model):
        out = model.generate(**inputs, generation_config=generation_config(
            model, do_sample=False, output_logits=True, output_scores=True, return_dict_in_generate=True))
    generated = new_tokens(model, out.sequences, inputs)
    assert generated.shape == (2, NEW)
    logits, scores = torch.stack(out.logits, dim=1), torch.stack(out.scores, dim=1)
    torch.testing.assert_close(logits, full_forward_logits(model, inputs, generated), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(scores.argmax(-1), generated)


def check_sampling(model) -> None:
    """Seeded sampling repeats itself; ``top_k=1`` sampling is greedy; ``num_return_sequences`` rows per prompt."""
    inputs = prompt(model)
    config = generation_config(model, do_sample=True, top_k=0, temperature=1.5, num_return_sequences=3)
    torch.manual_seed(1)
    first = model.generate(**inputs, generation_config=config)
    torch.manual_seed(1)
    again = model.generate(**inputs, generation_config=config)
    torch.testing.assert_close(first, again)
    assert new_tokens(model, first, inputs).shape == (6, NEW)
    greedy = model.generate(**inputs, generation_config=generation_config(model, do_sample=False))
    top1 = model.generate(**inputs, generation_config=generation_config(model, do_sample=True, top_k=1))
    torch.testing.assert_close(top1, greedy)


def check_beam_search(model) -> None:
    """Beam search (3 beams, 2 returned): each returned sequence's score is the sum of its tokens' log-probabilities
    under a full forward (``length_penalty=0``), the best first, and the two differ."""
    inputs = prompt(model)
    with without_forced_tokens(model):
        out = model.generate(**inputs, generation_config=generation_config(
            model, num_beams=3, num_return_sequences=2, length_penalty=0.0, output_scores=True,
            return_dict_in_generate=True))
    generated = new_tokens(model, out.sequences, inputs)
    assert generated.shape == (4, NEW)
    repeated = {k: v.repeat_interleave(2, dim=0) for k, v in inputs.items()}
    log_probs = full_forward_logits(model, repeated, generated).float().log_softmax(-1)
    expected = log_probs.gather(-1, generated[..., None]).squeeze(-1).sum(-1)
    torch.testing.assert_close(out.sequences_scores, expected, atol=1e-4, rtol=1e-4)
    assert (out.sequences_scores[0::2] >= out.sequences_scores[1::2] - 1e-6).all()
    assert not torch.equal(generated[0::2], generated[1::2])


@contextmanager
def proposing(assistant, tokens: int = 2):
    """``assistant`` proposes ``tokens`` tokens at each call (a constant schedule), so that the model checks several
    proposals in one forward and runs more than one such forward (HF's assisted-decoding tests set the same)."""
    own = assistant.generation_config
    saved = own.num_assistant_tokens, own.num_assistant_tokens_schedule
    own.num_assistant_tokens, own.num_assistant_tokens_schedule = tokens, "constant"
    try:
        yield assistant
    finally:
        own.num_assistant_tokens, own.num_assistant_tokens_schedule = saved


def check_assisted_decoding(model, assistant) -> None:
    """Greedy assisted decoding (an assistant proposing tokens, the model checking them) gives greedy's tokens, scores
    and raw logits, with ``assistant`` (whose proposals the model rejects) and with the model itself as its own
    assistant (every proposal accepted): HF's ``test_assisted_decoding_matches_greedy_search``, "random" and "same".
    A model that keeps a state assisted decoding cannot roll back (``_is_stateful``, read on the class as HF's test
    reads it) would skip it there: ours do not."""
    assert type(model)._is_stateful is False, f"{type(model).__name__}._is_stateful read on the class"
    inputs = prompt(model, batch=1)
    config = generation_config(model, do_sample=False, output_scores=True, output_logits=True,
                               return_dict_in_generate=True)
    with without_forced_tokens(model):
        greedy = model.generate(**inputs, generation_config=config)
        for helper in (assistant, model):
            with proposing(helper):
                assisted = model.generate(**inputs, generation_config=config, assistant_model=helper)
            torch.testing.assert_close(assisted.sequences, greedy.sequences)
            for field in ("scores", "logits"):
                torch.testing.assert_close(torch.stack(getattr(assisted, field)), torch.stack(getattr(greedy, field)),
                                           atol=1e-4, rtol=1e-4)


def check_assisted_sampling(model, assistant) -> None:
    """Assisted sampling (HF's ``test_assisted_decoding_sample``): every step's scores are the model's own, so
    sampling with ``top_k=1`` gives greedy's tokens whoever assists, and a seeded run repeats itself."""
    inputs = prompt(model, batch=1)
    greedy = model.generate(**inputs, generation_config=generation_config(model, do_sample=False))
    with proposing(assistant):
        top1 = model.generate(**inputs, generation_config=generation_config(model, do_sample=True, top_k=1),
                              assistant_model=assistant)
        config = generation_config(model, do_sample=True, top_k=0, temperature=1.5)
        runs = []
        for _ in range(2):
            torch.manual_seed(3)
            runs.append(model.generate(**inputs, generation_config=config, assistant_model=assistant))
    torch.testing.assert_close(top1, greedy)
    torch.testing.assert_close(runs[0], runs[1])
    assert new_tokens(model, runs[0], inputs).shape == (1, NEW)


def check_padding_free(model) -> None:
    """Sequences packed into one row, with positions restarting at each sequence and no mask (what
    ``DataCollatorWithFlattening`` gives), get the logits the same sequences get left-padded in a batch, with eager
    attention and with SDPA (HF's ``test_eager_padding_matches_padding_free_with_position_ids`` and its ``sdpa``
    twin). HF's test runs it on a class whose ``_supports_attention_backend`` and ``_supports_sdpa`` say so, read on
    the class; decoder-only models (an encoder-decoder's decoder counts its own positions)."""
    if model.config.is_encoder_decoder:
        return
    if not (type(model)._supports_attention_backend and model._supports_attention_backend):
        return  # HF's test skips a model without the attention backend (GPT-2's own attention here)
    inputs = prompt(model, batch=3, length=6)
    mask = inputs["attention_mask"]
    mask[1, :2] = mask[2, :4] = 0
    ids = inputs["input_ids"].masked_fill(mask == 0, generation_config(model).pad_token_id)
    positions = (mask.cumsum(-1) - 1) * mask
    packed_ids = ids[mask.bool()][None]
    packed_positions = torch.cat([torch.arange(int(n)) for n in mask.sum(-1)])[None].to(ids.device)
    saved = model.config._attn_implementation
    try:
        for attention in ("eager", "sdpa"):
            assert type(model)._supports_sdpa or attention == "eager"
            model.set_attn_implementation(attention)
            with torch.no_grad():
                padded = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
                packed = model(input_ids=packed_ids, position_ids=packed_positions, use_cache=False).logits
            torch.testing.assert_close(packed[0], padded[mask.bool()], atol=1e-5, rtol=1e-5)
    finally:
        model.set_attn_implementation(saved)


def check_left_padding(model) -> None:
    """A short prompt padded within a batch (left for a decoder-only, on the right of an encoder's input) gives the
    logits and tokens it gives alone."""
    inputs = prompt(model)
    short = {k: v[1:, 2:] for k, v in inputs.items()}
    padded = {k: v.clone() for k, v in inputs.items()}
    pad = generation_config(model).pad_token_id
    if model.config.is_encoder_decoder:
        padded["input_ids"][1] = torch.cat([short["input_ids"][0], torch.full((2,), pad)])
        padded["attention_mask"][1] = torch.cat([torch.ones(4, dtype=torch.long), torch.zeros(2, dtype=torch.long)])
    else:
        padded["input_ids"][1, :2] = pad
        padded["attention_mask"][1, :2] = 0
    config = generation_config(model, do_sample=False, output_logits=True, return_dict_in_generate=True)
    alone = model.generate(**short, generation_config=config)
    batched = model.generate(**padded, generation_config=config)
    torch.testing.assert_close(new_tokens(model, batched.sequences, padded)[1:], new_tokens(model, alone.sequences,
                                                                                             short))
    torch.testing.assert_close(torch.stack(batched.logits, 1)[1:], torch.stack(alone.logits, 1), atol=1e-4,
                               rtol=1e-4)


def check_inputs_embeds(model) -> None:
    """``generate(inputs_embeds=...)`` (the embedded prompt, as the model's own lookup makes it) gives the tokens
    ``generate(input_ids=...)`` gives."""
    inputs = prompt(model)
    with torch.no_grad():
        embeds = model.get_input_embeddings()(inputs["input_ids"])
        if model.config.is_encoder_decoder:  # Marian scales in its encoder, not in the embedding module
            embeds = embeds * getattr(model.get_encoder(), "embed_scale", 1.0)
    config = generation_config(model, do_sample=False)
    from_ids = new_tokens(model, model.generate(**inputs, generation_config=config), inputs)
    mask = inputs["attention_mask"]
    from_embeds = model.generate(inputs_embeds=embeds, attention_mask=mask, generation_config=config)
    if model.config.is_encoder_decoder:
        from_embeds = from_embeds[:, 1:]
    torch.testing.assert_close(from_embeds, from_ids)


def _compile_config(**settings) -> CompileConfig:
    """transformers' automatic compile, forced on CPU as HF's tests force it (``_compile_all_devices``), with
    ``dynamic=False`` (a shape change is a recompile). Dynamo's "eager" backend: the graph capture, its breaks and its
    guards are what the checks look at, and inductor's code generation would cost minutes on a CPU."""
    config = CompileConfig(dynamic=False, backend="eager", **settings)
    config._compile_all_devices = True
    return config


def check_compiled_static_cache(model) -> None:
    """A static cache triggers transformers' automatic compile of the model's forward (HF's
    ``test_generate_compilation_all_outputs``): the compiled call is kept on the model itself, the one the user holds
    (``_compiled_call``), never on a module inside it, and every optional output (scores, raw logits, hidden states)
    equals the uncompiled generation's with the dynamic cache."""
    inputs = prompt(model)
    settings = {"do_sample": False, "output_scores": True, "output_logits": True, "output_hidden_states": True,
                "return_dict_in_generate": True}
    torch.compiler.reset()
    for module in model.modules():
        module.__dict__.pop("_compiled_call", None)
    with without_forced_tokens(model):
        eager = model.generate(**inputs, generation_config=generation_config(model, **settings))
        assert "_compiled_call" not in vars(model), "a dynamic cache must not trigger the compile"
        compiled = model.generate(**inputs, generation_config=generation_config(
            model, cache_implementation="static", compile_config=_compile_config(), **settings))
    assert "_compiled_call" in vars(model), f"{type(model).__name__}: the compiled call is not kept on the model"
    inner = [name for name, module in model.named_modules() if name and "_compiled_call" in vars(module)]
    assert not inner, f"the compiled call is kept on {inner}, not on the model the user holds"
    torch.testing.assert_close(compiled.sequences, eager.sequences)
    for field in ("scores", "logits"):
        torch.testing.assert_close(torch.stack(getattr(compiled, field)), torch.stack(getattr(eager, field)),
                                   atol=1e-4, rtol=1e-4)
    assert len(compiled.decoder_hidden_states if model.config.is_encoder_decoder else compiled.hidden_states) == NEW


@contextmanager
def _recompiles_refused():
    """Inside, a call that would recompile a compiled function raises instead (torch's "fail_on_recompile")."""
    with torch.compiler.set_stance("fail_on_recompile"):
        yield


def check_compiled_forward_fullgraph(model) -> None:
    """The forward that ``generate`` calls compiles as one graph (``fullgraph=True``: a graph break raises), and a
    second prompt of the same shape runs it without recompiling; both give the uncompiled tokens and scores (HF's
    ``test_generate_compile_model_forward_fullgraph``)."""
    first, second = prompt(model, seed=0), prompt(model, seed=1)
    settings = {"do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    torch.compiler.reset()
    model.__dict__.pop("_compiled_call", None)
    model.__dict__.pop("_previous_max_cache_length", None)
    with without_forced_tokens(model):
        eager = [model.generate(**inputs, generation_config=generation_config(model, **settings))
                 for inputs in (first, second)]
        config = generation_config(model, cache_implementation="static",
                                   compile_config=_compile_config(fullgraph=True), **settings)
        compiled = [model.generate(**first, generation_config=config)]
        assert "_compiled_call" in vars(model)
        with _recompiles_refused():
            compiled.append(model.generate(**second, generation_config=config))
    for got, expected in zip(compiled, eager):
        torch.testing.assert_close(got.sequences, expected.sequences)
        torch.testing.assert_close(torch.stack(got.scores), torch.stack(expected.scores), atol=1e-4, rtol=1e-4)


def check_static_cache_no_recompile_when_shorter(model) -> None:
    """A static cache is kept at the longest length the model has generated to (on the model:
    ``_previous_max_cache_length``), so a shorter generation afterwards reuses the compiled forward without
    recompiling, and its tokens are the first ones of the longer generation (HF's
    ``test_static_cache_no_recompile_with_smaller_length``)."""
    inputs = prompt(model)
    torch.compiler.reset()
    model.__dict__.pop("_compiled_call", None)
    model.__dict__.pop("_previous_max_cache_length", None)
    settings = {"do_sample": False, "cache_implementation": "static", "compile_config": _compile_config()}
    with without_forced_tokens(model):
        longer = generation_config(model, **settings)
        longer.max_new_tokens = longer.min_new_tokens = NEW + 2
        long_tokens = new_tokens(model, model.generate(**inputs, generation_config=longer), inputs)
        assert "_previous_max_cache_length" in vars(model), "the static cache's length is not kept on the model"
        with _recompiles_refused():
            short_tokens = new_tokens(model, model.generate(**inputs, generation_config=generation_config(
                model, **settings)), inputs)
    torch.testing.assert_close(short_tokens, long_tokens[:, :NEW])


def check_logits_to_keep(model) -> None:
    """The forward names ``logits_to_keep`` (so ``generate`` computes one position's logits a step, as HF's models
    do): ``logits_to_keep=1`` gives the last position's logits of a full forward, a tensor of positions gives those
    positions'; ``generate`` without it (``logits_to_keep=0``: all positions) gives the same tokens and scores (HF's
    ``test_generate_methods_with_logits_to_keep``). Every decoder-only model and the wrapper name it; an
    encoder-decoder family, as HF's Marian and BART, does not (HF's test skips them)."""
    if "logits_to_keep" not in inspect.signature(model.forward).parameters:
        assert model.config.is_encoder_decoder and not type(model).__name__.startswith("TiedNormWrapped"), (
            f"{type(model).__name__}.forward does not name logits_to_keep")
        return
    inputs = prompt(model)
    with torch.no_grad():
        extra = ({"decoder_input_ids": inputs["input_ids"][:, :4]} if model.config.is_encoder_decoder else {})
        full = model(**inputs, **extra, use_cache=False).logits
        last = model(**inputs, **extra, use_cache=False, logits_to_keep=1).logits
        picked = model(**inputs, **extra, use_cache=False, logits_to_keep=torch.tensor([0, 2])).logits
    torch.testing.assert_close(last, full[:, -1:])
    torch.testing.assert_close(picked, full[:, [0, 2]])
    settings = {"do_sample": False, "output_scores": True, "return_dict_in_generate": True}
    with without_forced_tokens(model):
        kept = model.generate(**inputs, generation_config=generation_config(model, **settings))
        every = model.generate(**inputs, logits_to_keep=0, generation_config=generation_config(model, **settings))
    torch.testing.assert_close(kept.sequences, every.sequences)
    torch.testing.assert_close(torch.stack(kept.scores), torch.stack(every.scores), atol=1e-5, rtol=1e-5)


def check_position_ids(model) -> None:
    """A decoder-only model's forward names ``position_ids``, so ``generate`` computes them from a left-padded mask
    and hands them over; passing those positions explicitly gives the same tokens (HF's
    ``test_generate_with_and_without_position_ids``). An encoder-decoder's decoder counts its own positions."""
    if model.config.is_encoder_decoder:
        return
    assert "position_ids" in inspect.signature(model.forward).parameters
    inputs = prompt(model)
    inputs["attention_mask"][1, :2] = 0
    positions = (inputs["attention_mask"].cumsum(-1) - 1).clamp(min=0)
    config = generation_config(model, do_sample=False)
    without = model.generate(**inputs, generation_config=config)
    given = model.generate(**inputs, position_ids=positions, generation_config=config)
    torch.testing.assert_close(given, without)


def check_backend_flags(model, wrapped_class=None) -> None:
    """The backend flags HF's tests read (``_supports_attention_backend``, the attention implementations,
    ``_can_compile_fullgraph``) are the architecture's: for the wrapper, those of the class it wraps
    (``wrapped_class``). ``is_backend_compatible()``, which only serving engines ask before they rebuild the model
    around its base, refuses, naming the export (hf_tiednorm/modeling/engine_checks.py), on the model and the class."""
    source = wrapped_class or type(model)
    for flag in BACKEND_FLAGS:
        assert getattr(model, flag) == getattr(source, flag), flag
        # Read on the class (HF's tests, vLLM's registry): a bool, never a property object (truthy whatever it says).
        assert isinstance(getattr(type(model), flag), bool), f"{type(model).__name__}.{flag} read on the class"
    for asked in (model, type(model)):
        with pytest.raises(ValueError, match="tiednorm-export"):
            asked.is_backend_compatible()


BACKEND_FLAGS = ("_supports_attention_backend", "_supports_sdpa", "_supports_flash_attn", "_supports_flex_attn",
                 "_can_compile_fullgraph", "_is_stateful")


__all__ = [
    "BACKEND_FLAGS",
    "check_assisted_decoding",
    "check_assisted_sampling",
    "check_backend_flags",
    "check_beam_search",
    "check_compiled_forward_fullgraph",
    "check_compiled_static_cache",
    "check_greedy_equals_full_forward",
    "check_inputs_embeds",
    "check_left_padding",
    "check_logits_to_keep",
    "check_padding_free",
    "check_position_ids",
    "check_sampling",
    "check_static_cache_no_recompile_when_shorter",
    "generation_config",
]
