"""One rank of scripts/verify_fsdp_tie.py (and tests/end_to_end/test_distributed.py): shard a tiny model of every
family, train it and measure it against the same model trained unsharded in this process on the whole global batch.

    python -m torch.distributed.run --standalone --nproc_per_node 2 scripts/fsdp_tie_worker.py ROUTE OUT_JSON \
        [FAMILY ...] [--device {auto,cpu,cuda}]

ROUTE: "fsdp2" (torch ``fully_shard`` through ``hf_tiednorm.training.fsdp.fully_shard_tied``),
"accelerate" (accelerate's own FSDP2 preparation, ``fsdp_version=2`` + transformer-based wrapping) or "zero3" (DeepSpeed
ZeRO-3 through accelerate). Rank 0 writes {family: {measurement: value}} to OUT_JSON; the test asserts on the numbers.
Every rank gets 2 examples of a global batch of 2 x world size, so the sharded run and the reference see the same
examples; the optimizer is SGD because Adam's update is blind to a gradient scaled by the world size (FSDP2 over gloo
summing instead of averaging, torch issue 162338) and SGD's is not.

Device: ``--device cpu`` runs CPU processes over gloo (what tests/end_to_end/test_distributed.py launches); ``cuda``
puts rank ``LOCAL_RANK`` on GPU ``LOCAL_RANK`` over nccl (one process per GPU); ``auto`` (default) is ``cuda`` when a
GPU is visible. ``use_device`` is the only place that differs between the two: the models, the batches and the reference
run live on the rank's device, the rest of the worker is the same code.

Self-contained (the tiny models are built here, not imported from the repository's tests/), so a user's checkout
or copy of scripts/ runs it as it is.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors import safe_open

import hf_tiednorm
from hf_tiednorm.modeling.families.tie_topology import embedding_tie
from hf_tiednorm.training.fsdp import fully_shard_tied, untied_pairs

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is downloaded: the models are built in code
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# The tiny model of each family of the table (hf_tiednorm/modeling/families/table.py; the sizes of
# tests/testing_utils.py's tiny
# models): a new family needs no entry here. BART's scale_embedding=True covers its in-module sqrt(d) scaling.
_ENCODER_DECODER = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0)
_DECODER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
_EXTRA_FIELDS = {"bart": {"scale_embedding": True}}
FAMILIES = tuple(hf_tiednorm.FAMILIES)

STEPS = 3
LEARNING_RATE = 0.5  # SGD: large enough that a wrong gradient (or a split tie) shows within a few steps
RANK_BATCH = 2  # examples per rank; the global batch is RANK_BATCH x world size (4 on 2 processes)
# Set once by use_device(): where this rank's models and tensors live.
DEVICE = torch.device("cpu")
# The regularizers read whole weight matrices outside the modules owning them: sharded training must see them whole.
REGULARIZERS = {"projection_regularization": 0.15, "weight_norm_regularization": 1e-3}


def use_device(requested: str) -> str:
    """The one device switch: sets DEVICE for this rank and returns the process-group backend.

    cuda: GPU LOCAL_RANK, nccl, float32 matmuls in full precision (no TF32: the sharded run is compared with the
    1-process reference at float32 tolerances). cpu: gloo."""
    global DEVICE
    if requested == "auto":
        requested = "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        torch.set_float32_matmul_precision("highest")
        DEVICE = torch.device("cuda", local_rank)
        return "nccl"
    DEVICE = torch.device("cpu")
    return "gloo"


def on_cpu() -> bool:
    return DEVICE.type == "cpu"


def tiny_model(family: str, **overrides) -> torch.nn.Module:
    """A tiny randomly initialized model of ``family`` (61 tokens, d = 32, 2 layers), the same on every rank."""
    row = hf_tiednorm.FAMILIES[family]
    fields = (_ENCODER_DECODER if row.is_encoder_decoder else _DECODER) | _EXTRA_FIELDS.get(family, {})
    config = row.config_class(vocab_size=61, max_position_embeddings=64, **fields | overrides)
    torch.manual_seed(0)
    return row.lm_class(config).eval()


def build(family: str) -> torch.nn.Module:
    return tiny_model(family, **REGULARIZERS).to(DEVICE).train()


def global_batch(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every label is a real token, so the mean loss of each rank's share averages to the global batch's mean.
    Drawn on the CPU (the same examples on every device), then moved to this rank's device."""
    generator = torch.Generator().manual_seed(1)
    vocab = model.config.vocab_size
    size = RANK_BATCH * dist.get_world_size()
    ids = torch.randint(4, vocab, (size, 9), generator=generator)
    if model.config.is_encoder_decoder:
        batch = {"input_ids": ids, "labels": torch.randint(4, vocab, (size, 7), generator=generator)}
    else:
        batch = {"input_ids": ids, "labels": ids}
    return {key: value.to(DEVICE) for key, value in batch.items()}


