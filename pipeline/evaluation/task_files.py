"""Downstream tasks from local files, read with `datasets` and checked before any model loads.

Layouts (`eval.tasks[].layout`):
- `sib200`: topic classification as SIB-200 ships it: a folder with `train.tsv`, `dev.tsv` and
  `test.tsv`, tab-separated with the header `index_id`, `category`, `text` (or `train.parquet` ...
  with those columns). Every category of dev and test occurs in train.
- `belebele`, `xnli`, `xstorycloze`, `global_mmlu` and `continuation`: multiple choice, one file of
  one language, each item put in lm-evaluation-harness' prompt format (standard_tasks.py).

A missing file, a missing column, an empty text, an empty split, a category outside train's or an
answer outside its set fails with the file, the line (or Parquet row) and the field
(task_records.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Union

from pipeline.errors import StageError
from pipeline.evaluation.eval_config import TEXT_SET_LAYOUTS, TaskConfig, task_name
from pipeline.evaluation.standard_tasks import MultipleChoice, read_multiple_choice
from pipeline.evaluation.task_records import (
    field_text,
    read_records,
    require_columns,
    task_file_error,
)

SIB_SPLITS = ("train", "dev", "test")
SIB_COLUMNS = ("index_id", "category", "text")
TABLE_SUFFIXES = (".tsv", ".parquet")


@dataclass(frozen=True)
class Example:
    text: str
    label: str


@dataclass(frozen=True)
class Classification:
    """sib200: texts and their categories."""

    name: str
    language: str
    path: str
    labels: tuple[str, ...]  # train's categories, sorted
    train: tuple[Example, ...]
    dev: tuple[Example, ...]
    test: tuple[Example, ...]
    k: int  # examples shown before each test text when prompting
    layout: str = "sib200"


Task = Union[Classification, MultipleChoice]


def _split_file(folder: Path, split: str) -> Path:
    for suffix in TABLE_SUFFIXES:
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    raise StageError(
        f"The sib200 task folder {folder} has no {split}.tsv (nor {split}.parquet). SIB-200's "
        "folders hold train.tsv, dev.tsv and test.tsv; point the task's path at one of them."
    )


def read_classification(task: TaskConfig, scratch: Path) -> Classification:
    folder = Path(task.path)
    if not folder.is_dir():
        raise StageError(
            f"The sib200 task path {folder} is not a folder: give the folder holding train.tsv, "
            f"dev.tsv and test.tsv."
        )
    splits, places = {}, {}
    for split in SIB_SPLITS:
        file = _split_file(folder, split)
        records, columns, place = read_records(file, scratch)
        require_columns(file, columns, SIB_COLUMNS)
        splits[split] = [
            Example(
                field_text(file, place(i), record, "text").strip(),
                field_text(file, place(i), record, "category").strip(),
            )
            for i, record in enumerate(records)
        ]
        places[split] = (file, place)
    labels = tuple(sorted({example.label for example in splits["train"]}))
    for split in ("dev", "test"):
        file, place = places[split]
        for index, example in enumerate(splits[split]):
            if example.label not in labels:
                raise task_file_error(
                    file,
                    place(index),
                    "category",
                    f"{example.label!r} is not a category of "
                    f"{places['train'][0].name} ({', '.join(labels)})",
                )
    return Classification(
        task_name(task),
        task.language,
        str(folder),
        labels,
        *(tuple(splits[s]) for s in SIB_SPLITS),
        task.k,
    )


def read_task(task: TaskConfig, scratch: Path) -> Task:
    """The task's items, checked; a StageError names the file, line and field of the first problem."""
    if task.layout in TEXT_SET_LAYOUTS:
        raise StageError(
            f"eval.tasks: {task.path} ({task.layout}) is a held-out set scored in bits per byte "
            "(texts.py), not a task: leave it out of the tasks read (eval_config.downstream_tasks)."
        )
    if task.layout == "sib200":
        return read_classification(task, scratch)
    return read_multiple_choice(task, scratch)
