"""sacreBLEU (Post, 2018) as an 🤗 evaluate metric that loads offline: ``evaluate.load(path_to_this_folder)``.

Same inputs and outputs as the Hub's ``sacrebleu`` metric (predictions: list of detokenized strings; references:
list of lists of strings, one list per prediction), plus ``signature``: the sacreBLEU signature that makes the
score reproducible (tokenizer, casing, smoothing, version).
"""

import datasets
import evaluate
import sacrebleu

_CITATION = """@inproceedings{post-2018-call,
  title = "A Call for Clarity in Reporting {BLEU} Scores",
  author = "Post, Matt",
  booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
  year = "2018",
  pages = "186--191",
}"""

_DESCRIPTION = "Corpus BLEU of detokenized predictions against detokenized references, computed by sacreBLEU."

_KWARGS_DESCRIPTION = """
Args:
    predictions: list of detokenized hypotheses.
    references: list of lists of detokenized references (every prediction has the same number of references).
    tokenize: sacreBLEU tokenizer ("13a" by default, "intl", "zh", "char", "none", ...).
    lowercase: compute case-insensitive BLEU.
    smooth_method, smooth_value: sacreBLEU smoothing ("exp" by default).
Returns:
    score, counts, totals, precisions, bp, sys_len, ref_len, and signature (the sacreBLEU signature string).
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuLocal(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {
                    "predictions": datasets.Value("string"),
                    "references": datasets.Sequence(datasets.Value("string")),
                }
            ),
            reference_urls=["https://github.com/mjpost/sacrebleu"],
        )

    def _compute(
        self, predictions, references, tokenize="13a", lowercase=False, smooth_method="exp", smooth_value=None
    ):
        if not predictions:
            raise ValueError("sacrebleu_local needs at least one prediction")
        num_refs = len(references[0])
        if any(len(refs) != num_refs for refs in references):
            raise ValueError("sacrebleu_local needs the same number of references for every prediction")
        # sacreBLEU wants one stream per reference position: transpose.
        streams = [[refs[i] for refs in references] for i in range(num_refs)]
        bleu = sacrebleu.metrics.BLEU(
            tokenize=tokenize, lowercase=lowercase, smooth_method=smooth_method, smooth_value=smooth_value
        )
        result = bleu.corpus_score(predictions, streams)
        return {
            "score": result.score,
            "counts": result.counts,
            "totals": result.totals,
            "precisions": result.precisions,
            "bp": result.bp,
            "sys_len": result.sys_len,
            "ref_len": result.ref_len,
            "signature": str(bleu.get_signature()),
        }