def shard_of(batch: dict[str, torch.Tensor], rank: int, world: int) -> dict[str, torch.Tensor]:
    return {key: value.chunk(world)[rank] for key, value in batch.items()}


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole value of an FSDP2 (DTensor) or DeepSpeed ZeRO-3 (partitioned) tensor; others as they are."""
    if hasattr(tensor, "full_tensor"):
        return tensor.full_tensor()
    return tensor.detach().clone()


def tied_name(model: torch.nn.Module) -> str:
    tie = embedding_tie(model.config)
    return f"{tie.owner}.{tie.owner_params[0]}"


def train_reference(family: str, batch: dict[str, torch.Tensor]) -> dict:
    """The unsharded model, one process, the whole global batch: losses, first tied gradient, eval logits."""
    model = build(family)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    losses, terms, grads, step_logits = [], None, None, []
    for step in range(STEPS):
        output = model(**batch)
        output.loss.backward()
        if step == 0:
            grads = {name: param.grad.clone() for name, param in model.named_parameters() if param.grad is not None}
            terms = [output.projection_penalty.item(), output.weight_norm_penalty.item()]
        optimizer.step()
        optimizer.zero_grad()
        losses.append(output.loss.item())
        step_logits.append(evaluate(model, batch))
    model.eval()
    return {"model": model, "losses": losses, "terms": terms, "grads": grads, "logits": step_logits[-1],
            "step_logits": step_logits}


def evaluate(model, batch) -> torch.Tensor:
    """Eval-mode logits under no_grad, where the head may serve its cached norms."""
    model.eval()
    with torch.no_grad():
        logits = model(**eval_inputs(batch)).logits
    model.train()
    return logits


def eval_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The batch without labels (an encoder-decoder reads the target tokens as its decoder input)."""
    if batch["labels"] is batch["input_ids"]:
        return {"input_ids": batch["input_ids"]}
    return {"input_ids": batch["input_ids"], "decoder_input_ids": batch["labels"]}


def mean_over_ranks(value: float) -> float:
    tensor = torch.tensor(value, dtype=torch.float64, device=DEVICE)
    dist.all_reduce(tensor)
    return tensor.item() / dist.get_world_size()


