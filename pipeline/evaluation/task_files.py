"""Downstream tasks from local files, read with `datasets` and checked before any model loads.

Layouts (`eval.tasks[].layout`):
- `sib200`: topic classification as SIB-200 ships it: a folder with `train.tsv`, `dev.tsv` and
  `test.tsv`, tab-separated with the header `index_id`, `category`, `text` (or `train.parquet` ...
  with those columns). Every category of dev and test occurs in train.
- `belebele`: multiple choice as Belebele ships it: JSON Lines (or Parquet) records with
  `flores_passage`, `question`, `mc_answer1` .. `mc_answer4` and `correct_answer_num` (1-4). The
  question may be empty (the answers then continue the passage).

A missing file, a missing column, an empty text, an empty split, a category outside train's or an
answer number outside 1-4 fails with the file, the line (or Parquet row) and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Union

from pipeline.errors import StageError
from pipeline.evaluation.eval_config import TaskConfig, task_name

SIB_SPLITS = ("train", "dev", "test")
SIB_COLUMNS = ("index_id", "category", "text")
ANSWER_COLUMNS = ("mc_answer1", "mc_answer2", "mc_answer3", "mc_answer4")
BELEBELE_COLUMNS = ("flores_passage", "question", *ANSWER_COLUMNS, "correct_answer_num")
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


@dataclass(frozen=True)
class Question:
    passage: str
    question: str  # may be empty
    answers: tuple[str, ...]
    correct: int  # index into answers


@dataclass(frozen=True)
class MultipleChoice:
    """belebele: passages, questions and four answers, one of them right."""

    name: str
    language: str
    path: str
    questions: tuple[Question, ...]
    layout: str = "belebele"


Task = Union[Classification, MultipleChoice]


def _problem(file: Path, place: str, field: str, what: str) -> StageError:
    return StageError(
        f"Task file {file}, {place}, field `{field}`: {what}. Fix the file or remove the task from "
        f"eval.tasks."
    )


def _data_lines(file: Path, header: bool) -> list[int]:
    """The line numbers (from 1) of the file's records: its non-blank lines, after the header if
    any."""
    with open(file, encoding="utf-8", errors="replace") as handle:
        numbers = [number for number, line in enumerate(handle, 1) if line.strip()]
    return numbers[1:] if header else numbers


def _json_lines(file: Path) -> tuple[list[dict], list[str]]:
    """The records of a JSON Lines file that datasets' loader cannot type (a column of numbers and
    strings), read line by line, so that the checks below name the line that differs; a malformed
    line is named here."""
    records = []
    with open(file, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise StageError(
                    f"Task file {file}, line {number}: not a JSON object ({error}). Fix the line "
                    "or "
                    f"remove the task from eval.tasks."
                ) from None
            if not isinstance(record, dict):
                raise StageError(
                    f"Task file {file}, line {number}: not a JSON object. Fix the line or remove "
                    "the "
                    f"task from eval.tasks."
                )
            records.append(record)
    return records, list(dict.fromkeys(key for record in records for key in record))


def read_records(file: Path, scratch: Path) -> tuple[list[dict], list[str], Callable[[int], str]]:
    """A TSV, JSONL or Parquet file's records (datasets' loaders on a local path), its columns, and
    where record `i` is in it ("line 7", "row 3")."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    if not file.is_file():
        raise StageError(
            f"Task file {file} does not exist. Create it or fix the task's path in eval.tasks."
        )
    suffix = file.suffix.lower()
    lines: list[int] = []
    if suffix != ".parquet":
        lines = _data_lines(file, header=suffix == ".tsv")
        if not lines:
            raise StageError(
                f"Task file {file} holds no record (an empty split). Fill it or remove the task "
                "from "
                f"eval.tasks."
            )
    options = {"cache_dir": str(scratch), "split": "train"}
    try:
        if suffix == ".tsv":
            # Blank lines are skipped, not read as empty records: `lines` numbers what remains.
            dataset = datasets.load_dataset(
                "csv",
                data_files=str(file),
                sep="\t",
                keep_default_na=False,
                na_filter=False,
                **options,
            )
        elif suffix == ".parquet":
            dataset = datasets.load_dataset("parquet", data_files=str(file), **options)
        else:
            dataset = datasets.load_dataset("json", data_files=str(file), **options)
    except Exception as error:  # each loader fails its own way: pandas, pyarrow, json
        if suffix == ".parquet" or suffix == ".tsv":
            raise StageError(f"Task file {file} cannot be read: {error}") from None
        records, columns = _json_lines(file)
        return records, columns, lambda index: f"line {lines[index]}"
    if suffix == ".parquet":
        if len(dataset) == 0:
            raise StageError(
                f"Task file {file} holds no record (an empty split). Fill it or remove the task."
            )

        def place(index: int) -> str:
            return f"row {index + 1}"
    else:
        if len(dataset) != len(
            lines
        ):  # a quoted field over several lines: say the record's number instead
            lines = []

        def place(index: int) -> str:
            return f"line {lines[index]}" if lines else f"record {index + 1}"

    return dataset.to_list(), dataset.column_names, place


