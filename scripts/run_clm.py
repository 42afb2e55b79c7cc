#!/usr/bin/env python
"""Train (from scratch or from a saved checkpoint) a TiedNorm causal LM on text files; report perplexity.

    python scripts/run_clm.py --output_dir runs/clm                      # English side of Multi30k
    python scripts/run_clm.py config.yaml --max_steps 20                 # a .json/.yaml config file, then overrides
    ACCELERATE_USE_CPU=true accelerate launch --config_file scripts/accelerate/ddp.yaml scripts/run_clm.py ...

The last line trains on 2 CPU processes (DDP over gloo; on GPUs drop ACCELERATE_USE_CPU and set --num_processes).
Without ACCELERATE_USE_CPU=true (or --use_cpu true) on a machine without GPUs, the processes would not form one
group and each would train alone as rank 0; the script refuses to start then. `accelerate launch --cpu
--num_processes 2` starts only one process (accelerate 1.15). Every rank logs "rank N: trained S steps".

Lines are tokenized, each ended with the tokenizer's EOS token (appended when the tokenizer adds none, as SmolLM2's
and Llama's do not), concatenated and cut into --block_size blocks, as in HF's run_clm.
One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
--overwrite_output_dir (which deletes them first) or --resume_from_checkpoint (which continues that run: "last" is
its newest complete checkpoint, and the checkpoint's architecture must match the flags). The final model is saved
through a staging folder, so a kill never leaves a new config.json over old weights
(hf_tiednorm/training/run_directory.py).

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
Under bf16 on CPU the attention is eager with an fp32 softmax (hf_tiednorm.training.precision.choose_attention).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from transformers import AutoModelForCausalLM, default_data_collator

from hf_tiednorm.modeling.families.table import FAMILIES, families, family_named
from hf_tiednorm.publishing.card_metrics import subset_metrics
from hf_tiednorm.training import steps  # the main() steps both training scripts share
from hf_tiednorm.training.arguments import (
    DataArgumentsBase,
    OutputDirArguments,
    RunArguments,
    TiedNormModelArguments,
)
from hf_tiednorm.training.callbacks import run_callbacks
from hf_tiednorm.training.data import group_texts, load_monolingual, token_counts, training_texts
from hf_tiednorm.training.precision import TiedNormTrainingArguments
from hf_tiednorm.training.trainers import TiedNormTrainer, add_perplexity

logger = logging.getLogger(__name__)
# The causal family a new model is built from by default (hf_tiednorm/modeling/families/table.py); --model_family
# picks another.
CAUSAL = FAMILIES[families(encoder_decoder=False)[0]]
# The Multi30k files read by default: the shared data folder beside this checkout (a script default, not the
# library's: hf_tiednorm assumes no checkout).
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


@dataclass
class ModelArguments(TiedNormModelArguments):
    """The shared model flags (checkpoint, tokenizer, output layer, technique flags:
    hf_tiednorm/training/arguments.py) and the causal LM's architecture."""

    # Architecture flags that map one-to-one onto TiedNormCausalConfig fields (none may change a saved model).
    config_fields = TiedNormModelArguments.config_fields + (
        "tie_word_embeddings", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    )

    tie_word_embeddings: bool | None = field(default=None, metadata={"help": "False trains the untied control"})
    hidden_size: int | None = field(default=None, metadata={"help": "model dimension d"})
    intermediate_size: int | None = field(default=None, metadata={"help": "feed-forward dimension"})
    num_hidden_layers: int | None = field(default=None, metadata={"help": "decoder layers"})
    num_attention_heads: int | None = field(default=None, metadata={"help": "attention heads per layer"})
    model_family: str = field(
        default=CAUSAL.name,
        metadata={"help": "the causal family of a new model: one registered with hf_tiednorm.register_family (read "
                          f"when the flags are parsed; {', '.join(families(encoder_decoder=False))} built in)"},
    )

    def __post_init__(self):
        super().__post_init__()
        if family_named(self.model_family, encoder_decoder=False) is None:
            raise ValueError(f"--model_family must be one of {families(encoder_decoder=False)} (the registered causal "
                             f"families), got {self.model_family!r}")


@dataclass
class DataArguments(DataArgumentsBase):
    default_data_dir = MULTI30K  # names the data set bentrevett/multi30k in the model card

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

    def __post_init__(self):
        super().__post_init__()  # the model card's dataset_name
        if self.block_size < 2:
            raise ValueError(f"--block_size must be >= 2, got {self.block_size}")