def train_sharded(model, batch, backward, update, reference: dict, module=None, full_grad=None) -> dict:
    """STEPS steps on this rank's half of ``batch``; the gap to the reference, per measurement.

    ``backward(loss)`` and ``update()`` train the wrapped ``model``; ``module`` is the model inside it (parameter
    names), ``full_grad(param)`` the whole gradient of a parameter after the backward."""
    module = model if module is None else module
    full_grad = full_grad or (lambda param: None if param.grad is None else full(param.grad))
    rank, world = dist.get_rank(), dist.get_world_size()
    losses, terms, grad_diffs, cached_diffs = [], None, None, []
    for step in range(STEPS):
        output = model(**shard_of(batch, rank, world))
        backward(output.loss)
        if step == 0:
            # Every parameter's gradient, the tied one included, as the whole-batch gradient of one process.
            grads = {name: full_grad(param) for name, param in module.named_parameters() if name in reference["grads"]}
            grad_diffs = {
                name: float("inf") if grad is None else (grad - reference["grads"][name]).abs().max().item()
                for name, grad in grads.items()
            }
            terms = [mean_over_ranks(output[name].item()) for name in ("projection_penalty", "weight_norm_penalty")]
        update()
        losses.append(mean_over_ranks(output.loss.item()))
        # An evaluation between steps, as the Trainer's: the head's cached norms must follow the refilled weights.
        cached_diffs.append((evaluate(model, batch) - reference["step_logits"][step]).abs().max().item())
    return {
        "cached_logits_diff": max(cached_diffs),
        "losses": losses,
        "reference_losses": reference["losses"],
        "loss_diff": max(abs(a - b) for a, b in zip(losses, reference["losses"])),
        "grad_diff": max(grad_diffs.values()),
        "worst_grad": max(grad_diffs, key=grad_diffs.get),
        "grad_scale": max(grad.abs().max().item() for grad in reference["grads"].values()),
        "penalty_diff": max(abs(a - b) for a, b in zip(terms, reference["terms"])),
        "penalties": terms,
    }


def sgd_step(optimizer):
    def step() -> None:
        optimizer.step()
        optimizer.zero_grad()

    return step


def final_logits_diff(model, batch, reference: dict) -> float:
    """Logits after training vs the reference's, computed with grad enabled (so the head's cache is bypassed)."""
    model.eval()
    logits = model(**eval_inputs(batch)).logits.detach()
    model.train()
    return (logits - reference["logits"]).abs().max().item()


@contextlib.contextmanager
def without_zero3_init():
    """Rank 0 alone reloads the saved model: under ZeRO-3 transformers would build it partitioned (collectives)."""
    from transformers.integrations import deepspeed

    saved = deepspeed._hf_deepspeed_config_weak_ref
    deepspeed._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        deepspeed._hf_deepspeed_config_weak_ref = saved


def check_saved(family: str, folder: str, reference: dict, batch) -> dict:
    """Reload what save_pretrained wrote from the gathered state dict: tied, stored once, same logits."""
    with safe_open(Path(folder) / "model.safetensors", "pt") as handle:
        keys = set(handle.keys())
    auto = hf_tiednorm.FAMILIES[family].auto_class
    with without_zero3_init():
        reloaded = auto.from_pretrained(folder).to(DEVICE).eval()
    with torch.no_grad():
        logits = reloaded(**eval_inputs(batch)).logits
    tie = embedding_tie(reloaded.config)
    return {
        "reloaded_untied": untied_pairs(reloaded),
        "tied_keys_saved": sorted(keys & set(tie.tied_weights_keys())),
        "owner_saved": tied_name(reloaded) in keys,
        "reloaded_logits_diff": (logits - reference["logits"]).abs().max().item(),
    }


def run_fsdp2(family: str) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    model = build(family)
    batch = global_batch(model)
    reference = train_reference(family, batch)
    fully_shard_tied(model, mesh=init_device_mesh(DEVICE.type, (dist.get_world_size(),)))
    # Before any forward: a group kept gathered after a forward (reshard_after_forward=False) exposes its gathered
    # tensors, not the sharded parameters, through parameters() until the next backward reshards it.
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    result = {"untied_after_prepare": untied_pairs(model)}
    evaluate(model, batch)  # warms the head's inference cache before any step
    result |= train_sharded(model, batch, torch.Tensor.backward, sgd_step(optimizer), reference)
    result["untied_after_training"] = untied_pairs(model)
    result["logits_diff"] = final_logits_diff(model, batch, reference)
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            model.save_pretrained(folder, state_dict=state)
            result |= check_saved(family, folder, reference, batch)
    return result


