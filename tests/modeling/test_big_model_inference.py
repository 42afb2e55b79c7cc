"""accelerate's big-model inference runs every hf_tiednorm model as it runs transformers' own (issue 55).

The real accelerate calls, on the own causal family (cosine, vector logit scale, logit bias), the Marian and BART
families and the wrapper around GPT-2 and Llama: each gives the logits (≤ 1e-5, fp32) and greedy tokens of the model
without accelerate. Before, every call but ``load_checkpoint_and_dispatch`` was refused: the scoring guard took
accelerate's ``functools.partial`` for a foreign forward, the PEFT guard took an offloaded (meta) placeholder for an
untied head, and the load check took a disk-offloaded tensor for a missing one. Marian's family failed the two calls
that place every parameter from the folder (transformers' ``MarianMTModel`` still does): its sinusoidal position
tables, frozen parameters left out of the folder, are computed buffers now.

This machine has no GPU: a map over several devices is emulated with ``dispatch_model(..., force_hooks=True)`` on
the CPU, which attaches the same ``AlignDevicesHook`` (and the same ``functools.partial`` forward) a multi-device map
attaches. ``device_map="auto"`` on one CUDA device, with and without disk offload, runs where a GPU is present.
"""

from __future__ import annotations

import copy
import json

import pytest
import torch
from accelerate import cpu_offload, disk_offload, dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from testing_utils import model_inputs, run_without_package, tiny_model
from tiny_architectures import source_model

from hf_tiednorm.convert import normalize_tied_head


def _with_trained_terms(model):
    """The learned head terms away from their start, so that a path that skipped them would show."""
    head = model.get_output_embeddings()
    with torch.no_grad():
        if getattr(head, "logit_scale", None) is not None:
            head.logit_scale.uniform_(0.5, 3.0, generator=torch.Generator().manual_seed(1))
        if getattr(head, "logit_bias", None) is not None:
            head.logit_bias.normal_(generator=torch.Generator().manual_seed(2))
    return model


TERMS = {"logit_scale_kind": "vector", "logit_bias": True}
MODELS = {
    "causal": lambda: _with_trained_terms(tiny_model("causal", head_mode="cosine", **TERMS)),
    "seq2seq": lambda: _with_trained_terms(tiny_model("seq2seq", head_mode="cosine", **TERMS)),
    "bart": lambda: _with_trained_terms(tiny_model("bart", head_mode="cosine", **TERMS)),
    "wrapped-gpt2": lambda: _with_trained_terms(
        normalize_tied_head(source_model("gpt2"), "cosine", generic=True, **TERMS).eval()),
    "wrapped-llama": lambda: _with_trained_terms(
        normalize_tied_head(source_model("llama"), "cosine", generic=True, **TERMS).eval()),
}  # fmt: skip
CALLS = ["dispatch_model", "cpu_offload", "disk_offload", "device_map_auto_offload", "load_checkpoint_and_dispatch"]


def greedy(model, inputs) -> torch.Tensor:
    kwargs = {"input_ids": inputs["input_ids"], "do_sample": False, "max_new_tokens": 4, "min_new_tokens": 4}
    return model.generate(**kwargs, pad_token_id=0, eos_token_id=None)


def under_accelerate(call: str, model, folder, tmp_path):
    """``model`` (saved in ``folder``) as accelerate's ``call`` runs it, on the CPU."""
    if call == "dispatch_model":  # what a map over several devices attaches (force_hooks: the one-device case too)
        return dispatch_model(copy.deepcopy(model), device_map={"": "cpu"}, force_hooks=True)
    if call == "cpu_offload":
        return cpu_offload(copy.deepcopy(model), execution_device="cpu")
    if call == "disk_offload":
        return disk_offload(copy.deepcopy(model), str(tmp_path / "offload"), execution_device="cpu")
    if call == "device_map_auto_offload":  # what lm_eval's parallelize=True and big-model users do
        loaded = type(model).from_pretrained(folder, device_map="auto", max_memory={"cpu": 20_000},
                                             offload_folder=str(tmp_path / "offload"))
        assert "disk" in loaded.hf_device_map.values()  # something really was offloaded
        return loaded
    with init_empty_weights():
        empty = type(model)(model.config)
    empty.tie_weights()  # as accelerate's docs say: init_empty_weights re-registers each parameter, untying them
    return load_checkpoint_and_dispatch(empty, str(folder), device_map={"": "cpu"}, force_hooks=True).eval()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Each model built once, saved, with its logits and greedy tokens without accelerate."""
    found = {}
    for name, build in MODELS.items():
        model = build()
        folder = tmp_path_factory.mktemp(name)
        model.save_pretrained(folder)
        inputs = model_inputs(model)
        with torch.no_grad():
            found[name] = (model, folder, inputs, model(**inputs).logits, greedy(model, inputs))
    return found


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize("name", list(MODELS))
def test_accelerate_runs_the_model_as_without_it(name, call, saved, tmp_path):
    model, folder, inputs, logits, tokens = saved[name]
    accelerated = under_accelerate(call, model, folder, tmp_path)
    with torch.no_grad():
        got = accelerated(**inputs).logits
    torch.testing.assert_close(got, logits, rtol=0, atol=1e-5)
    assert torch.equal(greedy(accelerated, inputs), tokens)


def test_a_folder_that_lacks_a_tensor_is_still_refused_under_an_offloading_map(saved, tmp_path):
    from safetensors.torch import load_file, save_file

    model, folder, *_ = saved["causal"]
    broken = tmp_path / "broken"
    model.save_pretrained(broken)
    weights = load_file(broken / "model.safetensors")
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_file(weights, broken / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ValueError, match=r"'model\.layers\.1\.mlp\.down_proj\.weight' is missing from the weights"):
        type(model).from_pretrained(broken, device_map="auto", max_memory={"cpu": 20_000},
                                    offload_folder=str(tmp_path / "offload"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none on CPU-only CI)")
@pytest.mark.parametrize("offload", [False, True], ids=["one_gpu", "one_gpu_and_disk"])
@pytest.mark.parametrize("name", list(MODELS))
def test_device_map_auto_on_one_gpu(name, offload, saved, tmp_path):
    model, folder, inputs, logits, tokens = saved[name]
    memory = {0: 30_000, "cpu": 20_000} if offload else None
    loaded = type(model).from_pretrained(folder, device_map="auto", max_memory=memory,
                                         offload_folder=str(tmp_path / "offload"))
    cuda = {key: value.to("cuda") for key, value in inputs.items()}
    with torch.no_grad():
        got = loaded(**cuda).logits
    torch.testing.assert_close(got.cpu(), logits, rtol=0, atol=1e-5)
    assert torch.equal(greedy(loaded, cuda).cpu(), tokens)


# The same calls on each folder loaded through its own code (trust_remote_code), where hf_tiednorm is not installed;
# the process's torch global hooks are compared before and after.
REMOTE = """
import copy, json, torch
from accelerate import cpu_offload, disk_offload, dispatch_model, init_empty_weights, load_checkpoint_and_dispatch
from torch.nn.modules import module as torch_module
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

