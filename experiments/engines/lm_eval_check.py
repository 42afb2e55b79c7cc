"""lm-evaluation-harness scores a normalized folder and its export as transformers does (issue 57): for each folder,
lm-eval's own ``loglikelihood`` (``HFLM``, ``--model hf``) of (context, continuation) requests built in code from
Multi30k sentences, against the log-likelihood transformers computes with the folder's model from the same token ids;
and whether the backend lm-eval guesses for the folder (``backend`` left at ``default``) loads it at all.

lm-eval is not a dependency of the package (``python -m pip install lm_eval==0.4.13``). No dataset is downloaded: the
requests are lm-eval ``Instance`` objects made here. A causal folder is scored with ``backend=causal`` (context = the
first half of an English sentence, continuation = the rest), an encoder-decoder with ``backend=seq2seq`` (context = an
English sentence, continuation = its German translation); lm-eval splits each pair into token ids (``_encode_pair``)
and the reference scores those same ids, so the comparison is of the scores, not of the tokenization.

``--build DIR`` first writes small random folders of every family and the wrapper (cosine head, a per-token logit
scale set away from its start, a logit bias where the export can hold one), with a BPE tokenizer trained here on
Multi30k, and each one's ``tiednorm-export`` beside it (``NAME-export``); they are then measured::

    python experiments/engines/lm_eval_check.py --build DIR [--requests 10] [--output results/lm_eval.json]
    python experiments/engines/lm_eval_check.py FOLDER ... [--requests 10] [--output results/lm_eval.json]

Each folder's entry of the JSON is replaced, the others kept; ``NAME-export`` entries also give the largest difference
from ``NAME``'s log-likelihoods under lm-eval.
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
from pathlib import Path

import torch

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


def pairs(count: int, encoder_decoder: bool) -> list[tuple[str, str]]:
    """``count`` (context, continuation) pairs from the first Multi30k training sentences (the repository's copy)."""
    if not (MULTI30K / "train.en.gz").is_file():
        raise FileNotFoundError(f"no Multi30k at {MULTI30K}: the requests are its training sentences")
    with gzip.open(MULTI30K / "train.en.gz", "rt") as en, gzip.open(MULTI30K / "train.de.gz", "rt") as de:
        english = [next(en).strip() for _ in range(count)]
        german = [next(de).strip() for _ in range(count)]
    if encoder_decoder:
        return list(zip(english, german))
    halves = [sentence.split() for sentence in english]
    return [(" ".join(words[: len(words) // 2]), " " + " ".join(words[len(words) // 2:])) for words in halves]


def lm_eval_scores(folder: str, backend: str, requests: list[tuple[str, str]]):
    """lm-eval's HFLM on ``folder``: (its log-likelihood of each request, the token ids it scored, the backend used)."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=folder, backend=backend, trust_remote_code=True, dtype="float32", device="cpu", batch_size=1)
    instances = [Instance(request_type="loglikelihood", doc={}, arguments=pair, idx=i)
                 for i, pair in enumerate(requests)]
    scores = [float(logprob) for logprob, _ in lm.loglikelihood(instances, disable_tqdm=True)]
    return scores, [lm._encode_pair(*pair) for pair in requests], lm.backend


def transformers_scores(folder: str, encoded, encoder_decoder: bool) -> list[float]:
    """The log-likelihood of each continuation's ids given its context's, from the folder's model in transformers."""
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    auto = AutoModelForSeq2SeqLM if encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(folder, trust_remote_code=True, dtype=torch.float32).eval()
    scores = []
    for context, continuation in encoded:
        target = torch.tensor(continuation)
        with torch.no_grad():
            if encoder_decoder:  # the decoder reads the continuation shifted right behind its start token
                logits = model(input_ids=torch.tensor([context]), labels=target[None]).logits[0]
            else:
                logits = model(input_ids=torch.tensor([context + continuation])).logits[0, len(context) - 1: -1]
        scores.append(float(logits.float().log_softmax(-1).gather(-1, target[:, None]).sum()))
    return scores


def measure(folder: str, count: int) -> dict:
    """The guessed backend's outcome, and lm-eval's scores against transformers' with the right backend."""
    from transformers import AutoConfig

    encoder_decoder = AutoConfig.from_pretrained(folder, trust_remote_code=True).is_encoder_decoder
    requests = pairs(count, encoder_decoder)
    right = "seq2seq" if encoder_decoder else "causal"
    entry = {"backend": right}
    try:
        _, _, guessed = lm_eval_scores(folder, "default", requests[:1])
        entry["default"] = {"outcome": "scored", "backend_guessed": guessed}
    except Exception as error:  # noqa: BLE001  (a failure is a result)
        entry["default"] = {"outcome": "failed", "message": f"{type(error).__name__}: {error}"[:400]}
    scores, encoded, _ = lm_eval_scores(folder, right, requests)
    expected = transformers_scores(folder, encoded, encoder_decoder)
    entry.update(requests=len(requests), loglikelihoods=scores,
                 max_abs_diff_vs_transformers=max(abs(a - b) for a, b in zip(scores, expected)))
    return entry


def build(root: Path) -> list[str]:
    """Small random folders of every family and the wrapper, and each one's export: the folders' paths."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import (
        BartConfig,
        BartForConditionalGeneration,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    import hf_tiednorm
    from hf_tiednorm.conversion.export import export_plain
    from hf_tiednorm.convert import normalize_tied_head

    text = [s for en, de in pairs(2000, encoder_decoder=True) for s in (en, de)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.Metaspace(), decoders.Metaspace()
    special_tokens = ["<pad>", "<s>", "</s>", "<unk>"]
    bpe.train_from_iterator(text, trainers.BpeTrainer(vocab_size=1000, special_tokens=special_tokens))
    bpe.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>")
    vocab = len(tokenizer)
    special = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2, decoder_start_token_id=0)
    encoder_decoder = dict(vocab_size=vocab, d_model=64, encoder_layers=2, decoder_layers=2,
                           encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128,
                           decoder_ffn_dim=128, max_position_embeddings=128, dropout=0.0, **special)
    decoder = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    head = dict(head_mode="cosine", logit_scale_kind="vector")
    torch.manual_seed(0)
    made = {
        # the causal family's parent (Llama) has no per-token bias: no logit bias there (docs/deploy.md)
        "causal-cosine": hf_tiednorm.FAMILIES["causal"].lm_class(hf_tiednorm.TiedNormCausalConfig(**decoder, **head)),
        "seq2seq-cosine": hf_tiednorm.FAMILIES["seq2seq"].lm_class(
            hf_tiednorm.TiedNormSeq2SeqConfig(**encoder_decoder, **head, logit_bias=True)),
        "bart-cosine": hf_tiednorm.FAMILIES["bart"].lm_class(
            hf_tiednorm.TiedNormBartConfig(**encoder_decoder, **head, logit_bias=True)),
        "wrapped-llama-cosine": normalize_tied_head(
            LlamaForCausalLM(LlamaConfig(**decoder, tie_word_embeddings=True)), generic=True, **head),
        "wrapped-bart-cosine": normalize_tied_head(
            BartForConditionalGeneration(BartConfig(**encoder_decoder)), generic=True, **head, logit_bias=True),
    }  # fmt: skip
    folders = []
    for name, model in made.items():
        with torch.no_grad():  # a head away from its start, as after training: g in [5, 15], b in [-1, 1]
            for parameter_name, parameter in model.named_parameters():
                if parameter_name.endswith("logit_scale"):
                    parameter.uniform_(5, 15)
                elif parameter_name.endswith("logit_bias"):
                    parameter.uniform_(-1, 1)
        model.eval().save_pretrained(root / name)
        tokenizer.save_pretrained(root / name)
        export_plain(root / name, root / f"{name}-export")
        folders += [str(root / name), str(root / f"{name}-export")]
    return folders


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folders", nargs="*", help="saved folders (causal or encoder-decoder): normalized or exported")
    parser.add_argument("--build", metavar="DIR", help="write the small folders and their exports here, measure them")
    parser.add_argument("--requests", type=int, default=10, help="Multi30k requests per folder (default: %(default)s)")
    parser.add_argument("--output", default="results/lm_eval.json", help="JSON written (default: %(default)s)")
    args = parser.parse_args(argv)
    folders = list(args.folders) + (build(Path(args.build)) if args.build else [])
    if not folders:
        parser.error("give folders, or --build DIR")

    import lm_eval
    import transformers

    path = Path(args.output)
    results = json.loads(path.read_text()) if path.is_file() else {}
    results["versions"] = {"lm_eval": lm_eval.__version__, "transformers": transformers.__version__,
                           "torch": torch.__version__, "cpu": platform.processor() or platform.machine()}
    for folder in folders:
        name = Path(folder).name
        results[name] = measure(folder, args.requests)
        source = results.get(name.removesuffix("-export")) if name.endswith("-export") else None
        if source and source.get("loglikelihoods"):
            results[name]["max_abs_diff_vs_normalized"] = max(
                abs(a - b) for a, b in zip(results[name]["loglikelihoods"], source["loglikelihoods"]))
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "loglikelihoods"}), flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
