"""Every path a user runs on a GPU, run on the CPU under an emulated accelerator (tests/emulated_accelerator.py): the
model, its buffers and the batch are "on the device", and an op mixing them with a host tensor, a ``.numpy()`` of
one or a collective on a host tensor raises as CUDA / NCCL would. The training step must also add no host sync of
hf_tiednorm's own (a GPU waits for each). Issue 38: on the first real GPU run the plots, the chunked loss, the time
budget's all-reduce and export_plain failed this way, and the adaptive input synced 10 times a step."""

from __future__ import annotations

import tempfile
import time
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from emulated_accelerator import ACCELERATOR, DeviceMismatch, EmulatedAccelerator, emulated_collectives
from testing_utils import FAMILIES, model_inputs, tiny_model, tiny_tokenizer
from tiny_architectures import inputs_for, source_model
from transformers import DataCollatorForSeq2Seq, TrainerControl, TrainerState

from hf_tiednorm.conversion import export as export_module
from hf_tiednorm.conversion.export import export_plain
from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.training.arguments import RunArguments
from hf_tiednorm.training.callbacks import TimeBudgetCallback, run_callbacks
from hf_tiednorm.training.plots import plot_embedding_norms
from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments
from hf_tiednorm.training.trainers import TiedNormSeq2SeqTrainer
from hf_tiednorm.training.weight_norm_init import weight_norm_init_

DEVICE = ACCELERATOR  # the emulated accelerator's device (CUDA's torch.device("cuda")): what goes there is tagged
REGULARIZERS = {"projection_regularization": 0.15, "weight_norm_regularization": 1e-3}


def training_batch(model) -> dict[str, torch.Tensor]:
    batch = model_inputs(model, batch_size=3, length=7)
    if model.config.is_encoder_decoder:
        batch["labels"] = batch.pop("decoder_input_ids")
    else:
        batch["labels"] = batch["input_ids"].clone()
    batch["labels"][0, -2:] = -100  # padding positions, as the collator writes them
    return batch


def train_steps(model, accelerator: EmulatedAccelerator, steps: int = 2, autocast: bool = False) -> None:
    """``steps`` optimizer steps on the device (forward, backward, clipping, AdamW); host syncs of ours counted over
    the last step only (the first one builds the optimizer's state)."""
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)  # CUDA's default implementation
    with accelerator:
        accelerator.put(model)
        batch = {k: v.to(DEVICE) for k, v in training_batch(model).items()}
        for _ in range(steps):
            accelerator.reset_syncs()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad()


# Syncs the emulation sees only because its "device" tensors really are on the CPU: these functions read a tensor
# on the host only under `tensor.device.type == "cpu"` (free there) and assert on the device otherwise
# (torch._assert_async). Reviewed one by one; the emulation cannot fake `.device`.
CPU_ONLY_SYNCS = {("modeling/loss/chunked.py", "check_labels_in_vocabulary")}


def assert_no_own_syncs(accelerator: EmulatedAccelerator) -> None:
    syncs = {
        site: count for site, count in accelerator.own_syncs.items()
        if not any(f"{file}:" in site and f"({function})" in site for file, function in CPU_ONLY_SYNCS)
    }
    assert not syncs, f"host syncs of hf_tiednorm in a training step: {syncs}"


# -- the emulation itself --------------------------------------------------------------------------------------------


def test_emulation_raises_where_cuda_would_and_counts_syncs():
    accelerator = EmulatedAccelerator()
    weight = torch.randn(4, 3)
    with accelerator:
        accelerator.put(weight)
        with pytest.raises(DeviceMismatch, match=r"host tensor of shape \(4, 1\)"):
            weight + torch.ones(4, 1)  # a device-less factory: on the host
        weight + torch.ones(4, 1, device=DEVICE) + torch.tensor(2.0)  # explicit device; a 0-dim host scalar is legal
        with pytest.raises(DeviceMismatch, match="numpy"):
            weight.sum(-1).numpy()
        weight.sum(-1).cpu().numpy()  # the host copy converts
        assert weight[torch.tensor([0, 2])].shape == (2, 3)  # host index tensors are legal
        float(weight.sum())
        (weight > 0).nonzero()
    assert sum(accelerator.syncs.values()) == 2