def _require_columns(file: Path, columns: list[str], required: tuple[str, ...]) -> None:
    missing = [column for column in required if column not in columns]
    if missing:
        raise _problem(
            file,
            "the header" if file.suffix.lower() == ".tsv" else "every record",
            missing[0],
            f"the column is missing (found: {', '.join(columns) or 'none'}; needed: "
            f"{', '.join(required)})",
        )


def _text(file: Path, place: str, record: dict, field: str, empty_ok: bool = False) -> str:
    value = record.get(field)
    if value is None or (isinstance(value, str) and not value.strip() and not empty_ok):
        raise _problem(file, place, field, "it is empty")
    return str(value).strip()


def _split_file(folder: Path, split: str) -> Path:
    for suffix in TABLE_SUFFIXES:
        if (folder / f"{split}{suffix}").is_file():
            return folder / f"{split}{suffix}"
    raise StageError(
        f"The sib200 task folder {folder} has no {split}.tsv (nor {split}.parquet). SIB-200's "
        "folders "
        f"hold train.tsv, dev.tsv and test.tsv; point the task's path at one of them."
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
        _require_columns(file, columns, SIB_COLUMNS)
        splits[split] = [
            Example(
                _text(file, place(i), record, "text"), _text(file, place(i), record, "category")
            )
            for i, record in enumerate(records)
        ]
        places[split] = (file, place)
    labels = tuple(sorted({example.label for example in splits["train"]}))
    for split in ("dev", "test"):
        file, place = places[split]
        for index, example in enumerate(splits[split]):
            if example.label not in labels:
                raise _problem(
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


def _answer_number(file: Path, place: str, record: dict) -> int:
    value = record.get("correct_answer_num")
    try:
        number = int(str(value).strip())
    except ValueError:
        number = None
    if number not in (1, 2, 3, 4):
        raise _problem(file, place, "correct_answer_num", f"{value!r} is not 1, 2, 3 or 4")
    return number


def read_multiple_choice(task: TaskConfig, scratch: Path) -> MultipleChoice:
    file = Path(task.path)
    if file.is_dir():
        raise StageError(
            f"The belebele task path {file} is a folder: give the JSONL (or Parquet) file of one "
            f"language, e.g. .../nob_Latn.jsonl."
        )
    records, columns, place = read_records(file, scratch)
    _require_columns(file, columns, BELEBELE_COLUMNS)
    questions = []
    for index, record in enumerate(records):
        where = place(index)
        answers = tuple(_text(file, where, record, column) for column in ANSWER_COLUMNS)
        questions.append(
            Question(
                _text(file, where, record, "flores_passage"),
                _text(file, where, record, "question", empty_ok=True),
                answers,
                _answer_number(file, where, record) - 1,
            )
        )
    return MultipleChoice(task_name(task), task.language, str(file), tuple(questions))


def read_task(task: TaskConfig, scratch: Path) -> Task:
    """The task's items, checked; a StageError names the file, line and field of the first problem."""
    if task.layout == "sib200":
        return read_classification(task, scratch)
    return read_multiple_choice(task, scratch)
