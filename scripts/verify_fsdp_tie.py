#!/usr/bin/env python
"""Check that FSDP keeps the tied embedding / output layer ONE parameter, for both model families.

    accelerate launch --config_file scripts/accelerate/fsdp.yaml --num_processes 1 scripts/verify_fsdp_tie.py
    python scripts/verify_fsdp_tie.py --no_fsdp        # plain smoke run (also what happens without a GPU)

For a tiny TiedNormForConditionalGeneration (three-way tie) and TiedNormForCausalLM: prepare model and optimizer
with the Accelerator (FSDP from the launch config), then check that every tied module still holds the same
parameter object; train a few AdamW steps on a real loss and check the tied matrices are still equal in the full
(gathered) state dict — a split tie would have diverged, since the copies get different gradients; save through
accelerator.get_state_dict + save_pretrained and check the reloaded model is tied and gives the same logits.
Prints one PASS/FAIL line per check and a SUMMARY, and exits 1 on any failure. On transformers 5.23, accelerate
1.15 and torch 2.11 (one H100) it PASSes with fsdp.yaml (FSDP1); with fsdp_version 2 and
fsdp_cpu_ram_efficient_loading false it FAILs for seq2seq (the three-way tie splits), see fsdp.yaml.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from dataclasses import dataclass, field

import torch
from accelerate import Accelerator
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, HfArgumentParser

import hf_tiednorm

# Module paths whose .weight must be one parameter, per family.
TIED_MODULES = {
    "seq2seq": ("model.shared", "model.encoder.embed_tokens", "model.decoder.embed_tokens", "lm_head"),
    "causal": ("model.embed_tokens", "lm_head"),
}
# FSDP wrap units per family (fsdp_transformer_layer_cls_to_wrap names one family's layers only).
LAYER_CLASSES = {"seq2seq": ["MarianEncoderLayer", "MarianDecoderLayer"], "causal": ["LlamaDecoderLayer"]}


@dataclass
class VerifyArguments:
    # Run without FSDP (plain Accelerator); automatic when no GPU is visible, since FSDP needs one.
    no_fsdp: bool = field(default=False)
    head_mode: str = field(default="cosine", metadata={"help": f"one of {hf_tiednorm.HEAD_MODES}"})
    steps: int = field(default=3)
    # Large enough that a split tie would visibly diverge within a few steps.
    learning_rate: float = field(default=1e-2)
    vocab_size: int = field(default=96)
    seed: int = field(default=0)


class Report:
    def __init__(self, accelerator: Accelerator):
        self.accelerator = accelerator
        self.failures: list[str] = []

    def check(self, name: str, ok: bool, detail: str = "") -> None:
        if not ok:
            self.failures.append(name)
        self.accelerator.print(f"{'PASS' if ok else 'FAIL'}  {name}{f'  ({detail})' if detail else ''}")


def build_model(family: str, args: VerifyArguments) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    if family == "seq2seq":
        config = hf_tiednorm.TiedNormSeq2SeqConfig(
            vocab_size=args.vocab_size, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
            dropout=0.0, head_mode=args.head_mode, tie_topology="three_way", pad_token_id=0, eos_token_id=2,
            decoder_start_token_id=1,
        )
        return hf_tiednorm.TiedNormForConditionalGeneration(config)
    config = hf_tiednorm.TiedNormCausalConfig(
        vocab_size=args.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=64, head_mode=args.head_mode, pad_token_id=0, eos_token_id=2,
    )
    return hf_tiednorm.TiedNormForCausalLM(config)


def make_batch(family: str, args: VerifyArguments, device: torch.device) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(4, args.vocab_size, (4, 12), generator=generator)
    if family == "seq2seq":
        labels = torch.randint(4, args.vocab_size, (4, 10), generator=generator)
        return {"input_ids": ids.to(device), "labels": labels.to(device)}
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def tied_weights(model: torch.nn.Module, family: str) -> list[torch.nn.Parameter]:
    return [model.get_submodule(path).weight for path in TIED_MODULES[family]]


def verify_family(family: str, args: VerifyArguments, accelerator: Accelerator, report: Report) -> None:
    accelerator.print(f"--- {family} ({args.head_mode}, tied: {', '.join(TIED_MODULES[family])})")
    model = build_model(family, args)
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    if plugin is not None:  # the plugin keeps the policy bound to the first model's classes; rebind per family
        plugin.auto_wrap_policy = transformer_auto_wrap_policy
        plugin.transformer_cls_names_to_wrap = LAYER_CLASSES[family]
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    model, optimizer = accelerator.prepare(model, optimizer)
    unwrapped = accelerator.unwrap_model(model)

    weights = tied_weights(unwrapped, family)
    report.check(f"{family}: one parameter object after prepare", all(w is weights[0] for w in weights),
                 f"{len({id(w) for w in weights})} distinct object(s), type {type(weights[0].data).__name__}")
    # Shared parameters are deduplicated by parameters(): the optimizer must see the matrix once, not per module.
    optimized = {id(p) for group in optimizer.param_groups for p in group["params"]}
    report.check(f"{family}: optimizer holds the tied matrix once",
                 len(optimized) == len({id(p) for p in model.parameters()}), f"{len(optimized)} parameters")

    batch = make_batch(family, args, accelerator.device)
    model.train()
    losses = []
    for _ in range(args.steps):
        loss = model(**batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    report.check(f"{family}: {args.steps} steps, finite decreasing loss",
                 all(map(math.isfinite, losses)) and losses[-1] < losses[0],
                 " -> ".join(f"{value:.4f}" for value in losses))

    weights = tied_weights(unwrapped, family)
    report.check(f"{family}: one parameter object after training", all(w is weights[0] for w in weights))
    state = accelerator.get_state_dict(model)  # full, on CPU, on the main process (FSDP gathers the shards)
    model.eval()
    with torch.no_grad():
        logits = model(**batch).logits.float().cpu()

    if accelerator.is_main_process:
        keys = [f"{path}.weight" for path in TIED_MODULES[family]]
        present = [key for key in keys if key in state]
        equal = all(torch.equal(state[key], state[present[0]]) for key in present)
        report.check(f"{family}: tied matrices equal in the gathered state dict", equal and bool(present),
                     f"keys {present}")
        with tempfile.TemporaryDirectory() as folder:
            unwrapped.save_pretrained(folder, state_dict=state, save_function=accelerator.save)
            auto_class = AutoModelForSeq2SeqLM if family == "seq2seq" else AutoModelForCausalLM
            reloaded = auto_class.from_pretrained(folder).to(accelerator.device).eval()
        reloaded_weights = tied_weights(reloaded, family)
        report.check(f"{family}: reloaded model tied", all(w is reloaded_weights[0] for w in reloaded_weights))
        with torch.no_grad():
            reloaded_logits = reloaded(**batch).logits.float().cpu()
        difference = (reloaded_logits - logits).abs().max().item()
        # Same weights, same device; only kernel choice (sharded vs plain module) may differ in the last bits.
        report.check(f"{family}: reloaded logits equal the trained model's",
                     torch.allclose(reloaded_logits, logits, rtol=1e-5, atol=1e-5), f"max |diff| {difference:.2e}")
    accelerator.wait_for_everyone()


def main() -> int:
    (args,) = HfArgumentParser(VerifyArguments).parse_args_into_dataclasses()
    use_fsdp = not args.no_fsdp and torch.cuda.is_available()
    if not use_fsdp:
        os.environ["ACCELERATE_USE_FSDP"] = "false"  # a launch with fsdp.yaml sets it; FSDP needs a GPU
    accelerator = Accelerator()
    report = Report(accelerator)
    plugin = getattr(accelerator.state, "fsdp_plugin", None)  # only set under FSDP
    accelerator.print(
        f"device {accelerator.device}, {accelerator.num_processes} process(es), {accelerator.distributed_type}"
        + (f", FSDP version {plugin.fsdp_version}" if plugin is not None else ", no FSDP")
        + f"; torch {torch.__version__}"
    )
    for family in ("seq2seq", "causal"):
        try:
            verify_family(family, args, accelerator, report)
        except Exception as error:  # report it and go on to the other family; the summary still fails
            report.check(f"{family}: ran without error", False, f"{type(error).__name__}: {error}")
    # Only the main process checks the saved model: every rank takes its verdict so that all exit alike.
    failed = torch.tensor(float(bool(report.failures)), device=accelerator.device)
    failed = bool(accelerator.reduce(failed, reduction="sum").item())
    details = "".join(f"\n  failed: {name}" for name in report.failures)
    accelerator.print(f"SUMMARY: {'FAIL' if failed else 'PASS'}{details}")
    accelerator.end_training()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