def test_emulation_tells_the_host_device_from_the_accelerators_like_cuda():
    """Issue 48 (12): it tagged any explicit device as the accelerator (``device="cpu"``, ``.to(torch.device("cpu"))``)
    and let ``np.asarray`` of a device tensor through; CUDA refuses all three."""
    import numpy as np

    accelerator = EmulatedAccelerator()
    weight = torch.randn(4, 3)
    with accelerator:
        accelerator.put(weight)
        for host in (torch.ones(4, 1, device="cpu"), torch.ones(4, 1, device=torch.device("cpu")),
                     torch.ones(4, 1).to(torch.device("cpu")), torch.zeros_like(weight[:, :1], device="cpu")):
            with pytest.raises(DeviceMismatch, match=r"host tensor of shape \(4, 1\)"):
                weight + host
        with pytest.raises(DeviceMismatch, match="numpy"):
            np.asarray(weight)
        moved = weight.to(torch.device("cpu"))  # a host copy: the device tensor stays tagged, the copy is not
        assert accelerator.is_on(weight) and not accelerator.is_on(moved)
        np.asarray(moved)
        # What names the accelerator: a tagged tensor's .device (also wrapped in torch.device), put() and ACCELERATOR.
        for device in (weight.device, torch.device(weight.device), DEVICE):
            assert accelerator.is_on(torch.ones(4, 1, device=device)) and accelerator.is_on(torch.ones(2).to(device))
        layer = torch.nn.Linear(3, 2).to(weight.device)  # nn.Module.to parses the device into a new object
        assert accelerator.is_on(layer.weight) and not accelerator.is_on(torch.nn.Linear(3, 2).to("cpu").weight)
        trainer_device = torch.device("cpu")
        assert not accelerator.is_on(torch.ones(2).to(trainer_device))
        accelerator.put(trainer_device)
        assert accelerator.is_on(torch.ones(2).to(trainer_device))


# -- the training step of every family, every loss path ----------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_training_step_of_every_family_runs_on_the_device_without_host_syncs(family):
    accelerator = EmulatedAccelerator()
    train_steps(tiny_model(family, **REGULARIZERS), accelerator)
    assert_no_own_syncs(accelerator)


def test_training_step_of_the_wrapper_runs_on_the_device_without_host_syncs():
    accelerator = EmulatedAccelerator()
    train_steps(normalize_tied_head(source_model("llama"), "cosine"), accelerator)
    assert_no_own_syncs(accelerator)


LOSS_PATHS = {
    "plain": {},
    "label_smoothing": {"label_smoothing": 0.1},
    "chunked": {"loss_chunk_size": 4, "label_smoothing": 0.1},
    "fused": {"loss_implementation": "fused", "head_mode": "cosine", "logit_scale_kind": "vector", "logit_bias": True},
    "adaptive": {"adaptive_cutoffs": [20, 40], "head_mode": "cosine", "logit_scale_kind": "scalar"},
    "adaptive_l2": {"adaptive_cutoffs": [20, 40], "head_mode": "l2"},
    "regularizers": REGULARIZERS,
    "logit_bias": {"logit_bias": True, "head_mode": "distance"},
}


@pytest.mark.parametrize("path", LOSS_PATHS)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16"])
def test_every_loss_path_runs_on_the_device_without_host_syncs(path, autocast):
    accelerator = EmulatedAccelerator()
    train_steps(tiny_model("seq2seq", **LOSS_PATHS[path]), accelerator, autocast=autocast)
    assert_no_own_syncs(accelerator)


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_adaptive_input_adds_no_host_sync(family):
    """It synced 10 times a step (a bool of the id range, a nonzero per band; issue 38)."""
    model = tiny_model(family, adaptive_cutoffs=[20, 40])
    accelerator = EmulatedAccelerator(strict_syncs=True)
    with accelerator:
        accelerator.put(model)
        model.get_input_embeddings()(torch.tensor([[5, 25, 60, 0]]).to(DEVICE))


# -- generation, weight-norm init, conversion, export --------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("num_beams", [1, 2])
def test_generate_runs_on_the_device(family, num_beams):
    model = tiny_model(family)
    with EmulatedAccelerator() as accelerator:
        accelerator.put(model)
        ids = model_inputs(model)["input_ids"].to(DEVICE)
        out = model.generate(ids, max_new_tokens=3, num_beams=num_beams, do_sample=False)
    assert out.shape[0] == ids.shape[0]


@pytest.mark.parametrize("family", ["seq2seq", "causal"])
def test_weight_norm_init_of_a_model_on_the_device(family):
    model = tiny_model(family, head_mode="baseline")
    counts = list(range(model.config.vocab_size))  # host counts, as the data gives them
    with EmulatedAccelerator() as accelerator:
        accelerator.put(model)
        weight_norm_init_(model, counts, sigma=0.5)
        model(**{k: v.to(DEVICE) for k, v in training_batch(model).items()})


