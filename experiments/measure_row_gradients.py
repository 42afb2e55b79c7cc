#!/usr/bin/env python
"""Step-0 gradients of the main-job model, per head mode: does any embedding row dominate?

Builds the model of a translation config (default: the main job's, scripts/configs/multi30k_de_en.yaml) from
scratch with the joint tokenizer trained on its training data, runs one training batch of real pairs through it
(dropout off, the config's label smoothing) and reports, per mode, the largest row-gradient norm of the tied
embedding over the median one (over all rows, and over the rows that are a target in the batch: most of a real
vocabulary is absent from one batch, so the first ratio mostly measures token frequency), the padding row's gradient
norm and the whole model's gradient norm before clipping (what ``max_grad_norm`` sees). Each mode starts from the
same seed.

    python experiments/measure_row_gradients.py --output results/row_gradients.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch
import yaml

from hf_tiednorm import HEAD_MODES, TiedNormForConditionalGeneration, TiedNormSeq2SeqConfig
from hf_tiednorm.training.data import load_parallel, training_texts
from hf_tiednorm.training.tokenization import train_joint_tokenizer

ROOT = Path(__file__).resolve().parents[1]
MODEL_FIELDS = ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim",
                "label_smoothing", "tie_topology")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", default=str(ROOT / "scripts/configs/multi30k_de_en.yaml"),
                        help="translation config whose model and batch size are measured")
    parser.add_argument("--data_dir", default=str(ROOT.parent / "shared/data/multi30k"),
                        help="folder with train.{de,en}.gz")
    parser.add_argument("--modes", default=",".join(HEAD_MODES), help="comma-separated head modes")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initialization and of the batch")
    parser.add_argument("--output", default=None, help="write the results as JSON here")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    config = yaml.safe_load(Path(args.config).read_text())
    src, tgt = config["source_lang"], config["target_lang"]

    # Data and tokenizer, as the training script builds them
    train = load_parallel({"train": f"{args.data_dir}/train.{{lang}}.gz"}, src, tgt)["train"]
    tokenizer = train_joint_tokenizer(training_texts(train, [src, tgt]), vocab_size=config["vocab_size"])
    rows = torch.randperm(len(train), generator=torch.Generator().manual_seed(args.seed))
    pairs = train.select(rows[: config["per_device_train_batch_size"]].tolist())
    batch = tokenizer(list(pairs[src]), text_target=list(pairs[tgt]), padding=True, return_tensors="pt")
    batch["labels"][batch["labels"] == tokenizer.pad_token_id] = -100

    # One backward pass per mode from the same initialization seed
    results = {}
    for mode in args.modes.split(","):
        model_config = TiedNormSeq2SeqConfig(
            vocab_size=len(tokenizer), head_mode=mode, dropout=0.0, **{k: config[k] for k in MODEL_FIELDS}
        )
        torch.manual_seed(args.seed)
        model = TiedNormForConditionalGeneration(model_config).train()
        model(**batch).loss.backward()
        row_grads = model.get_input_embeddings().weight.grad.norm(dim=-1)  # (V,)
        targets = batch["labels"][batch["labels"] != -100].unique()  # rows that are a target in this batch
        total = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
        results[mode] = {
            "max_over_median_row_gradient": (row_grads.max() / row_grads.median()).item(),
            "max_over_median_target_row_gradient": (row_grads.max() / row_grads[targets].median()).item(),
            "argmax_row": row_grads.argmax().item(),
            "padding_row_gradient": row_grads[model_config.pad_token_id].item(),
            "total_gradient_norm": total.item(),
        }
        print(f"{mode:9s} " + "  ".join(f"{k}={v:.4g}" for k, v in results[mode].items()), flush=True)

    if args.output:
        record = {"config": args.config, "seed": args.seed, "batch_tokens": int((batch["labels"] != -100).sum()),
                  "torch": torch.__version__, "machine": platform.machine(), "results": results}
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