def global_hooks():
    return {name: len(value) for name, value in vars(torch_module).items()
            if name.startswith("_global_") and isinstance(value, dict)}

before = global_hooks()
report = {}
for name, folder, inputs in CASES:
    config = AutoConfig.from_pretrained(folder, trust_remote_code=True)
    auto = AutoModelForSeq2SeqLM if config.is_encoder_decoder else AutoModelForCausalLM
    model = auto.from_pretrained(folder, trust_remote_code=True)
    assert "transformers_modules" in type(model).__module__, type(model).__module__
    inputs = {key: torch.tensor(value) for key, value in inputs.items()}
    generate = dict(input_ids=inputs["input_ids"], do_sample=False, max_new_tokens=4, min_new_tokens=4,
                    pad_token_id=0, eos_token_id=None)
    with torch.no_grad():
        logits, tokens = model(**inputs).logits, model.generate(**generate)
    with init_empty_weights():
        empty = type(model)(model.config)
    empty.tie_weights()
    runs = {
        "dispatch_model": lambda: dispatch_model(copy.deepcopy(model), device_map={"": "cpu"}, force_hooks=True),
        "cpu_offload": lambda: cpu_offload(copy.deepcopy(model), execution_device="cpu"),
        "disk_offload": lambda: disk_offload(copy.deepcopy(model), folder + "-offload", execution_device="cpu"),
        "device_map_auto_offload": lambda: auto.from_pretrained(
            folder, trust_remote_code=True, device_map="auto", max_memory={"cpu": 20_000},
            offload_folder=folder + "-offload-auto"),
        "load_checkpoint_and_dispatch": lambda: load_checkpoint_and_dispatch(
            empty, folder, device_map={"": "cpu"}, force_hooks=True).eval(),
    }
    for call, run in runs.items():
        accelerated = run()
        with torch.no_grad():
            difference = (accelerated(**inputs).logits - logits).abs().max().item()
        report[f"{name} {call}"] = [difference, torch.equal(accelerated.generate(**generate), tokens)]
report["global hooks added"] = [global_hooks()[key] - before[key] for key in before]
print(json.dumps(report))
"""


@pytest.mark.slow  # every family and call again, in the shared process without the package (~20 s idle, 90 s busy)
def test_accelerate_runs_every_folder_through_its_own_code(saved, tmp_path):
    cases = [(name, str(folder), {key: value.tolist() for key, value in inputs.items()})
             for name, (_, folder, inputs, _, _) in saved.items()]
    code = f"import json\nCASES = json.loads({json.dumps(json.dumps(cases))})\n" + REMOTE
    report = json.loads(run_without_package(code, cwd=tmp_path).strip().splitlines()[-1])
    assert not any(report.pop("global hooks added"))  # loading and running the folders' code hooks nothing globally
    failed = {case: result for case, result in report.items() if not (result[0] <= 1e-5 and result[1])}
    assert not failed and len(report) == len(MODELS) * len(CALLS), failed


def test_marians_position_tables_are_computed_buffers_equal_to_transformers_tables(saved):
    """Not in the state dict (never saved, loaded or offloaded), and equal to transformers' Marian's tables, here
    and for a real model's size (512 positions x 512) and an odd d."""
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    from hf_tiednorm.modeling.families.seq2seq import SinusoidalPositions

    model = saved["seq2seq"][0]
    assert not [key for key in model.state_dict() if "embed_positions" in key]
    for table in (model.model.encoder.embed_positions, model.model.decoder.embed_positions):
        assert torch.equal(table.weight, MarianSinusoidalPositionalEmbedding(*table.weight.shape).create_weight())
    for shape in [(512, 512), (40, 33)]:
        ours = SinusoidalPositions(*shape)
        assert torch.equal(ours.weight, MarianSinusoidalPositionalEmbedding(*shape).create_weight())
