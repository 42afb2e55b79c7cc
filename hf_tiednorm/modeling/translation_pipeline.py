"""The ``tiednorm-translation`` pipeline for encoder-decoders (transformers 5 removed its own): it serves a saved
folder alone (``pipeline("tiednorm-translation", model=folder, trust_remote_code=True)``), refuses bad arguments by
name, translates ``[]`` to ``[]`` and truncates inputs longer than the model's positions, with a warning."""

from __future__ import annotations

import os
import sys

from transformers import Pipeline
from transformers.utils import logging

logger = logging.get_logger(__name__)

TASK = "tiednorm-translation"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def position_limit(model, tokenizer) -> int | None:
    """The longest input (in tokens) the encoder can embed: the config's ``max_position_embeddings`` and the
    tokenizer's ``model_max_length`` (when set to a real value), whichever is smaller; None when neither limits."""
    limits = [getattr(model.config, "max_position_embeddings", None), getattr(tokenizer, "model_max_length", None)]
    limits = [limit for limit in limits if isinstance(limit, int) and 0 < limit < 1_000_000]
    return min(limits, default=None)


def missing_tokenizer_message(model) -> str:
    """Why a pipeline got no tokenizer, and the remedy: ``pipeline()`` loads one only when ``model`` is given as a
    folder name; a model object (even one loaded from a folder holding a tokenizer) needs ``tokenizer=``."""
    folder = getattr(model, "name_or_path", None) or ""
    has_tokenizer = any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES) if folder else False
    if has_tokenizer:
        return (f"tiednorm-translation needs a tokenizer: the model was passed as an object, for which pipeline() "
                f"loads none, although its folder {folder} holds one; pass model={folder!r} (the folder name; with "
                f"trust_remote_code=True, as the folder ships the pipeline code) or "
                f"tokenizer=AutoTokenizer.from_pretrained({folder!r})")
    if folder and os.path.isdir(folder):
        return (f"tiednorm-translation needs a tokenizer, and the model {folder} came without one (its folder has no "
                "tokenizer.json / tokenizer_config.json): save the tokenizer into the model folder, or pass "
                "tokenizer=... to pipeline()")
    name = folder or type(model).__name__
    return f"tiednorm-translation needs a tokenizer, and the model {name} came without one: pass tokenizer=..."


class TokenizerLoadFailure:
    """The pipeline class's ``_load_tokenizer`` flag: loads the tokenizer softly, as ``None`` does, and keeps a failed
    load's error (transformers' ``pipeline()`` tests the flag again in the handler of a failed load, where
    ``sys.exc_info()`` holds it), so that the pipeline says why it has no tokenizer."""

    failure: BaseException | None = None

    def __bool__(self) -> bool:
        self.failure = sys.exc_info()[1]  # None before loading: load (and forget an earlier call's failure)
        return self.failure is None

    def take(self) -> BaseException | None:
        """The recorded load error, if the tokenizer was given or guessed and failed to load; cleared."""
        failure, self.failure = self.failure, None
        if failure is not None and str(failure).startswith("Impossible to guess which tokenizer"):
            return None  # nothing was given to load (a model object without tokenizer=)
        return failure


# Generation arguments that must be positive integers (0 divided by zero inside beam search; negatives fail in torch).
POSITIVE_INT_ARGUMENTS = ("num_beams", "max_new_tokens", "num_return_sequences")


def check_generate_kwargs(generate_kwargs: dict) -> None:
    """Refuse a non-positive or non-integer ``num_beams`` / ``max_new_tokens`` / ``num_return_sequences`` by name."""
    for name in POSITIVE_INT_ARGUMENTS:
        value = generate_kwargs.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"tiednorm-translation: {name} must be a positive integer, got {value!r}")


class TiedNormTranslationPipeline(Pipeline):
    """``pipe("Ein Hund läuft.", num_beams=4)`` → ``[{"translation_text": "A dog runs."}]``."""

    # Keyword arguments that go to model.generate rather than to the tokenizer.
    _generate_kwargs = ("num_beams", "max_new_tokens", "length_penalty", "do_sample", "num_return_sequences")

    _load_tokenizer = TokenizerLoadFailure()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self.tokenizer is None:
            failure = type(self)._load_tokenizer.take()
            # Guessed from the model's folder where it has tokenizer files (else given as pipeline(tokenizer=...)).
            folder = getattr(self.model, "name_or_path", None) or ""
            has_files = folder and any(os.path.isfile(os.path.join(folder, n)) for n in TOKENIZER_FILES)
            source = f"in {folder}" if has_files else "given as pipeline(tokenizer=...)"
            if failure is not None and not has_files and folder and os.path.isdir(folder):
                # transformers guessed the tokenizer from the model's folder, which has none
                raise ValueError(missing_tokenizer_message(self.model)) from failure
            if failure is not None:
                raise ValueError(f"tiednorm-translation: the tokenizer {source} failed to load "
                                 f"({type(failure).__name__}: {failure}); repair or replace its files (tokenizer.json, "
                                 "tokenizer_config.json), or pass a loaded tokenizer") from failure
            raise ValueError(missing_tokenizer_message(self.model))

    def _sanitize_parameters(self, **kwargs):
        unknown = set(kwargs) - set(self._generate_kwargs) - {"generate_kwargs"}
        if unknown:
            raise ValueError(f"unknown arguments {sorted(unknown)}; pass generate_kwargs={{...}} or one of "
                             f"{self._generate_kwargs}")
        generate_kwargs = {k: kwargs[k] for k in self._generate_kwargs if k in kwargs}
        generate_kwargs.update(kwargs.get("generate_kwargs", {}))
        check_generate_kwargs(generate_kwargs)
        return {}, generate_kwargs, {}

    def __call__(self, inputs, *args, **kwargs):
        if isinstance(inputs, list) and not inputs:
            self._sanitize_parameters(**kwargs)  # the arguments are still checked
            return []  # nothing to translate (the base Pipeline indexed the empty list)
        return super().__call__(inputs, *args, **kwargs)

    def preprocess(self, text: str):
        if not isinstance(text, str):
            raise ValueError(f"tiednorm-translation expects a string (or a list of strings), got {type(text).__name__}")
        inputs = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)
        limit = position_limit(self.model, self.tokenizer)
        if limit is not None and inputs["input_ids"].shape[-1] > limit:
            logger.warning(f"the input has {inputs['input_ids'].shape[-1]} tokens, more than the {limit} positions the "
                           f"model can embed; translating its first {limit} tokens only")
            inputs = self.tokenizer(text, return_tensors="pt", return_token_type_ids=False, truncation=True,
                                    max_length=limit)
        return inputs

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text} for text in texts]
