"""What a saved folder says about how its weights were trained, whatever saved it: the record every card (the run's,
``tiednorm-card``, ``tiednorm-push``, the plain export's) turns into its "Fine-tuned from ... with ... on ..." line.

A card used to call a folder fine-tuned only when it held ``trainer_state.json``, which a Trainer writes with its
checkpoints: a model trained with TRL's ``SFTTrainer`` and saved as TRL's docs do (``save_strategy="no"``,
``trainer.save_model(out)``) has none, and its card said "Based on ..." as for a conversion; the export's card said
nothing of its training. The folder says more:

* ``training_args.bin``: every ``Trainer.save_model`` writes it (TRL's trainers too). Its pickled class names the
  trainer (``SFTConfig``: TRL's SFTTrainer); it is read from the pickle's opcodes (``pickletools``), so nothing in
  the file runs.
* ``trainer_state.json``: a Trainer checkpoint or a training script's run; its ``global_step``.
* the ``training_record`` of the folder's own card (README.md front matter), which ``tiednorm-card`` writes: what
  nothing else records, the training data named in words where it has no Hub id (``--dataset "200 support chats"``).

A conversion's source (``provenance``, source_provenance.py) says where the weights came from; this says what was
done to them since.
"""

from __future__ import annotations

import json
import pickletools
import re
import zipfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from huggingface_hub import ModelCard

# The card's front-matter key holding the record.
RECORD_KEY = "training_record"
# The trainer each arguments class belongs to; any other ``<Name>Config`` of TRL is its ``<Name>Trainer``.
_TRAINERS = {  # by the class name's ending, the longest first
    "Seq2SeqTrainingArguments": "transformers' Seq2SeqTrainer",
    "TrainingArguments": "transformers' Trainer",
}
_DATASET_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


@dataclass(frozen=True)
class TrainingRecord:
    """How a folder's weights were trained.

    Attributes:
        trainer: the trainer that saved them, in words ("TRL's SFTTrainer"), or None where only a checkpoint's state
            says they were trained.
        data: the training data: a Hub data set id (``bentrevett/multi30k``) or words; None: not recorded.
        steps: optimizer steps (a checkpoint's ``global_step``), or None.
    """

    trainer: str | None = None
    data: str | None = None
    steps: int | None = None


def is_dataset_id(data: str | None) -> bool:
    """Whether ``data`` has the form of a Hub data set id ("owner/name" or "name"), rather than words."""
    return bool(data) and _DATASET_ID.fullmatch(data) is not None


def trainer_of(path: Path) -> str | None:
    """The trainer a ``training_args.bin`` was saved by, from the class its pickle builds (the first global it
    names); None when the file is unreadable or names no class."""
    try:
        with zipfile.ZipFile(path) as archive:
            data = archive.read(next(name for name in archive.namelist() if name.endswith("data.pkl")))
    except (OSError, zipfile.BadZipFile, StopIteration):
        data = path.read_bytes() if path.is_file() else b""  # an old-style (non-zip) torch.save: a plain pickle
    try:
        found = next(arg for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL")
    except Exception:  # noqa: BLE001  (not a pickle, or one naming no class)
        return None
    module, _, name = found.partition(" ")
    package = module.split(".")[0]
    if package == "trl" and name.endswith("Config"):
        return f"TRL's {name.removesuffix('Config')}Trainer"
    trainer = next((text for suffix, text in _TRAINERS.items() if name.endswith(suffix)), None)
    if package == "hf_tiednorm" and trainer:  # the training scripts' own arguments class
        return f"hf_tiednorm's training script ({trainer})"
    return trainer if package == "transformers" and trainer else f"a Trainer with {name} ({module})"


def card_record(folder: Path) -> TrainingRecord | None:
    """The record the folder's own card states (its README.md front matter), or None."""
    try:
        stated = ModelCard.load(folder / "README.md").data.to_dict().get(RECORD_KEY)
    except (OSError, ValueError):
        return None
    if not isinstance(stated, dict):
        return None
    known = {key: stated.get(key) for key in ("trainer", "data", "steps")}
    return TrainingRecord(**known) if any(value is not None for value in known.values()) else None


def read_training_record(folder: str | Path | None, data: str | None = None) -> TrainingRecord | None:
    """What ``folder`` says about its training (module docstring), with ``data`` (a Hub id or words) over what its
    card stated; None when nothing says the weights were trained."""
    if folder is None:
        return TrainingRecord(data=data) if data else None
    folder = Path(folder)
    record = card_record(folder) or TrainingRecord()
    if (folder / "training_args.bin").is_file():
        record = replace(record, trainer=trainer_of(folder / "training_args.bin") or record.trainer)
    try:
        state = json.loads((folder / "trainer_state.json").read_text(encoding="utf-8"))
        record = replace(record, steps=int(state["global_step"]), trainer=record.trainer or "a 🤗 Trainer")
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if data:
        record = replace(record, data=data)
    return record if record.trainer or record.steps else (TrainingRecord(data=data) if data else None)


def trained(record: TrainingRecord | None) -> bool:
    """Whether ``record`` says the weights were trained (by a trainer, or for steps), not only named the data."""
    return record is not None and bool(record.trainer or record.steps)


def origin_text(record: TrainingRecord | None, source: str | None, from_base: bool = False) -> str:
    """The card's sentence on where the weights came from and what was done to them: "Fine-tuned from <source>
    with <trainer> (<steps> steps)." ("a local model" where a run started from one nobody named, ``from_base``) /
    "Trained with ..." (no source at all) / "Based on <source>. Converted to hf_tiednorm's normalized head, not
    fine-tuned since." (a conversion, untrained); "" when nothing is known."""
    if not (from_base or trained(record)):
        return f"Based on {source}. Converted to hf_tiednorm's normalized head, not fine-tuned since." if source else ""
    how = ""
    if record is not None and record.trainer:
        how = f" with {record.trainer}" + (f" ({record.steps:,} steps)" if record.steps else "")
    return f"Fine-tuned from {source or 'a local model'}{how}." if source or from_base else f"Trained{how}."


def data_text(record: TrainingRecord | None, languages: list[str] | None = None) -> str:
    """The card's sentence naming the training data: its Hub id, or the words it was named by."""
    data = record.data if record is not None else None
    langs = f" ({', '.join(languages)})" if languages else ""
    if data and is_dataset_id(data):
        return f"Trained on `{data}`{langs}."
    if data:
        return f"Trained on {data}{langs} (no Hub id)."
    return "Training data: not recorded (`tiednorm-card --dataset` names it: a Hub id, or words)."


def record_metadata(record: TrainingRecord | None) -> dict:
    """The record as the card's front matter keeps it (``{RECORD_KEY: {...}}``), so that a re-render and the export
    of the folder say the same; {} when there is none."""
    fields = {key: value for key, value in asdict(record).items() if value is not None} if record else {}
    return {RECORD_KEY: fields} if fields else {}


__all__ = [
    "RECORD_KEY", "TrainingRecord", "card_record", "data_text", "is_dataset_id", "origin_text", "read_training_record",
    "record_metadata", "trained", "trainer_of",
]  # fmt: skip
