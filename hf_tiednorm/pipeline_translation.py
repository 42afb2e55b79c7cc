"""A translation pipeline for seq2seq models (transformers 5 removed the translation/text2text pipelines).

Registered as the task ``"tiednorm-translation"`` when ``hf_tiednorm`` is imported. Saving an instance with
``pipe.save_pretrained(folder)`` records it in the folder's config (``custom_pipelines``) and copies this file,
so ``pipeline("tiednorm-translation", model=folder, trust_remote_code=True)`` works without the package.
"""

from __future__ import annotations

from transformers import Pipeline


class TiedNormTranslationPipeline(Pipeline):
    """``pipe("Ein Hund läuft.", num_beams=4)`` → ``[{"translation_text": "A dog runs."}]``."""

    # Keyword arguments that go to model.generate rather than to the tokenizer.
    _generate_kwargs = ("num_beams", "max_new_tokens", "length_penalty", "do_sample", "num_return_sequences")

    def _sanitize_parameters(self, **kwargs):
        unknown = set(kwargs) - set(self._generate_kwargs) - {"generate_kwargs"}
        if unknown:
            raise ValueError(
                f"unknown arguments {sorted(unknown)}; pass generate_kwargs={{...}} or one of {self._generate_kwargs}"
            )
        generate_kwargs = {k: kwargs[k] for k in self._generate_kwargs if k in kwargs}
        generate_kwargs.update(kwargs.get("generate_kwargs", {}))
        return {}, generate_kwargs, {}

    def preprocess(self, text: str):
        if not isinstance(text, str):
            raise ValueError(f"tiednorm-translation expects a string (or a list of strings), got {type(text).__name__}")
        return self.tokenizer(text, return_tensors="pt", return_token_type_ids=False)

    def _forward(self, model_inputs, **generate_kwargs):
        return {"output_ids": self.model.generate(**model_inputs, **generate_kwargs)}

    def postprocess(self, model_outputs):
        texts = self.tokenizer.batch_decode(model_outputs["output_ids"], skip_special_tokens=True)
        return [{"translation_text": text} for text in texts]
