"""lm-evaluation-harness with ``parallelize=True`` (accelerate's ``device_map="auto"``, here with disk offload) scores
a converted model as it scores its source (issue 55: the load check took the disk-offloaded tensors for missing
ones and refused the model).

Through lm-eval's Python API, on a tiny local task (a JSON file of three multiple-choice questions): the source, a
tiny Llama, and its conversion to the own causal family with a lossless cosine start (the source's logits). And the
encoder-decoder families (issue 57), which lm-eval scores with ``backend=seq2seq`` as transformers does, and whose
folders its default guess (``causal``) cannot load: experiments/engines/lm_eval_check.py's requests, on tiny models.
lm-eval is not a dependency of the package or of its tests (``python -m pip install lm_eval==0.4.13``).
"""

from __future__ import annotations

import json

import pytest
import torch
from testing_utils import tiny_model, tiny_tokenizer
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head

lm_eval = pytest.importorskip("lm_eval")
pytestmark = pytest.mark.slow  # lm-eval is not a test dependency; evaluations with disk offload (~30 s)

TASK = """
task: tiny_choice
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
metric_list:
  - metric: acc
"""
DOCS = [
    {"question": "a dog runs", "choices": ["on the grass", "in the sky", "under water"], "answer": 0},
    {"question": "the woman reads", "choices": ["a book", "a car", "a tree"], "answer": 0},
    {"question": "two men play", "choices": ["music", "the ball", "chess"], "answer": 1},
]


def evaluate(folder, task_dir, offload) -> list[float]:
    """The per-choice log-likelihoods lm-eval computes for the task, with ``parallelize=True`` and a CPU budget that
    puts the model on the disk."""
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    results = simple_evaluate(
        model="hf",
        model_args=dict(pretrained=str(folder), parallelize=True, max_cpu_memory=20_000, offload_folder=str(offload),
                        trust_remote_code=True, dtype="float32"),
        tasks=["tiny_choice"], task_manager=TaskManager(include_path=str(task_dir)), log_samples=True,
        batch_size=1, device="cpu",
    )  # fmt: skip
    samples = results["samples"]["tiny_choice"]
    return [float(response[0][0]) for sample in samples for response in sample["resps"]]


def test_lm_eval_parallelize_scores_the_conversion_as_its_source(tmp_path):
    (tmp_path / "task").mkdir()
    data = tmp_path / "task" / "docs.jsonl"
    data.write_text("".join(json.dumps(doc) + "\n" for doc in DOCS))
    (tmp_path / "task" / "tiny_choice.yaml").write_text(TASK.format(data=data))
    tokenizer = tiny_tokenizer()
    source = source_model("llama")
    source.save_pretrained(tmp_path / "source")
    tokenizer.save_pretrained(tmp_path / "source")
    converted = normalize_tied_head(source_model("llama"), "cosine", lossless_start=True)
    assert type(converted).__name__ == "TiedNormForCausalLM"
    converted.save_pretrained(tmp_path / "converted")
    tokenizer.save_pretrained(tmp_path / "converted")
    expected = evaluate(tmp_path / "source", tmp_path / "task", tmp_path / "offload-source")
    got = evaluate(tmp_path / "converted", tmp_path / "task", tmp_path / "offload-converted")
    assert len(got) == sum(len(doc["choices"]) for doc in DOCS)
    torch.testing.assert_close(torch.tensor(got), torch.tensor(expected), rtol=0, atol=1e-4)


@pytest.mark.parametrize("family", ["seq2seq", "bart"])
def test_lm_eval_seq2seq_backend_scores_an_encoder_decoder_as_transformers(family, tmp_path):
    """lm-eval's loglikelihood with ``backend=seq2seq`` equals transformers' log-likelihood of the same token ids; the
    default backend (lm-eval guesses ``causal`` for a model type transformers does not list) fails to load the folder
    rather than score it wrongly (docs/deploy.md, "lm-evaluation-harness")."""
    from engines import lm_eval_check

    model = tiny_model(family, head_mode="cosine", logit_scale_kind="vector", logit_bias=True)
    with torch.no_grad():
        model.get_output_embeddings().logit_scale.uniform_(5.0, 15.0)
    model.save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    requests = [("a dog runs", "ein hund läuft"), ("a woman reads a book .", "eine frau liest ein buch .")]
    scores, encoded, backend = lm_eval_check.lm_eval_scores(str(tmp_path), "seq2seq", requests)
    assert backend == "seq2seq" and all(len(continuation) > 1 for _, continuation in encoded)
    expected = lm_eval_check.transformers_scores(str(tmp_path), encoded, encoder_decoder=True)
    torch.testing.assert_close(torch.tensor(scores), torch.tensor(expected), rtol=0, atol=1e-4)
    with pytest.raises(ValueError, match="AutoModelForCausalLM"):
        lm_eval_check.lm_eval_scores(str(tmp_path), "default", requests)