def accelerate_fsdp2():
    """An Accelerator and the FSDP2 plugin of scripts/accelerate/fsdp2.yaml (transformer-based wrapping)."""
    from accelerate import Accelerator, FullyShardedDataParallelPlugin

    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, auto_wrap_policy="transformer_based_wrap", state_dict_type="FULL_STATE_DICT",
        reshard_after_forward=True, cpu_ram_efficient_loading=False,
    )
    return Accelerator(cpu=on_cpu()), plugin


def force_fsdp(plugin) -> None:
    """Test-only: on CPU accelerate picks MULTI_CPU and drops the FSDP plugin; switching its shared state to FSDP
    makes prepare() take the FSDP2 route. (A Trainer's Accelerator resets the state, so call it per model.) On GPUs
    the same switch replaces what `accelerate launch --config_file scripts/accelerate/fsdp2.yaml` sets up."""
    from accelerate.state import AcceleratorState, PartialState
    from accelerate.utils import DistributedType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    PartialState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["distributed_type"] = DistributedType.FSDP
    AcceleratorState._shared_state["fsdp_plugin"] = plugin
    # The plugin binds its wrap policy to the first model's layer classes; start over for each model.
    plugin.auto_wrap_policy, plugin.transformer_cls_names_to_wrap = transformer_auto_wrap_policy, None


def run_accelerate(family: str, accelerator, plugin) -> dict:
    model = build(family)
    batch = global_batch(model)
    reference = train_reference(family, batch)
    force_fsdp(plugin)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    model, optimizer = accelerator.prepare(model, optimizer)
    result = {"untied_after_prepare": untied_pairs(model)}
    evaluate(model, batch)  # warms the head's inference cache before any step
    result |= train_sharded(model, batch, accelerator.backward, sgd_step(optimizer), reference)
    result["untied_after_training"] = untied_pairs(model)
    result["logits_diff"] = final_logits_diff(model, batch, reference)
    state = accelerator.get_state_dict(model)  # gathered on rank 0
    if dist.get_rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            accelerator.unwrap_model(model).save_pretrained(folder, state_dict=state)
            result |= check_saved(family, folder, reference, batch)
    if model.config.is_encoder_decoder:
        result |= predict_with_generate(model, reference["model"])
    return result


