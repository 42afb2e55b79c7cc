#!/usr/bin/env python
"""Train (from scratch or from a saved checkpoint) and evaluate a TiedNorm encoder-decoder on translation.

    python scripts/run_translation.py scripts/configs/multi30k_de_en.yaml            # one YAML/JSON config file
    python scripts/run_translation.py scripts/configs/multi30k_de_en.yaml --max_steps 20 --output_dir runs/x
    python scripts/run_translation.py --output_dir runs/x --head_mode distance --source_lang en --target_lang de
    ACCELERATE_USE_CPU=true accelerate launch --config_file scripts/accelerate/ddp.yaml scripts/run_translation.py ...

The last line trains on 2 CPU processes (DDP over gloo; on GPUs drop ACCELERATE_USE_CPU and set --num_processes).
Without ACCELERATE_USE_CPU=true (or --use_cpu true) on a machine without GPUs, the processes would not form one
group and each would train alone as rank 0; the script refuses to start then. `accelerate launch --cpu
--num_processes 2` starts only one process (accelerate 1.15). Every rank logs "rank N: trained S steps".

One run per --output_dir, as in HF's example scripts: a folder holding another run's outputs is refused unless
--overwrite_output_dir (which deletes them first) or --resume_from_checkpoint (which continues that run: "last" is
its newest complete checkpoint, and the checkpoint's architecture must match the flags). The final model is saved
through a staging folder, so a kill never leaves a new config.json over old weights
(hf_tiednorm/training/run_directory.py).
--max_source_length, --max_target_length and --generation_max_length may not exceed the model's positions.

Without --model_name_or_path a joint BPE tokenizer is trained on both sides of the training data and saved in
--output_dir (a resumed run loads its checkpoint's, so it keeps its vocabulary). Validation and test
are scored with sacreBLEU (detokenized, via the offline metric module in hf_tiednorm/metrics) on generated
translations; --generation_num_beams and --length_penalty control the beam search.

--model_family marian trains transformers' own ``MarianMTModel`` instead (three-way tied, every Marian config field
taken from the same flags, label smoothing through the Trainer's ``label_smoothing_factor``, --embedding_init_std
applied to its shared matrix as to ours): the HF contender of the paper grid, run through the same tokenizer, data,
Trainer recipe and scoring.

Precision: bf16 autocast is the default where training runs on a CPU with native bf16 matmuls (avx512_bf16 /
amx_bf16; with a GPU HF's default stands); the log says which precision was chosen and why; --bf16 false opts out.
Under bf16 on CPU the attention is eager with an fp32 softmax (hf_tiednorm.training.precision.choose_attention).

Technique flags of a new model (Press & Wolf's projection regularization, Herold et al.'s weight-norm
regularization and initialization, Baevski & Auli's adaptive input/softmax, the chunked loss) are config fields;
each training log carries ``cross_entropy`` and every enabled penalty next to ``loss``. With --adaptive_cutoffs
the tokenizer (trained, given or reused) is renumbered by decreasing frequency on both sides of the training data,
special tokens first, before the data is tokenized, and that renumbered tokenizer is the one saved with the model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import evaluate
import numpy as np
import torch
from transformers import (
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    MarianConfig,
    MarianMTModel,
    PretrainedConfig,
)

import hf_tiednorm
from hf_tiednorm.metrics import SACREBLEU_LOCAL
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
from hf_tiednorm.training.data import load_parallel, token_counts, tokenize_parallel, training_texts
from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments, padding_multiple
from hf_tiednorm.training.trainers import TiedNormSeq2SeqTrainer, add_perplexity

logger = logging.getLogger(__name__)
# --model_family: every encoder-decoder family of hf_tiednorm under the name the recipes use
# (hf_tiednorm/modeling/families/table.py:
# its first alias, else its name; the table resolves either), and transformers' MarianMTModel as the HF contender.
OWN_FAMILIES = {(FAMILIES[name].aliases or (name,))[0]: FAMILIES[name] for name in families(encoder_decoder=True)}
DEFAULT_FAMILY = next(iter(OWN_FAMILIES))
MARIAN = "marian"
MODEL_FAMILIES = (*OWN_FAMILIES, MARIAN)
# The Multi30k files read by default: the shared data folder beside this checkout (a script default, not the
# library's: hf_tiednorm assumes no checkout).
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"
# The config-field flags that the HF contender (transformers' MarianMTModel, --model_family marian) takes as well;
# the others (the normalized head and its techniques) it does not have.
MARIAN_FLAGS = ("label_smoothing", "embedding_init_std")
TIEDNORM_ONLY_FLAGS = tuple(
    name for name in (*TiedNormModelArguments.config_fields, *TiedNormModelArguments.new_model_fields)
    if name not in MARIAN_FLAGS
)


@dataclass
class ModelArguments(TiedNormModelArguments):
    """The shared model flags (checkpoint, tokenizer, output layer, technique flags:
    hf_tiednorm/training/arguments.py), the encoder-decoder's architecture and the beam search's length penalty."""

    # Architecture flags that map one-to-one onto TiedNormSeq2SeqConfig fields; dropout changes no parameter, so
    # a fine-tuning run may change it.
    config_fields = TiedNormModelArguments.config_fields + (
        "tie_topology", "d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "decoder_ffn_dim",
        "encoder_attention_heads", "decoder_attention_heads", "max_position_embeddings", "dropout", "attention_dropout",
    )
    finetune_fields = TiedNormModelArguments.finetune_fields + ("dropout", "attention_dropout")

    tie_topology: str | None = field(default=None, metadata={"help": f"one of {hf_tiednorm.TIE_TOPOLOGIES}"})
    d_model: int | None = field(default=None, metadata={"help": "model dimension d"})
    encoder_layers: int | None = field(default=None, metadata={"help": "encoder layers"})
    decoder_layers: int | None = field(default=None, metadata={"help": "decoder layers"})
    encoder_ffn_dim: int | None = field(default=None, metadata={"help": "encoder feed-forward dimension"})
    decoder_ffn_dim: int | None = field(default=None, metadata={"help": "decoder feed-forward dimension"})
    encoder_attention_heads: int | None = field(default=None, metadata={"help": "attention heads per encoder layer"})
    decoder_attention_heads: int | None = field(default=None, metadata={"help": "attention heads per decoder layer"})
    max_position_embeddings: int | None = field(default=None, metadata={"help": "longest sequence in positions"})
    dropout: float | None = field(default=None, metadata={"help": "dropout probability (fine-tuning may change it)"})
    attention_dropout: float | None = field(
        default=None, metadata={"help": "dropout on the attention weights (fine-tuning may change it)"}
    )
    length_penalty: float = field(
        default=1.0,
        metadata={"help": "beam-search length penalty (exponent on length); the beam size is --generation_num_beams"},
    )
    model_family: str = field(
        default=DEFAULT_FAMILY,
        metadata={
            "help": f"one of {MODEL_FAMILIES}: a new model of an hf_tiednorm encoder-decoder family ("
            + ", ".join(f"{name}: {family.lm_class.__name__}" for name, family in OWN_FAMILIES.items())
            + "), or transformers' MarianMTModel (plain three-way tying, the same dims; --label_smoothing becomes "
            "the Trainer's label_smoothing_factor)",
        },
    )

    def __post_init__(self):
        super().__post_init__()
        if self.model_family != MARIAN and family_named(self.model_family, encoder_decoder=True) is None:
            raise ValueError(f"--model_family must be one of {MODEL_FAMILIES}, got {self.model_family!r}")
        if self.model_family == MARIAN:
            given = [name for name in TIEDNORM_ONLY_FLAGS if getattr(self, name) is not None]
            if self.model_name_or_path is not None:
                given.append("model_name_or_path")  # a saved model's config.json names its own family
            if self.tie_topology not in (None, "three_way"):
                given.append("tie_topology")
            if given:
                raise ValueError(f"--model_family marian (plain three-way tying) takes no --{' --'.join(given)}")


@dataclass
class DataArguments(DataArgumentsBase):
    default_data_dir = MULTI30K  # names the data set bentrevett/multi30k in the model card

    source_lang: str = field(
        default="de",
        metadata={"help": "source language code: a column of json/jsonl/csv files, or {lang} in text-file patterns"},
    )
    target_lang: str = field(default="en", metadata={"help": "target language code (as --source_lang)"})
    train_file: str = field(
        default=str(MULTI30K / "train.{lang}.gz"),
        metadata={"help": "training pairs: a .json/.jsonl/.csv file, or a text-file pattern holding {lang}"},
    )
    validation_file: str | None = field(
        default=str(MULTI30K / "val.{lang}.gz"), metadata={"help": "validation pairs (same forms); None: none"}
    )
    test_file: str | None = field(
        default=str(MULTI30K / "test_2016_flickr.{lang}.gz"), metadata={"help": "test pairs (same forms); None: none"}
    )
    max_source_length: int = field(default=128, metadata={"help": "source truncation length in subwords (with </s>)"})
    max_target_length: int = field(default=128, metadata={"help": "target truncation length in subwords (with </s>)"})
    max_train_samples: int | None = field(
        default=None, metadata={"help": "use only the first N training pairs (quick runs, tests)"}
    )
    max_eval_samples: int | None = field(default=None, metadata={"help": "use only the first N validation pairs"})
    max_predict_samples: int | None = field(default=None, metadata={"help": "use only the first N test pairs"})
    keep_empty_lines: bool = field(
        default=False,
        metadata={
            "help": "keep the training pairs with an empty or whitespace-only side (by default they are dropped, "
            "with a warning naming how many and the first line; the validation and test splits keep every pair)"
        },
    )
    keep_copied_pairs: bool = field(
        default=False,
        metadata={
            "help": "keep the training pairs whose target equals the source up to whitespace (names, numbers; by "
            "default they are dropped, with a warning naming how many and the first line; the validation and test "
            "splits keep every pair; a split of copies only is refused)"
        },
    )

    def __post_init__(self):
        super().__post_init__()  # the model card's dataset_name
        if self.source_lang == self.target_lang:
            raise ValueError(f"--source_lang and --target_lang are both {self.source_lang!r}; they must differ")


def marian_config(config: PretrainedConfig) -> MarianConfig:
    """The ``MarianConfig`` with every Marian field of ``config`` (dims, dropouts, init_std, scale_embedding, special
    token ids, decoder_start_token_id), three-way tied as transformers spells it."""
    shared = set(MarianConfig().to_dict()) - {"model_type", "transformers_version", "architectures", "_name_or_path"}
    fields = {name: value for name, value in config.to_dict().items() if name in shared}
    return MarianConfig(**{**fields, "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True})


@torch.no_grad()
def init_shared_embedding(model: MarianMTModel, std: float) -> None:
    """Our embedding_init_std on a MarianMTModel (hf_tiednorm/modeling/families/common.py): N(0, std), padding row
    zero."""
    weight = model.get_input_embeddings().weight
    weight.normal_(0.0, std)
    weight[model.config.pad_token_id].zero_()


def bleu_metrics(eval_prediction, *, tokenizer, bleu, references: list[str], split: str) -> dict:
    """sacreBLEU of the generated ids against ``references``, the untouched reference text of ``split`` (not decoded
    labels, which lose <unk> characters). The script binds all but ``eval_prediction`` with ``functools.partial``,
    once per split it scores."""
    predictions = eval_prediction.predictions
    predictions = np.where(predictions < 0, tokenizer.pad_token_id, predictions)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
    if len(references) != len(hypotheses):
        raise RuntimeError(f"{len(hypotheses)} predictions for {len(references)} {split} references")
    result = bleu.compute(predictions=hypotheses, references=[[text] for text in references])
    # Generated tokens without the special ones: beam search fills finished hypotheses with </s>, not <pad>, so
    # counting non-pad ids measured the batch's longest hypothesis.
    lengths = np.isin(predictions, tokenizer.all_special_ids, invert=True).sum(axis=-1)
    return {"bleu": result["score"], "gen_len": float(np.mean(lengths)), "bleu_signature": result["signature"]}


def main(argv: list[str] | None = None) -> None:
    """The run; ``argv``: its flags (default: the command line), so that a caller in this process, with the head
    modes, head terms and families it registered, can run it."""
    model_args, data_args, run_args, output_args, training_args, resume = steps.start_run(
        (ModelArguments, DataArguments, RunArguments, OutputDirArguments, TiedNormSeq2SeqTrainingArguments),
        description=__doc__.split("\n\n")[0],  # the script's first line, for --help
        argv=argv,
    )
    marian = model_args.model_family == MARIAN
    output_dir = Path(training_args.output_dir)

    # Bad flags fail before any work: the config, sequence lengths the positions cannot hold, a resumed architecture.
    # marian: built from its config
    family = family_named(model_args.model_family, encoder_decoder=True) or OWN_FAMILIES[DEFAULT_FAMILY]
    run_config: PretrainedConfig = model_args.run_config(family.config_class)
    if marian:
        run_config = marian_config(run_config)
    # None: no position table to index past (a converted T5's relative positions), so nothing to check.
    positions = getattr(run_config, "max_position_embeddings", None)
    for flag, length in (("--max_source_length", data_args.max_source_length),
                         ("--max_target_length", data_args.max_target_length),
                         ("--generation_max_length", training_args.generation_max_length)):
        if length is not None and positions is not None and length > positions:
            remedy = "" if model_args.model_name_or_path else " or raise --max_position_embeddings"
            raise ValueError(
                f"{flag} {length} exceeds the model's max_position_embeddings={positions}: a longer sequence would "
                f"index past its position table mid-training; lower {flag} to at most {positions}{remedy}"
            )
    files = steps.prepare_run(model_args, data_args, output_args, training_args, resume, run_config, run_args)

    # Data: one column a language.
    raw = load_parallel(files, data_args.source_lang, data_args.target_lang, keep_empty=data_args.keep_empty_lines,
                        keep_copies=data_args.keep_copied_pairs)
    subsets = steps.select_first(raw, {"train": data_args.max_train_samples, "validation": data_args.max_eval_samples,
                                       "test": data_args.max_predict_samples})

    # Tokenizer: the checkpoint's, a given one, the one a previous run saved in output_dir, or a new joint one.
    # --adaptive_cutoffs counts on both sides of the training data: the adaptive embedding is shared three-way.
    tokenizer = steps.load_or_train_tokenizer(
        model_args, training_args, resume,
        texts=lambda: training_texts(raw["train"], [data_args.source_lang, data_args.target_lang]),
        model_max_length=max(data_args.max_source_length, data_args.max_target_length),
        count_tokens=lambda tok: token_counts(
            tokenize_parallel(
                raw["train"], tok, data_args.source_lang, data_args.target_lang, data_args.max_source_length,
                data_args.max_target_length, data_args.preprocessing_num_workers,
            ),
            len(tok),
        ),
    )

    # Model: a saved (or converted) one, a new TiedNormForConditionalGeneration, or the HF Marian contender.
    if model_args.model_name_or_path is not None:
        model = AutoModelForSeq2SeqLM.from_pretrained(
            model_args.model_name_or_path, config=run_config, **model_args.load_kwargs()
        )
    else:
        config = family.config_class(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            decoder_start_token_id=tokenizer.bos_token_id,
            **model_args.config_overrides(),
        )
        if marian:
            model = MarianMTModel(marian_config(config))
            if config.embedding_init_std is not None:  # a recipe choice applies to every contender alike
                init_shared_embedding(model, config.embedding_init_std)
            # HF's path for label smoothing: the Trainer's LabelSmoother on the model's logits.
            training_args.label_smoothing_factor = config.label_smoothing
        else:
            model = family.lm_class(config)
    steps.check_model(model, tokenizer, training_args)
    model.generation_config.length_penalty = model_args.length_penalty
    model.generation_config.max_length = training_args.generation_max_length or data_args.max_target_length
    if training_args.generation_num_beams is not None:
        model.generation_config.num_beams = training_args.generation_num_beams
    described = type(model).__name__ if marian else f"{type(model).__name__}, head_mode={model.config.head_mode}"
    logger.info("model: %s, %.1fM parameters", described, model.num_parameters() / 1e6)

    # Tokenized pairs; a new model's token counts (both sides: three-way tying shares one matrix) and weight-norm
    # initialization.
    with training_args.main_process_first(desc="tokenizing"):
        tokenized = tokenize_parallel(
            raw, tokenizer, data_args.source_lang, data_args.target_lang,
            data_args.max_source_length, data_args.max_target_length, data_args.preprocessing_num_workers,
        )
    steps.save_token_counts_and_init(model, tokenized["train"], ("input_ids", "labels"), model_args, training_args)

    # sacreBLEU on generated translations.
    bleu = evaluate.load(SACREBLEU_LOCAL)
    # One scorer per split, each bound to that split's reference text; evaluation (during training too) scores the
    # validation split, prediction the test split.
    scorers = {
        split: partial(bleu_metrics, tokenizer=tokenizer, bleu=bleu, references=list(raw[split][data_args.target_lang]),
                       split=split)
        for split in ("validation", "test") if split in raw and training_args.predict_with_generate
    }
    trainer = TiedNormSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized["train"] if training_args.do_train else None,
        eval_dataset=tokenized.get("validation"),
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(
            tokenizer, model=model, label_pad_token_id=-100, pad_to_multiple_of=padding_multiple(training_args)
        ),
        compute_metrics=scorers.get("validation"),
        callbacks=run_callbacks(run_args),
    )

    # Training, then perplexity on the validation pairs and BLEU on the test pairs.
    results: dict = {}
    if training_args.do_train:
        results.update(steps.train_and_save(trainer, resume, {"train_samples": len(tokenized["train"])}))
    if training_args.do_eval and "validation" in tokenized:
        metrics = trainer.evaluate(metric_key_prefix="eval")
        # The loss adds the regularizers' penalties to the mean cross-entropy; perplexity is of the latter.
        add_perplexity(metrics, "eval", trainer.model)
        metrics.update(subset_metrics("validation", subsets.get("validation")))  # a later card names the subset too
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)
        results.update(metrics)
    if training_args.do_predict and "test" in tokenized:
        trainer.compute_metrics = scorers.get("test")
        prediction = trainer.predict(tokenized["test"], metric_key_prefix="test")
        prediction.metrics.update(subset_metrics("test", subsets.get("test")))
        trainer.log_metrics("test", prediction.metrics)
        trainer.save_metrics("test", prediction.metrics)
        results.update(prediction.metrics)
        if trainer.is_world_process_zero() and training_args.predict_with_generate:
            ids = np.where(prediction.predictions < 0, tokenizer.pad_token_id, prediction.predictions)
            lines = [text.strip() for text in tokenizer.batch_decode(ids, skip_special_tokens=True)]
            (output_dir / "test_predictions.txt").write_text("\n".join(lines) + "\n")

    # Embedding-norm plots and the model card (which describes hf_tiednorm models only).
    card = None if marian else {
        "metrics": results,
        "dataset": data_args.dataset_name,
        "languages": [data_args.source_lang, data_args.target_lang],
        "base_model": model_args.model_name_or_path,
        "eval_subsets": {split: subsets[split] for split in ("validation", "test") if split in subsets},
        "training": steps.card_training(
            model_args, training_args, trainer.state if training_args.do_train else None,
            lr_scheduler_type=str(training_args.lr_scheduler_type),
            warmup_steps=training_args.warmup_steps,
            generation_num_beams=training_args.generation_num_beams,
            length_penalty=model_args.length_penalty,
        ),
    }
    steps.write_plots_and_card(trainer, model, card)

if __name__ == "__main__":
    main()
