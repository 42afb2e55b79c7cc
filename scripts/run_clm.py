#!/usr/bin/env python
"""Train (from scratch or from a saved checkpoint) a TiedNorm causal LM on text files; report perplexity.

    python scripts/run_clm.py --output_dir runs/clm                      # English side of Multi30k
    python scripts/run_clm.py config.yaml --max_steps 20                 # a .json/.yaml config file, then overrides
    ACCELERATE_USE_CPU=true accelerate launch --config_file scripts/accelerate/ddp.yaml scripts/run_clm.py ...

The last line trains on 2 CPU processes (DDP over gloo; on GPUs drop ACCELERATE_USE_CPU and set --num_processes).
Without ACCELERATE_USE_CPU=true (or --use_cpu true) on a machine without GPUs, the processes would not form one
group and each would train alone as rank 0; the script refuses to start then. `accelerate launch --cpu
--num_processes 2` starts only one process (accelerate 1.15). Every rank logs "rank N: trained S steps".

Lines are tokenized (each ends with </s>), concatenated and cut into --block_size blocks, as in HF's run_clm.
One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
--overwrite_output_dir (which deletes them first) or --resume_from_checkpoint (which continues that run: "last" is
its newest complete checkpoint, and the checkpoint's architecture must match the flags). The final model is saved
through a staging folder, so a kill never leaves a new config.json over old weights (hf_tiednorm/training.py).

Without --model_name_or_path a BPE tokenizer is trained on the training text and saved in --output_dir (a resumed
run loads its checkpoint's, so it keeps its vocabulary). Perplexity = exp(mean token cross-entropy, without
regularizer penalties) on the validation and test files.

Technique flags of a new model (Press & Wolf's projection regularization, Herold et al.'s weight-norm
regularization and initialization, Baevski & Auli's adaptive input/softmax, the chunked loss) are config fields;
each training log carries ``cross_entropy`` and every enabled penalty next to ``loss``. With --adaptive_cutoffs
the tokenizer (trained, given or reused) is renumbered by decreasing training-data frequency, special tokens
first, before the data is tokenized, and that renumbered tokenizer is the one saved with the model.

Precision: bf16 autocast is the default where training runs on a CPU with native bf16 matmuls (avx512_bf16 /
amx_bf16; with a GPU HF's default stands); the log says which precision was chosen and why; --bf16 false opts out.
Under bf16 on CPU the attention is eager with an fp32 softmax (hf_tiednorm.training.choose_attention).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
import transformers
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    default_data_collator,
    set_seed,
)

import hf_tiednorm
from hf_tiednorm.data import group_texts, load_monolingual, token_counts, training_texts
from hf_tiednorm.model_card import write_model_card
from hf_tiednorm.plots import plot_embedding_norms
from hf_tiednorm.tokenization import train_joint_tokenizer
from hf_tiednorm.trainers import TiedNormTrainer, add_perplexity
from hf_tiednorm.training import (
    OutputDirArguments,
    TiedNormModelArguments,
    TiedNormTrainingArguments,
    TiedWeightsCheck,
    check_resume_config,
    check_world_size,
    choose_attention,
    configure_threads,
    parse_arguments,
    prepare_output_dir,
    resolve_resume_checkpoint,
    save_final_model,
)
from hf_tiednorm.vocab_order import frequency_ordered
from hf_tiednorm.weight_norm_init import weight_norm_init_

logger = logging.getLogger(__name__)
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


@dataclass
class ModelArguments(TiedNormModelArguments):
    """The shared model flags (checkpoint, tokenizer, output layer, technique flags: hf_tiednorm/training.py), the
    causal LM's architecture and the process's threads."""

    # Architecture flags that map one-to-one onto TiedNormCausalConfig fields (none may change a saved model).
    config_fields = TiedNormModelArguments.config_fields + (
        "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    )

    tie_word_embeddings: bool | None = field(default=None, metadata={"help": "False trains the untied control"})
    hidden_size: int | None = field(default=None, metadata={"help": "model dimension d"})
    intermediate_size: int | None = field(default=None, metadata={"help": "feed-forward dimension"})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "decoder layers"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "attention heads per layer"})
    num_threads: int | None = field(
        default=None,
        metadata={"help": "torch CPU threads per process; None: all cores shared among the launch's processes"},
    )


@dataclass
class DataArguments:
    train_file: str = field(
        default=str(MULTI30K / "train.en.gz"),
        metadata={"help": "training text: a text file (one line a row; .gz works) or a .json/.jsonl/.csv file"},
    )
    validation_file: str | None = field(
        default=str(MULTI30K / "val.en.gz"), metadata={"help": "validation text (same formats); None: no evaluation"}
    )
    test_file: str | None = field(
        default=str(MULTI30K / "test_2016_flickr.en.gz"), metadata={"help": "test text (same formats); None: no test"}
    )
    text_column: str = field(default="text", metadata={"help": "column of the text in .json/.jsonl/.csv files"})
    block_size: int = field(
        default=128, metadata={"help": "tokens per training block; lines are concatenated across line ends"}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "use only the first N training lines (quick runs, tests)"}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "use only the first N lines of the validation and test files"}
    )
    preprocessing_num_workers: int | None = field(
        default=None, metadata={"help": "processes for the tokenization map"}
    )
    dataset_name: str | None = field(
        default=None,
        metadata={
            "help": "data set named in the model card (a Hub id); None: bentrevett/multi30k for the default files, "
            "else the training file's name"
        },
    )

    def __post_init__(self):
        if self.dataset_name is None:
            default = Path(self.train_file).parent == MULTI30K
            self.dataset_name = "bentrevett/multi30k" if default else Path(self.train_file).name
        if self.block_size < 2:
            raise ValueError(f"--block_size must be >= 2, got {self.block_size}")


def main() -> None:
    model_args, data_args, output_args, training_args = parse_arguments(
        (ModelArguments, DataArguments, OutputDirArguments, TiedNormTrainingArguments)
    )
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.info("precision: %s", training_args.precision_note)
    check_world_size(training_args)
    configure_threads(model_args.num_threads)
    if training_args.label_smoothing_factor:
        raise ValueError("use --label_smoothing (the model's loss) instead of --label_smoothing_factor")
    output_dir = Path(training_args.output_dir)
    resume = resolve_resume_checkpoint(training_args)
    # Bad flags fail before any work: the config, blocks the positions cannot hold, a resumed architecture.
    run_config = model_args.run_config(hf_tiednorm.TiedNormCausalConfig)
    # A new model gets max(--block_size, 512) positions (below); a saved one has its own.
    # A converted model reads its architecture's limit (GPT-2's n_positions); None: it has no position table.
    positions = getattr(run_config, "max_position_embeddings", None)
    if model_args.model_name_or_path is not None and positions is not None and data_args.block_size > positions:
        raise ValueError(
            f"--block_size {data_args.block_size} exceeds the saved model's max_position_embeddings={positions}; "
            "lower --block_size to at most that"
        )
    check_resume_config(resume, run_config, model_args.architecture_fields())
    split_files = {"train": data_args.train_file}
    if data_args.validation_file:
        split_files["validation"] = data_args.validation_file
    if data_args.test_file:
        split_files["test"] = data_args.test_file
    inputs = {"--model_name_or_path": model_args.model_name_or_path, "--tokenizer_name": model_args.tokenizer_name,
              **{f"--{split}_file": path for split, path in split_files.items()}}
    prepare_output_dir(training_args, output_args.overwrite_output_dir, resume, inputs)
    set_seed(training_args.seed)

    raw = load_monolingual(split_files, data_args.text_column)
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples),
                         ("test", data_args.max_eval_samples)):
        if split in raw and limit is not None:
            raw[split] = raw[split].select(range(min(limit, len(raw[split]))))

    with training_args.main_process_first(desc="tokenizer"):
        tokenizer_source = model_args.tokenizer_source(resume, output_dir)
        if tokenizer_source is not None:
            tokenizer = AutoTokenizer.from_pretrained(tokenizer_source)
        else:
            tokenizer = train_joint_tokenizer(
                training_texts(raw["train"], ["text"]), vocab_size=model_args.vocab_size,
                model=model_args.tokenizer_model, model_max_length=data_args.block_size,
            )
        if model_args.adaptive_cutoffs is not None:  # a new model (fine-tuning refuses the flag)
            train_blocks = group_texts(raw["train"], tokenizer, data_args.block_size)
            counts = token_counts(train_blocks, len(tokenizer), ("input_ids",))
            tokenizer = frequency_ordered(tokenizer, counts, model_args.tokenizer_name, output_dir)
        if (tokenizer_source is None or model_args.adaptive_cutoffs is not None) and training_args.process_index == 0:
            tokenizer.save_pretrained(output_dir)

    if model_args.model_name_or_path is not None:
        model = AutoModelForCausalLM.from_pretrained(model_args.model_name_or_path, config=run_config)
    else:
        config = hf_tiednorm.TiedNormCausalConfig(
            vocab_size=len(tokenizer),
            max_position_embeddings=max(data_args.block_size, 512),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_args.config_overrides(),
        )
        model = hf_tiednorm.TiedNormForCausalLM(config)
    logger.info(choose_attention(model, training_args))
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")

    with training_args.main_process_first(desc="grouping texts"):
        blocks = group_texts(raw, tokenizer, data_args.block_size, data_args.preprocessing_num_workers)
    for split in blocks:
        if len(blocks[split]) == 0:
            raise ValueError(f"the {split} text is shorter than one block of {data_args.block_size} tokens")
    if model_args.model_name_or_path is None:
        counts = token_counts(blocks["train"], model.config.vocab_size, ("input_ids",))
        if training_args.process_index == 0:
            output_dir.mkdir(parents=True, exist_ok=True)
            torch.save(counts, output_dir / "token_counts.pt")
        if model_args.weight_norm_init_sigma is not None:  # on every process, before the Trainer wraps the model
            weight_norm_init_(model, counts, model_args.weight_norm_init_sigma)

    trainer = TiedNormTrainer(
        model=model,
        args=training_args,
        train_dataset=blocks["train"] if training_args.do_train else None,
        eval_dataset=blocks.get("validation"),
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=[TiedWeightsCheck()],
    )
    results: dict = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=resume)
        save_final_model(trainer)  # model + tokenizer
        metrics = dict(train_result.metrics, train_blocks=len(blocks["train"]))
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results.update(metrics)
    if training_args.do_eval:
        for split, prefix in (("validation", "eval"), ("test", "test")):
            if split not in blocks:
                continue
            metrics = trainer.evaluate(blocks[split], metric_key_prefix=prefix)
            # The loss adds the regularizers' penalties to the mean cross-entropy; perplexity is of the latter.
            add_perplexity(metrics, prefix, trainer.model)
            trainer.log_metrics(prefix, metrics)
            trainer.save_metrics(prefix, metrics)
            results.update(metrics)
    if trainer.is_world_process_zero():
        if not trainer.is_fsdp_enabled:  # the histogram the card shows (sharded FSDP weights would need a gather)
            counts_file = output_dir / "token_counts.pt"
            counts = torch.load(counts_file) if counts_file.is_file() else None
            plot_embedding_norms(model, output_dir, counts, title=output_dir.name)
        write_model_card(
            output_dir,
            metrics=results,
            dataset=data_args.dataset_name,
            languages=None,
            training={
                **model_args.config_overrides(),
                "block_size": data_args.block_size,
                "num_train_epochs": training_args.num_train_epochs,
                "max_steps": training_args.max_steps,
                "per_device_train_batch_size": training_args.per_device_train_batch_size,
                "learning_rate": training_args.learning_rate,
                "seed": training_args.seed,
            },
        )
        logger.info("model, tokenizer, metrics and card are in %s", output_dir.resolve())


if __name__ == "__main__":
    main()