def main(argv: list[str] | None = None) -> None:
    """The run; ``argv``: its flags (default: the command line), so that a caller in this process, with the head
    modes, head terms and families it registered, can run it."""
    model_args, data_args, run_args, output_args, training_args, resume = steps.start_run(
        (ModelArguments, DataArguments, RunArguments, OutputDirArguments, TiedNormTrainingArguments),
        description=__doc__.split("\n\n")[0],  # the script's first line, for --help
        argv=argv,
        eval_splits=("validation", "test"),  # --do_eval scores both
    )

    # Bad flags fail before any work: the config, blocks the positions cannot hold, a resumed architecture.
    family = family_named(model_args.model_family, encoder_decoder=False)
    run_config = model_args.run_config(family.config_class)
    # A new model gets max(--block_size, 512) positions (below); a saved one has its own.
    # A converted model reads its architecture's limit (GPT-2's n_positions); None: it has no position table.
    positions = getattr(run_config, "max_position_embeddings", None)
    if model_args.model_name_or_path is not None and positions is not None and data_args.block_size > positions:
        raise ValueError(
            f"--block_size {data_args.block_size} exceeds the saved model's max_position_embeddings={positions}; "
            "lower --block_size to at most that"
        )
    files = steps.prepare_run(model_args, data_args, output_args, training_args, resume, run_config, run_args)

    # Data: one ``text`` column a split.
    raw = load_monolingual(files, data_args.text_column)
    subsets = steps.select_first(raw, {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                                       "test": data_args.max_eval_samples})

    # Tokenizer: the checkpoint's, a given one, the one a previous run saved in output_dir, or a new one.
    tokenizer = steps.load_or_train_tokenizer(
        model_args, training_args, resume,
        texts=lambda: training_texts(raw["train"], ["text"]),
        model_max_length=data_args.block_size,
        count_tokens=lambda tok: token_counts(
            group_texts(raw["train"], tok, data_args.block_size), len(tok), ("input_ids",)
        ),
    )

    # Model: a saved (or converted) one, or a new model of --model_family (TiedNormForCausalLM) sized to the tokenizer.
    if model_args.model_name_or_path is not None:
        model = AutoModelForCausalLM.from_pretrained(
            model_args.model_name_or_path, config=run_config, **model_args.load_kwargs()
        )
    else:
        config = family.config_class(
            vocab_size=len(tokenizer),
            max_position_embeddings=max(data_args.block_size, 512),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            **model_args.config_overrides(),
        )
        model = family.lm_class(config)
    steps.check_model(model, tokenizer, training_args)

    # Blocks of --block_size tokens; a new model's token counts and weight-norm initialization.
    with training_args.main_process_first(desc="grouping texts"):
        blocks = group_texts(raw, tokenizer, data_args.block_size, data_args.preprocessing_num_workers)
    for split in blocks:
        if len(blocks[split]) == 0:
            raise ValueError(f"the {split} text is shorter than one block of {data_args.block_size} tokens")
    steps.save_token_counts_and_init(model, blocks["train"], ("input_ids",), model_args, training_args)

    trainer = TiedNormTrainer(
        model=model,
        args=training_args,
        train_dataset=blocks["train"] if training_args.do_train else None,
        eval_dataset=blocks.get("validation"),
        processing_class=tokenizer,
        data_collator=default_data_collator,
        callbacks=run_callbacks(run_args),
    )

    # Training, then perplexity on the validation and test blocks.
    results: dict = {}
    if training_args.do_train:
        results.update(steps.train_and_save(trainer, resume, {"train_blocks": len(blocks["train"])}))
    if training_args.do_eval:
        for split, prefix in (("validation", "eval"), ("test", "test")):
            if split not in blocks:
                continue
            metrics = trainer.evaluate(blocks[split], metric_key_prefix=prefix)
            # The loss adds the regularizers' penalties to the mean cross-entropy; perplexity is of the latter.
            add_perplexity(metrics, prefix, trainer.model)
            metrics.update(subset_metrics(split, subsets.get(split)))  # a later card names the subset too
            trainer.log_metrics(prefix, metrics)
            trainer.save_metrics(prefix, metrics)
            results.update(metrics)

    # Embedding-norm plots and the model card.
    card = {"metrics": results, "dataset": data_args.dataset_name, "languages": None,
            "base_model": model_args.model_name_or_path,
            "eval_subsets": {split: subsets[split] for split in ("validation", "test") if split in subsets},
            "training": steps.card_training(model_args, training_args,
                                            trainer.state if training_args.do_train else None,
                                            block_size=data_args.block_size)}
    steps.write_plots_and_card(trainer, model, card)

if __name__ == "__main__":
    main()