def predict_with_generate(model, reference_model) -> dict:
    """Seq2SeqTrainer evaluation with predict_with_generate on the sharded model: each rank generates its share of
    sources (of different lengths, so ranks finish at different steps) and the gathered predictions must be the
    reference model's greedy outputs."""
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments

    generator = torch.Generator().manual_seed(2)
    # 4 sources, or the next multiple of the world size: every rank gets the same number, none is padded with a
    # repeated source (with 4 sources on 3 ranks the Trainer's gathered predictions kept the 2 repeats: 6 rows).
    world = dist.get_world_size()
    lengths = [(5, 9, 6, 8)[index % 4] for index in range(-(-4 // world) * world)]
    sources = [torch.randint(4, model.config.vocab_size, (length,), generator=generator).tolist() for length in
               lengths]
    dataset = [{"input_ids": ids, "labels": ids[:4]} for ids in sources]
    with tempfile.TemporaryDirectory() as folder:
        args = Seq2SeqTrainingArguments(
            folder, per_device_eval_batch_size=1, predict_with_generate=True, generation_max_length=12,
            generation_num_beams=1, report_to="none", use_cpu=on_cpu(), dataloader_pin_memory=False,
        )
        trainer = Seq2SeqTrainer(model=model, args=args, data_collator=pad_collator(model.config.pad_token_id))
        predictions = trainer.predict(dataset).predictions
    expected = []
    with torch.no_grad():
        for ids in sources:
            source = torch.tensor([ids], device=DEVICE)
            expected.append(reference_model.generate(source, max_length=12, num_beams=1)[0].tolist())
    pad = model.config.pad_token_id
    got = [[token for token in row.tolist() if token not in (pad, -100)] for row in predictions]
    want = [[token for token in row if token != pad] for row in expected]
    return {"generated": got, "reference_generated": want}


def pad_collator(pad_token_id: int):
    def collate(features: list[dict]) -> dict[str, torch.Tensor]:
        batch = {}
        for key, fill in (("input_ids", pad_token_id), ("labels", -100)):
            rows = [feature[key] for feature in features]
            width = max(map(len, rows))
            batch[key] = torch.tensor([row + [fill] * (width - len(row)) for row in rows])
        batch["attention_mask"] = (batch["input_ids"] != pad_token_id).long()
        return batch

    return collate


def zero3_accelerator():
    """DeepSpeed ZeRO-3 through accelerate with scripts/accelerate/deepspeed_zero3.json; every parameter is
    partitioned (persistence threshold 0), so the tie and the regularizers meet partitioned weights."""
    from accelerate import Accelerator, DeepSpeedPlugin

    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    config = json.loads((Path(__file__).resolve().parents[1] / "scripts/accelerate/deepspeed_zero3.json").read_text())
    config["zero_optimization"] |= {"stage3_param_persistence_threshold": 0, "reduce_bucket_size": 10**6,
                                    "stage3_prefetch_bucket_size": 10**6}
    world = int(os.environ["WORLD_SIZE"])  # the Accelerator (and its process group) does not exist yet
    config |= {"train_micro_batch_size_per_gpu": RANK_BATCH, "train_batch_size": RANK_BATCH * world,
               "gradient_accumulation_steps": 1, "gradient_clipping": 0.0, "bf16": {"enabled": False},
               "fp16": {"enabled": False}}
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config))


def run_zero3(family: str, accelerator) -> dict:
    from deepspeed.utils import safe_get_full_grad

    model = build(family)
    batch = global_batch(model)
    reference = train_reference(family, batch)
    engine, _ = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=LEARNING_RATE))
    module = engine.module
    result = {"untied_after_prepare": untied_pairs(module)}
    evaluate(engine, batch)
    # engine.backward then engine.step (accelerator.backward would step too, before the gradients can be read).
    result |= train_sharded(engine, batch, engine.backward, engine.step, reference, module, safe_get_full_grad)
    result["untied_after_training"] = untied_pairs(module)
    result["logits_diff"] = final_logits_diff(engine, batch, reference)
    state = accelerator.get_state_dict(engine)  # consolidated on rank 0 (stage3_gather_16bit_weights_on_model_save)
    if dist.get_rank() == 0:
        with tempfile.TemporaryDirectory() as folder:
            module.save_pretrained(folder, state_dict=state)
            result |= check_saved(family, folder, reference, batch)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("route", choices=("fsdp2", "accelerate", "zero3"))
    parser.add_argument("out", help="results JSON, written by rank 0")
    # (no argparse choices: an omitted nargs="*" positional is checked as [] against them)
    parser.add_argument("families", nargs="*", metavar="FAMILY", help=f"of {FAMILIES} (default: all)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args()
    if unknown := set(args.families) - set(FAMILIES):
        parser.error(f"unknown families {sorted(unknown)}")
    args.families = args.families or list(FAMILIES)
    # A rank killed by a signal (SIGABRT from a C++ std::terminate, SIGSEGV) dumps where every thread was to stderr.
    faulthandler.enable(all_threads=True)
    backend = use_device(args.device)
    torch.set_num_threads(1)  # 2 processes on a shared 2-core machine
    if args.route == "fsdp2":
        dist.init_process_group(backend)
        results = {family: run_fsdp2(family) for family in args.families}
    elif args.route == "accelerate":
        accelerator, plugin = accelerate_fsdp2()  # its process group: gloo on CPU, nccl on GPUs
        results = {family: run_accelerate(family, accelerator, plugin) for family in args.families}
    else:
        accelerator = zero3_accelerator()
        results = {family: run_zero3(family, accelerator) for family in args.families}
    if dist.get_rank() == 0:
        Path(args.out).write_text(json.dumps(results, indent=1))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
