"""The ``main()`` steps that scripts/run_translation.py and scripts/run_clm.py share, so that each script keeps only
its own task and reads top to bottom: launch set-up (``setup_run``: every process joined the group, CPU threads,
freed CPU memory kept for reuse), the data files, the tokenizer, the model checks, token counts and weight-norm init,
training with the final save, and the plots and model card.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedTokenizerBase,
    Trainer,
    TrainingArguments,
    set_seed,
)
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import CONFIG_NAME

from ..conversion.path_identity import file_id
from ..conversion.saved_code import foreign_auto_map
from ..modeling.families.table import family_of_config
from ..publishing.model_card import write_model_card
from .arguments import (
    DataArgumentsBase,
    ModelSourceArguments,
    OutputDirArguments,
    RunArguments,
    TiedNormModelArguments,
    parse_arguments,
)
from .checkpoint_reading import read_trainer_state
from .cpu_memory import keep_freed_memory
from .data import token_counts
from .liger import check_liger_installed, check_use_liger_kernel
from .plots import plot_embedding_norms
from .precision import choose_attention
from .run_directory import (
    check_resume_config,
    lock_output_dir,
    prepare_output_dir,
    resolve_resume_checkpoint,
    save_final_model,
    scored_run_folder,
)
from .run_outputs import run_inputs
from .run_record import check_resume_record, precision_name, run_record, write_run_record
from .tokenization import train_joint_tokenizer
from .vocab_order import frequency_ordered
from .weight_norm_init import weight_norm_init_

logger = logging.getLogger(__name__)


def start_run(dataclass_types: tuple[type, ...], description: str | None = None,
              eval_splits: tuple[str, ...] = ("validation",), argv: list[str] | None = None) -> tuple:  # fmt: skip
    """A training script's first step: its flags (``parse_arguments``: a config file, then flags; ``argv``, else the
    command line), the run's lock on --output_dir (``lock_output_dir``, before anything else), logging at INFO
    (transformers' at the process's level), the precision chosen and why, the launch checks and settings
    (``setup_run``), the flags used only after training (``check_late_flags``; ``eval_splits``: the splits --do_eval
    scores), scoring a finished run without training (``score_finished_run``) and the checkpoint to resume
    (``resolve_resume_checkpoint``), before any work. ``dataclass_types`` hold the model arguments, a
    ``DataArgumentsBase``, a ``RunArguments`` and HF's ``TrainingArguments`` (with ``Bf16DefaultMixin``). Returns the
    parsed dataclasses in that order, then the checkpoint folder to resume (or None)."""
    parsed = parse_arguments(dataclass_types, description, argv)
    model_args = next(args for args in parsed if isinstance(args, ModelSourceArguments))
    data_args = next(args for args in parsed if isinstance(args, DataArgumentsBase))
    run_args = next(args for args in parsed if isinstance(args, RunArguments))
    training_args = next(args for args in parsed if isinstance(args, TrainingArguments))
    lock_output_dir(training_args.output_dir)  # one run at a time per folder, until this process exits
    strip_hub_token(training_args)
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
    transformers.utils.logging.set_verbosity(training_args.get_process_log_level())
    logger.info("precision: %s", training_args.precision_note)
    setup_run(run_args, training_args)
    check_late_flags(training_args, data_args, eval_splits)
    check_some_work(training_args)
    check_liger_installed(training_args)  # --use_liger_kernel without liger-kernel: now, not at train()
    score_finished_run(model_args, training_args)  # --do_eval/--do_predict alone: the run's trained weights
    return (*parsed, resolve_resume_checkpoint(training_args))


def prepare_run(
    model_args: TiedNormModelArguments,
    data_args,
    output_args: OutputDirArguments,
    training_args: TrainingArguments,
    resume: str | None,
    run_config: PretrainedConfig,
    run_args: RunArguments | None = None,
) -> dict[str, str]:
    """The last checks before any work, once the script has built ``run_config``: a resumed checkpoint must hold the
    same architecture (``check_resume_config``) and continue the same run (``check_resume_record``: data, languages,
    objective, regularizers, precision, seed, every training argument that can change the result, ``run_args``'
    --early_stopping_patience; a schedule left to train), --output_dir takes this run (``prepare_output_dir``) and
    records what defines it (``run_record.json``), then the seed.
    ``data_args`` has ``train_file``, ``validation_file`` and ``test_file``. Returns the data files by split."""
    check_resume_config(resume, run_config, model_args.architecture_fields())
    record = run_record(model_args, data_args, training_args, run_args)
    changes = check_resume_record(resume, training_args.output_dir, record, output_args.allow_run_change)
    files = split_files(data_args.train_file, data_args.validation_file, data_args.test_file)
    languages = [lang for lang in (getattr(data_args, "source_lang", None), getattr(data_args, "target_lang", None))
                 if lang]
    prepare_output_dir(training_args, output_args.overwrite_output_dir, resume,
                       run_inputs(model_args, files, languages, resume))
    if training_args.do_train and training_args.process_index == 0:
        write_run_record(training_args.output_dir, record, changes)
    set_seed(training_args.seed)
    return files


def strip_hub_token(training_args: TrainingArguments) -> None:
    """Move --hub_token out of the arguments into ``HF_TOKEN`` (where huggingface_hub finds it, as the Trainer's
    push does when ``hub_token`` is None): the Trainer pickles its arguments into training_args.bin of every
    checkpoint and the final folder, which kept the token in clear."""
    if training_args.hub_token:
        os.environ.setdefault("HF_TOKEN", training_args.hub_token)
        training_args.hub_token = None


def check_world_size(training_args: TrainingArguments) -> None:
    """Fail when the launcher started more processes than joined the Trainer's process group. Under torchrun on a
    machine without GPUs (scripts/accelerate/ddp.yaml), accelerate forms a gloo group only when told to use the CPU;
    otherwise every process trains the whole run alone as rank 0, all writing the same output folder."""
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched != training_args.world_size:
        raise RuntimeError(
            f"the launcher started {launched} processes (WORLD_SIZE) but the Trainer's process group has "
            f"{training_args.world_size}, so each process would train alone as rank 0. On CPUs, set "
            "ACCELERATE_USE_CPU=true (or pass --use_cpu true) to make the processes one gloo group: "
            "ACCELERATE_USE_CPU=true accelerate launch --config_file scripts/accelerate/ddp.yaml <script> ..."
        )


def configure_threads(num_threads: int | None) -> None:
    """torch CPU threads of this process: ``num_threads``, or the machine's cores shared among the launch's processes
    (each process defaulting to all cores would oversubscribe them)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    torch.set_num_threads(num_threads or max(1, (os.cpu_count() or 1) // world_size))


def setup_run(run_args: RunArguments, training_args: TrainingArguments) -> None:
    """The checks and settings a training script makes before any work: every launched process joined the group,
    torch's CPU threads, freed CPU memory kept for reuse, and the flags that cannot serve (the Trainer's label
    smoothing, early stopping without a best model to return to)."""
    check_world_size(training_args)
    configure_threads(run_args.num_threads)
    if run_args.keep_freed_cpu_memory and training_args.device.type == "cpu":
        logger.info(keep_freed_memory())
    if training_args.label_smoothing_factor:
        raise ValueError("use --label_smoothing (the model's loss) instead of --label_smoothing_factor")
    if run_args.early_stopping_patience is not None and not training_args.load_best_model_at_end:
        raise ValueError("--early_stopping_patience needs --load_best_model_at_end true and an eval/save strategy")


def check_late_flags(
    training_args: TrainingArguments, data_args, eval_splits: tuple[str, ...] = ("validation",)
) -> None:
    """Flags that are used only after training, checked before any work (they failed after training and saving,
    or were ignored): sample limits below 1, ``--generation_num_beams`` (also during training) /
    ``--generation_max_length`` below 1, and
    evaluation or prediction without the file it reads (``eval_splits``: the splits --do_eval scores)."""
    for name in ("max_train_samples", "max_eval_samples", "max_predict_samples"):
        value = getattr(data_args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value} selects no rows; give at least 1, or leave it out to use them all")
    for name in ("generation_num_beams", "generation_max_length", "generation_num_beams_during_training"):
        value = getattr(training_args, name, None)
        if value is not None and value < 1:
            raise ValueError(f"--{name} {value} must be at least 1 (checked before training: it is used only when "
                             "evaluating)")
    files = {split: getattr(data_args, f"{split}_file", None) for split in ("validation", "test")}
    if str(training_args.eval_strategy).lower().split(".")[-1] != "no" and not files["validation"]:
        raise ValueError(f"--eval_strategy {training_args.eval_strategy} evaluates during training on the validation "
                         "split, but --validation_file is none")
    if training_args.do_eval and not any(files[split] for split in eval_splits):
        raise ValueError(f"--do_eval scores the {' / '.join(eval_splits)} split, but no such file is given "
                         f"(--{'_file / --'.join(eval_splits)}_file)")
    if training_args.do_predict and "test" not in eval_splits and not files["test"]:
        raise ValueError("--do_predict scores the test split, but --test_file is none")


def check_some_work(training_args: TrainingArguments) -> None:
    """Fail a run that would do nothing: without --do_train, --do_eval and --do_predict a script trained nothing,
    scored nothing, left an empty --output_dir and exited 0 (HF's example scripts behave so; a copied command missing
    --do_train then looks like a finished run)."""
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError(
            "none of --do_train, --do_eval, --do_predict is given, so this run would do nothing: add --do_train to "
            "train (and --do_eval / --do_predict to score)"
        )


def score_finished_run(model_args: TiedNormModelArguments, training_args: TrainingArguments) -> None:
    """Evaluating / predicting without --do_train and without --model_name_or_path scores the model that the run in
    --output_dir trained (it scored a freshly initialized model and overwrote the run's results): the folder becomes
    --model_name_or_path, and this scoring writes into a new sub-folder ``scored-<UTC time>`` of it, so the run's
    results, card and plots stay as they are. The training run's architecture flags may be repeated; a flag that
    differs from the trained model is refused."""
    scores = training_args.do_eval or training_args.do_predict
    if training_args.do_train or not scores or model_args.model_name_or_path is not None:
        return
    if training_args.resume_from_checkpoint is not None:
        raise ValueError(
            f"--resume_from_checkpoint continues training, but --do_train is not given; to score a checkpoint pass "
            f"--model_name_or_path <checkpoint folder> (without it, the trained model in {training_args.output_dir} "
            "is scored)"
        )
    model_folder, results_folder = scored_run_folder(training_args.output_dir)
    saved = AutoConfig.from_pretrained(model_folder)
    for name in model_args.architecture_fields():  # the training run's flags may be repeated, not changed
        value = getattr(model_args, name)
        if value is not None and value != getattr(saved, name, None):
            raise ValueError(f"--{name} {value} differs from the trained model in {model_folder} "
                             f"({name}={getattr(saved, name, None)!r}); drop it to score that model")
        setattr(model_args, name, None)
    model_args.model_name_or_path = str(model_folder)
    model_args.__post_init__()  # the checks of a saved model
    training_args.output_dir = str(results_folder)
    logger.warning("scoring the trained model in %s; the results go to %s", model_folder, results_folder)


def split_files(train_file: str, validation_file: str | None, test_file: str | None) -> dict[str, str]:
    """The data files by split name; a split without a file (None or empty) is left out."""
    files = {"train": train_file}
    if validation_file:
        files["validation"] = validation_file
    if test_file:
        files["test"] = test_file
    return files


def select_first(raw: dict, limits: dict[str, int | None]) -> dict[str, tuple[int, int]]:
    """Keep only the first ``limits[split]`` rows of each split of ``raw`` (in place; None: all); returns ``{split:
    (rows kept, rows in the file)}`` of the splits cut, for the model card (which says a score is a subset's)."""
    cut = {s: (n, len(raw[s])) for s, n in limits.items() if s in raw and n is not None and n < len(raw[s])}
    for split, (limit, _) in cut.items():
        raw[split] = raw[split].select(range(limit))
    return cut


def load_or_train_tokenizer(
    model_args: TiedNormModelArguments,
    training_args: TrainingArguments,
    resume: str | None,
    texts: Callable[[], Iterable[list[str]]],
    model_max_length: int,
    count_tokens: Callable[[PreTrainedTokenizerBase], torch.Tensor],
) -> PreTrainedTokenizerBase:
    """The run's tokenizer: the checkpoint's, a given one, the one a previous run saved in --output_dir, or a new
    one trained on ``texts()`` (batches of training text). With --adaptive_cutoffs a new model's tokenizer is renumbered
    by decreasing ``count_tokens(tokenizer)`` (training-data frequencies), special tokens first; a resumed or saved
    model's keeps its order (that of its weights). A trained or renumbered
    tokenizer is saved in --output_dir by the main process, which goes first so that the others load nothing
    half-written."""
    output_dir = Path(training_args.output_dir)
    with training_args.main_process_first(desc="tokenizer"):
        source = model_args.tokenizer_source(resume, output_dir)
        own = source is not None and file_id(source) in {file_id(resume or output_dir), file_id(output_dir)} - {None}
        if resume is not None and not own and (source is None or model_args.adaptive_cutoffs is not None):
            # A new or unsorted tokenizer would not match the checkpoint's embedding rows.
            raise FileNotFoundError(
                f"--resume_from_checkpoint {resume}: neither it nor {output_dir} holds the run's tokenizer "
                "(tokenizer.json), whose ids its weights use; copy it there from the run's output folder"
            )
        if source is not None:
            try:
                tokenizer = AutoTokenizer.from_pretrained(source)
            except Exception as error:  # tokenizers' JSON errors name no file
                raise ValueError(f"cannot load the tokenizer in {source}: {type(error).__name__}: {error}") from error
        else:
            tokenizer = train_joint_tokenizer(
                texts(), vocab_size=model_args.vocab_size, model=model_args.tokenizer_model,
                model_max_length=model_max_length,
            )
        # Only a new model's tokenizer is renumbered: a resumed checkpoint's (or a saved model's) ids are those of its
        # weights, whatever the counts of this run's data, so re-sorting them would detach the tokenizer from them.
        renumber = model_args.adaptive_cutoffs is not None and resume is None and model_args.model_name_or_path is None
        if renumber:
            tokenizer = frequency_ordered(tokenizer, count_tokens(tokenizer), model_args.tokenizer_name, output_dir)
        if (source is None or renumber) and training_args.process_index == 0:
            tokenizer.save_pretrained(output_dir)
    logger.info("tokenizer from %s: %d tokens", source or "training data", len(tokenizer))
    return tokenizer


def check_model(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, training_args: TrainingArguments) -> None:
    """Choose the model's attention for the run's precision (logged), fail when the tokenizer has more tokens
    than the model has embedding rows, and drop a loaded config's ``auto_map``: save_pretrained writes our own
    entries afresh, while a base model's foreign ones (``foreign_auto_map``, named in a warning) would survive into
    every checkpoint and the published model."""
    foreign = foreign_auto_map(getattr(model.config, "auto_map", None))
    if foreign:
        logger.warning("dropping the base model's foreign auto_map entries (remote code that is not ours): %s", foreign)
    # Deleted, not set to None (a null auto_map in config.json breaks AutoConfig); ours, if any, is written anew.
    vars(model.config).pop("auto_map", None)
    logger.info(choose_attention(model, training_args))
    check_use_liger_kernel(model, training_args)  # served by the fused loss or refused, before tokenizing
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model only {model.config.vocab_size}")


def save_token_counts_and_init(
    model: PreTrainedModel,
    train_dataset,
    columns: tuple[str, ...],
    model_args: TiedNormModelArguments,
    training_args: TrainingArguments,
) -> None:
    """For a new model: the token frequencies of the tokenized training data (``columns``) saved as
    token_counts.pt in --output_dir (for the embedding-norm plots and analyses), and Herold et al.'s weight-norm
    initialization from them with --weight_norm_init_sigma, on every process, before the Trainer wraps the model."""
    if model_args.model_name_or_path is not None:
        return
    counts = token_counts(train_dataset, model.config.vocab_size, columns)
    if training_args.process_index == 0:
        output_dir = Path(training_args.output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        torch.save(counts, output_dir / "token_counts.pt")
    if model_args.weight_norm_init_sigma is not None:
        weight_norm_init_(model, counts, model_args.weight_norm_init_sigma)


def train_and_save(trainer: Trainer, resume: str | None, num_examples: dict[str, int]) -> dict:
    """Train (continuing ``resume``), save the final model and tokenizer (``save_final_model``), and log and save the
    training metrics with ``num_examples`` (e.g. ``{"train_samples": n}``), the minutes spent and the steps that
    ``train_loss`` averages (``train_loss_first_step``/``train_loss_last_step``; after a resume also
    ``train_resumed_from_step``) and the ``precision`` trained in; returns them."""
    start = time.monotonic()
    first_step = 1 + (read_trainer_state(resume)["global_step"] if resume else 0)
    train_result = trainer.train(resume_from_checkpoint=resume)
    save_final_model(trainer)  # model + tokenizer
    minutes = (time.monotonic() - start) / 60
    metrics = dict(train_result.metrics, **num_examples, train_minutes=minutes, precision=precision_name(trainer.args))
    # The Trainer's train_loss (and train_runtime, ...) average this process's steps only: after a resume, not the
    # whole run. Say which steps, so that a resumed and an uninterrupted run compare.
    metrics.update(train_loss_first_step=first_step, train_loss_last_step=trainer.state.global_step)
    if resume:
        metrics["train_resumed_from_step"] = first_step - 1  # numbers only: the model card lists every metric
        logger.warning("train_loss covers steps %d-%d only (resumed from %s)", first_step, trainer.state.global_step,
                       resume)
    trainer.log_metrics("train", metrics)
    trainer.save_metrics("train", metrics)
    trainer.save_state()
    return metrics


def card_training(
    model_args: TiedNormModelArguments, training_args: TrainingArguments, state=None, **extra: Any
) -> dict:
    """The training settings a model card lists: the model flags, the schedule that bounded the run (``max_steps``
    when set, since it overrides the epochs; else ``num_train_epochs``), what the run did (``state``: the Trainer's
    ``TrainerState`` after training: steps and epochs trained), and ``extra``."""
    schedule = (
        {"max_steps": training_args.max_steps}
        if training_args.max_steps > 0
        else {"num_train_epochs": training_args.num_train_epochs}
    )
    done = {}
    if state is not None and state.global_step > 0:
        done = {"steps trained": state.global_step, "epochs trained": round(state.epoch or 0.0, 4)}
    return {
        **model_args.card_settings(),
        **schedule,
        **done,
        "per_device_train_batch_size": training_args.per_device_train_batch_size,
        "learning_rate": training_args.learning_rate,
        **extra,
        "seed": training_args.seed,
        "precision": precision_name(training_args),
    }


def load_token_counts(path: Path) -> torch.Tensor | None:
    """The run's token counts for the plots (``weights_only``: a planted pickle runs no code), or None with a
    warning naming the file when it is missing or unreadable: the plots then go without frequencies, and the
    trained model, card and results are kept."""
    if not path.is_file():
        return None
    try:
        counts = torch.load(path, weights_only=True)
        if not (isinstance(counts, torch.Tensor) and counts.dim() == 1):
            raise TypeError(f"it holds {type(counts).__name__}, not a 1-d tensor of counts")
    except Exception as error:  # noqa: BLE001  (any unreadable file: the plots lose frequencies, nothing else)
        logger.warning("cannot read %s (%s: %s): the plots are drawn without token frequencies", path,
                       type(error).__name__, str(error)[:200])
        return None
    return counts


def write_plots_and_card(trainer: Trainer, model: PreTrainedModel, card: dict[str, Any] | None) -> None:
    """On the main process: the embedding-norm plots (with token_counts.pt when the run saved it; not under FSDP,
    whose sharded weights would need a gather) and, unless ``card`` is None or the model is a stock one (a plain
    baseline), the model card rendered from ``write_model_card(output_dir, **card)``."""
    if not trainer.is_world_process_zero():
        return
    output_dir = Path(trainer.args.output_dir)
    if not trainer.args.do_train:  # they describe trained weights, which a scoring run leaves as they are
        logger.info("scored without training: metrics (no card or plots) are in %s", output_dir.resolve())
        return
    if not trainer.is_fsdp_enabled:
        plot_embedding_norms(model, output_dir, load_token_counts(output_dir / "token_counts.pt"),
                             title=output_dir.name)
    if card is not None and (not (output_dir / CONFIG_NAME).is_file() or family_of_config(model.config) is None):
        # An evaluation-only run (--do_eval without --do_train) saves no model in output_dir, and a stock model (a
        # plain baseline, tiednorm-convert --plain) has no normalized head: an hf_tiednorm card would describe neither.
        logger.info("no hf_tiednorm model saved in %s (evaluation only, or a stock model): no card written", output_dir)
    elif card is not None:
        write_model_card(output_dir, **card)
    logger.info("model, tokenizer, metrics and card are in %s", output_dir.resolve())