# Both routes: the wrapper (generic=True keeps Marian's / BART's random non-zero final_logits_bias) and the own family.
@pytest.mark.parametrize("source, head_mode, lossless, generic", [("marian", "cosine", False, True),
                                                                  ("llama", "distance", True, False),
                                                                  ("bart", "square", True, True)])
def test_conversion_of_a_model_on_the_device(source, head_mode, lossless, generic):
    model = source_model(source)
    with EmulatedAccelerator() as accelerator:
        accelerator.put(model)
        converted = normalize_tied_head(model, head_mode, lossless_start=lossless, generic=generic)
        accelerator.put(converted)  # new parameters (logit scale, bias) are created where the source lives
        batch = {k: v.to(DEVICE) for k, v in inputs_for(converted).items()}
        converted(**batch, labels=batch.get("decoder_input_ids", batch["input_ids"])).loss.backward()


@pytest.mark.parametrize("family", [*FAMILIES, "wrapped"])
def test_in_memory_export_plain_of_a_model_on_the_device(family, monkeypatch):
    """export_plain built the parent on the host and fed it the source's device inputs, and wrote its zero bias on
    the host (issue 38). The parent is loaded by from_pretrained, with device_map={"": device} off the CPU: a branch
    on device.type, which the emulation cannot take (its tensors are on the CPU); the stand-in checks that the parent
    is asked for on the source's device and puts it there, as that branch does on CUDA."""
    original = export_module._parent_as_loaded

    def built_on_the_device(parent_class, config, state, dtype, device):
        assert accelerator.names_device(device), f"the parent is built on {device}, not on the source's device"
        return accelerator.put(original(parent_class, config, state, dtype, device))

    monkeypatch.setattr(export_module, "_parent_as_loaded", built_on_the_device)
    if family == "wrapped":
        model = normalize_tied_head(source_model("llama"), "cosine", generic=True)
    elif tiny_model(family).config.is_encoder_decoder:  # Marian / BART: a bias slot after the output layer
        model = tiny_model(family, head_mode="distance", logit_bias=True)
    else:
        model = tiny_model(family, head_mode="cosine")
    with EmulatedAccelerator() as accelerator:
        accelerator.put(model)
        exported = export_plain(model, check=True)
    assert exported.max_abs_diff < 1e-4
    assert all(accelerator.is_on(p) for p in exported.model.parameters())


# -- the Trainer loop with every callback, the plots and the card --------------------------------------------------


class StepSyncs:
    """A Trainer callback counting hf_tiednorm's host syncs between each step's begin and end."""

    def __init__(self, accelerator: EmulatedAccelerator):
        self.accelerator, self.per_step = accelerator, []

    def on_step_begin(self, args, state, control, **kwargs):
        self.accelerator.reset_syncs()

    def on_step_end(self, args, state, control, **kwargs):
        self.per_step.append(dict(self.accelerator.own_syncs))

    def __getattr__(self, name):  # every other event: nothing
        if name.startswith("on_"):
            return lambda *args, **kwargs: None
        raise AttributeError(name)


def test_trainer_loop_with_every_callback_plots_and_card_on_the_device(tmp_path):
    from hf_tiednorm.training.run_directory import save_final_model
    from hf_tiednorm.training.steps import write_plots_and_card

    tokenizer = tiny_tokenizer()
    model = tiny_model("seq2seq", label_smoothing=0.1, pad_token_id=tokenizer.pad_token_id, **REGULARIZERS)
    texts = ["a dog runs on the grass .", "two men play music in the street .", "a woman reads a book ."] * 3
    encoded = [{"input_ids": tokenizer(t)["input_ids"], "labels": tokenizer(t[::-1])["input_ids"]} for t in texts]
    args = TiedNormSeq2SeqTrainingArguments(
        output_dir=str(tmp_path), do_train=True, max_steps=4, per_device_train_batch_size=3,
        per_device_eval_batch_size=3,
        eval_strategy="steps", eval_steps=2, save_strategy="steps", save_steps=2, load_best_model_at_end=True,
        metric_for_best_model="loss", greater_is_better=False, logging_steps=2, report_to="none", bf16=False,
        disable_tqdm=True, save_only_model=True,
    )
    callbacks = run_callbacks(RunArguments(max_train_minutes=60.0, early_stopping_patience=3))
    assert {type(c).__name__ for c in callbacks} == {"TiedWeightsCheck", "TimeBudgetCallback", "EarlyStoppingCallback"}
    accelerator = EmulatedAccelerator()
    steps = StepSyncs(accelerator)
    counts = torch.bincount(torch.tensor([i for row in encoded for i in row["input_ids"] + row["labels"]]),
                            minlength=model.config.vocab_size)
    torch.save(counts, tmp_path / "token_counts.pt")
    with accelerator:
        accelerator.put(model, args.device)  # the Trainer moves the model and each batch to args.device
        trainer = TiedNormSeq2SeqTrainer(
            model=model, args=args, train_dataset=encoded, eval_dataset=encoded[:3], processing_class=tokenizer,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100),
            callbacks=[*callbacks, steps],
        )
        accelerator.put(trainer.accelerator.device)  # and accelerate's prepare() to its own device object
        trainer.train()
        save_final_model(trainer)
        write_plots_and_card(trainer, model, card={})
    assert len(steps.per_step) == 4 and not any(steps.per_step), steps.per_step
    assert (tmp_path / "embedding_norms.png").is_file() and (tmp_path / "embedding_norms_vs_frequency.png").is_file()
    assert (tmp_path / "README.md").is_file()


