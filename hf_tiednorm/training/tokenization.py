"""A joint (source + target) subword tokenizer trained with 🤗 tokenizers, wrapped as ``PreTrainedTokenizerFast``.

Special tokens match the config defaults: <pad>=0, <s>=1, </s>=2, <unk>=3. Text is NFKC-normalized and split on
spaces with Metaspace (SentencePiece style), so decoding gives back detokenized text for sacreBLEU. The
post-processor appends </s> to every sequence; the decoder starts from <s> (``decoder_start_token_id``).
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
TOKENIZER_MODELS = ("bpe", "unigram")


def train_joint_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 8000,
    model: str = "bpe",
    min_frequency: int = 2,
    model_max_length: int = 256,
) -> PreTrainedTokenizerFast:
    """Train one subword vocabulary on ``texts`` (pass the training text of both languages)."""
    if model not in TOKENIZER_MODELS:
        raise ValueError(f"tokenizer model must be one of {TOKENIZER_MODELS}, got {model!r}")
    specials = list(SPECIAL_TOKENS.values())  # order gives ids 0..3
    if vocab_size <= len(specials):
        raise ValueError(f"vocab_size must be > {len(specials)} (the special tokens), got {vocab_size}")
    if model == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=specials)
    else:
        tokenizer = Tokenizer(models.Unigram())
        trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>")
    tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    tokenizer.train_from_iterator(texts, trainer=trainer)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", tokenizer.token_to_id("</s>"))]
    )
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=model_max_length, **SPECIAL_TOKENS)
    expected = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    got = {token: wrapped.convert_tokens_to_ids(token) for token in expected}
    if got != expected:  # the trainer assigns special tokens first; guard the contract with the model config
        raise RuntimeError(f"special token ids {got} differ from {expected}")
    return wrapped


__all__ = ["SPECIAL_TOKENS", "TOKENIZER_MODELS", "train_joint_tokenizer"]
