"""Checks of ``generate`` that hold for any HF generative model, written once and run over every family and the
wrapper (tests/modeling/families/test_hf_common_generation.py). The transformers sdist ships no
``tests/generation/``; these are our own checks of what its ``GenerationTesterMixin`` covers: greedy, sampling, beam,
assisted decoding, the KV cache against a full forward, left padding, ``inputs_embeds``, ``output_scores`` /
``output_logits`` and ``num_return_sequences``.

Every check compares ``generate`` with full forwards of the model itself (no cache), so a cache, a padding or a head
that ``generate`` used differently from ``forward`` shows. ``min_new_tokens`` keeps every sequence to the same length
(the end token is barred until then), and a fresh ``GenerationConfig`` holding only the special tokens keeps the
checkpoint's processors (forced tokens, banned words) out of the comparison.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from transformers import GenerationConfig

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


def check_assisted_decoding(model, assistant) -> None:
    """Greedy assisted decoding (an assistant proposing tokens, the model checking them) gives greedy's tokens."""
    inputs = prompt(model, batch=1)
    config = generation_config(model, do_sample=False)
    greedy = model.generate(**inputs, generation_config=config)
    assisted = model.generate(**inputs, generation_config=config, assistant_model=assistant)
    torch.testing.assert_close(assisted, greedy)


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


__all__ = [
    "check_assisted_decoding",
    "check_beam_search",
    "check_greedy_equals_full_forward",
    "check_inputs_embeds",
    "check_left_padding",
    "check_sampling",
    "generation_config",
]