def test_plots_of_a_model_on_the_device(tmp_path):
    """plots.py called .numpy() on the norms (a CUDA tensor after GPU training; issue 38)."""
    model = tiny_model("causal", adaptive_cutoffs=[20, 40])
    counts = torch.arange(model.config.vocab_size)  # on the host, as token_counts.pt loads
    with EmulatedAccelerator() as accelerator:
        accelerator.put(model)
        written = plot_embedding_norms(model, tmp_path, counts)
    assert [p.name for p in written] == ["embedding_norms.png", "embedding_norms_vs_frequency.png"]


# -- the time budget's collective ------------------------------------------------------------------------------------


@pytest.fixture
def process_group(request):
    """A one-process group whose only backend serves ``request.param`` (gloo under that device type)."""
    with tempfile.TemporaryDirectory() as folder:
        dist.init_process_group(backend=f"{request.param}:gloo", init_method=f"file://{folder}/store", rank=0,
                                world_size=1)
        try:
            yield request.param
        finally:
            dist.destroy_process_group()


@pytest.mark.parametrize("process_group", ["cuda"], indirect=True)
def test_a_group_serving_only_cuda_refuses_a_host_tensor_like_nccl(process_group):
    """What --max_train_minutes met on several GPUs: NCCL's error for a host tensor, reproduced by gloo as the only
    backend of "cuda" (the emulated collectives below raise the same)."""
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        dist.all_reduce(torch.tensor(1.0))


@pytest.mark.parametrize("process_group", ["meta"], indirect=True)
def test_time_budget_reduces_on_the_device_its_group_serves(process_group):
    """The agreement tensor lives on the device it is given (the Trainer's), so a group serving only that device
    reduces it: here gloo serving only "meta", where a host tensor is refused as NCCL refuses one."""
    flag = TimeBudgetCallback.ranks_over(True, torch.device("meta"))
    assert flag.device.type == "meta" and flag.shape == ()
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        TimeBudgetCallback.ranks_over(True, torch.device("cpu"))


@pytest.mark.parametrize("process_group", ["cpu"], indirect=True)
def test_time_budget_agrees_on_the_trainers_device_every_n_steps_without_per_step_syncs(process_group):
    callback = TimeBudgetCallback(minutes=0.0, agree_every=3)  # already over
    args = SimpleNamespace(device=DEVICE)
    accelerator = EmulatedAccelerator()
    with accelerator, emulated_collectives(accelerator):
        for step in (1, 2):  # no agreement step: no collective, no host sync, training goes on
            control = TrainerControl()
            callback.on_step_end(args, TrainerState(global_step=step), control)
            assert not control.should_training_stop and not accelerator.syncs
        control = TrainerControl()
        callback.on_step_end(args, TrainerState(global_step=3), control)  # all ranks reduce on the device
    assert control.should_training_stop and control.should_save
    assert sum(accelerator.syncs.values()) == 1  # the one read of the agreed flag


def test_time_budget_of_one_process_reads_only_its_clock():
    callback = TimeBudgetCallback(minutes=1.0)
    control = TrainerControl()
    with EmulatedAccelerator() as accelerator:
        callback.on_step_end(SimpleNamespace(device=DEVICE), TrainerState(global_step=1), control)
        assert not control.should_training_stop
        callback.deadline = time.monotonic() - 1
        callback.on_step_end(SimpleNamespace(device=DEVICE), TrainerState(global_step=2), control)
    assert control.should_training_stop and not accelerator.syncs


def test_time_budget_rejects_a_non_positive_agreement_interval():
    with pytest.raises(ValueError, match="agree_every"):
        TimeBudgetCallback(1.0, agree_every=0)



