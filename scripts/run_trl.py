#!/usr/bin/env python
"""Fine-tune a saved hf_tiednorm causal LM with TRL: supervised (SFT), preference (DPO) or RL (GRPO) training.

    python scripts/run_trl.py sft --model_name_or_path runs/clm --train_file data/train.{lang} --output_dir runs/sft
    python scripts/run_trl.py sft --data_kind conversational --assistant_only_loss ...   # or prompt_completion
    python scripts/run_trl.py dpo --model_name_or_path smollm2-cosine --train_file ... --output_dir runs/dpo
    python scripts/run_trl.py grpo --model_name_or_path runs/clm --train_file ... --output_dir runs/grpo --lora

TRL's stock trainers and configs, on a toy task built from parallel text (``--train_file data/train.{lang}``, the
translation scripts' files, Multi30k by default): the source sentence is the prompt and its translation the answer.

* ``sft``: ``--data_kind text`` ("<source> = <target>" lines), ``prompt_completion`` (loss on the completion only)
  or ``conversational`` (user/assistant messages; ``--assistant_only_loss`` trains on the assistant turns only, with
  a chat template that marks them when the tokenizer has none).
* ``dpo``: prompt = source, chosen = its translation, rejected = another sentence's; the reference model is a frozen
  copy of the model (TRL's default), or the model with its adapters disabled under ``--lora``.
* ``grpo``: completions sampled for each prompt are rewarded by a toy reward, the fraction of the reference
  translation's words they contain.

The model is any causal hf_tiednorm folder: an own-family run (scripts/run_clm.py), a conversion (``tiednorm-convert``,
e.g. SmolLM2 with ``--lossless-start``) or a saved wrapper. TRL scores the tokens through the model's normalized head
exactly (hf_tiednorm/modeling/head/scoring_guard.py); its metrics (``mean_token_accuracy`` and ``entropy`` in SFT,
rewards and log-probabilities in DPO / GRPO) are logged as usual. ``--lora`` trains LoRA adapters on the attention and
MLP layers through TRL's ``peft_config`` (never on the head or the embedding: hf_tiednorm/modeling/head/peft_guard.py);
the head's learned terms stay frozen unless ``--lora_head_terms`` trains them with the adapters
(hf_tiednorm/training/peft_terms.py). The script imports hf_tiednorm, so TRL's stock configs rebuild the reference
model from the folder (DPO without ``--lora``); a script of your own that loads the folder as remote code only sets
``trust_remote_code=True`` in the trainer's config instead (docs/training.md, "With TRL").
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from transformers import AutoModelForCausalLM, AutoTokenizer

import hf_tiednorm  # noqa: F401  (registers the hf_tiednorm model types with the Auto classes)
from hf_tiednorm.training.data import load_parallel

# A chat template for a tokenizer that has none: the assistant turns inside {% generation %} so that TRL's
# assistant_only_loss can mask the rest, the end-of-sequence token inside them so that the model learns to stop.
CHAT_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{% generation %}"
    "{{ message['content'] }}{{ eos_token }}{% endgeneration %}{% else %}{{ message['content'] }} = {% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{% endif %}"
)
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"  # the training scripts' default data
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "c_attn", "c_proj", "gate_proj", "up_proj", "down_proj"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("trainer", choices=("sft", "dpo", "grpo"))
    parser.add_argument("--model_name_or_path", required=True, help="a saved hf_tiednorm causal LM folder")
    parser.add_argument("--train_file", default=str(MULTI30K / "train.{lang}.gz"),
                        help="parallel text, a pattern holding {lang} (default: Multi30k's, as run_translation.py)")
    parser.add_argument("--source_lang", default="de")
    parser.add_argument("--target_lang", default="en")
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--data_kind", choices=("text", "prompt_completion", "conversational"), default="text",
                        help="sft only: what each example is")
    parser.add_argument("--assistant_only_loss", action="store_true", help="sft, conversational: loss on replies only")
    parser.add_argument("--max_samples", type=int, default=256, help="training pairs used")
    parser.add_argument("--max_steps", type=int, default=20)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=1e-4)
    parser.add_argument("--max_length", type=int, default=64)
    parser.add_argument("--num_generations", type=int, default=2, help="grpo: completions per prompt")
    parser.add_argument("--max_completion_length", type=int, default=12, help="grpo: tokens per completion")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (TRL's peft_config) instead")
    parser.add_argument("--lora_head_terms", action="store_true",
                        help="with --lora: train the head's learned terms (logit scale g, logit bias b) beside the "
                        "adapters, saved with them (hf_tiednorm.training.peft_terms.train_head_terms); default: frozen")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (default: fp32)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def toy_examples(args: argparse.Namespace):
    """The training examples of ``args.trainer`` (and ``--data_kind``) as a ``datasets.Dataset``."""
    pairs = load_parallel({"train": args.train_file}, args.source_lang, args.target_lang)["train"]
    pairs = pairs.select(range(min(args.max_samples, len(pairs))))
    sources, targets = pairs[args.source_lang], pairs[args.target_lang]
    shuffled = random.Random(args.seed).sample(targets, len(targets))
    rows = []
    for i, (source, target) in enumerate(zip(sources, targets, strict=True)):
        if args.trainer == "dpo":
            rows.append({"prompt": f"{source} =", "chosen": f" {target}", "rejected": f" {shuffled[i]}"})
        elif args.trainer == "grpo":
            rows.append({"prompt": f"{source} =", "reference": target})
        elif args.data_kind == "text":
            rows.append({"text": f"{source} = {target}"})
        elif args.data_kind == "prompt_completion":
            rows.append({"prompt": f"{source} =", "completion": f" {target}"})
        else:
            rows.append({"messages": [{"role": "user", "content": source}, {"role": "assistant", "content": target}]})
    return pairs.from_list(rows)


def word_overlap_reward(completions: list[str], reference: list[str], **_) -> list[float]:
    """The toy GRPO reward: the fraction of the reference translation's words found in each completion, less 0.01 per
    character of length difference to the reference (so that completions of one prompt differ in reward from the
    start, which GRPO's advantages need)."""
    rewards = []
    for completion, target in zip(completions, reference, strict=True):
        words = target.lower().split()
        overlap = len(set(words) & set(completion.lower().split())) / max(1, len(words))
        rewards.append(overlap - 0.01 * abs(len(completion.strip()) - len(target)))
    return rewards


def main(argv: list[str] | None = None) -> list[dict]:
    """Train and save into ``--output_dir``; returns the trainer's log history (TRL's metrics, step by step)."""
    args = parse_args(argv)
    import trl  # the optional extra: python -m pip install -e ".[trl]"

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if tokenizer.chat_template is None:
        tokenizer.chat_template = CHAT_TEMPLATE
    model = AutoModelForCausalLM.from_pretrained(args.model_name_or_path)
    common = dict(
        output_dir=args.output_dir, max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size, learning_rate=args.learning_rate,
        logging_steps=1, report_to="none", save_strategy="no", seed=args.seed, bf16=args.bf16, use_cpu=True,
        dataloader_pin_memory=False,
    )
    peft_config = None
    if args.lora:
        from peft import LoraConfig

        present = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()}
        peft_config = LoraConfig(r=8, lora_alpha=16, target_modules=[t for t in LORA_TARGETS if t in present],
                                 task_type="CAUSAL_LM")
    if args.lora_head_terms:  # the adapter made here, so that the head's terms train and save with it
        if peft_config is None:
            raise SystemExit("--lora_head_terms trains the head's terms beside LoRA adapters: add --lora")
        from peft import get_peft_model

        from hf_tiednorm.training.peft_terms import train_head_terms

        model, peft_config = get_peft_model(model, peft_config), None
        train_head_terms(model)
    dataset = toy_examples(args)
    if args.trainer == "sft":
        config = trl.SFTConfig(max_length=args.max_length, assistant_only_loss=args.assistant_only_loss, **common)
        trainer = trl.SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                                 peft_config=peft_config)
    elif args.trainer == "dpo":
        config = trl.DPOConfig(max_length=args.max_length, **common)
        trainer = trl.DPOTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer,
                                 peft_config=peft_config)
    else:
        config = trl.GRPOConfig(num_generations=args.num_generations, max_completion_length=args.max_completion_length,
                                **common)
        trainer = trl.GRPOTrainer(model=model, args=config, reward_funcs=word_overlap_reward, train_dataset=dataset,
                                  processing_class=tokenizer, peft_config=peft_config)
    result = trainer.train()
    trainer.save_model(args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    print(f"{args.trainer}: trained {result.global_step} steps, last log {trainer.state.log_history[-2]}")
    return trainer.state.log_history


if __name__ == "__main__":
    main()
