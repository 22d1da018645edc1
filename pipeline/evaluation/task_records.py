"""The records of a downstream task's file, read with `datasets`' loaders from a local path, and the
checks every layout shares: a missing file, an empty split, a missing column, an empty field or a
value outside its set fails with the file, the line (Parquet: the row) and the field, and says what
to do.

Formats by suffix: `.tsv` (tab-separated, with a header), `.csv` (comma-separated, quoted as
spreadsheets write it), `.parquet`, and JSON Lines for anything else (`.jsonl`, `.json`).
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable, Sequence

from pipeline.errors import StageError

# Where record `i` is in its file, for people: "line 7", "row 3".
Place = Callable[[int], str]
HEADER_SUFFIXES = (".tsv", ".csv")


def task_file_error(file: Path, place: str, field: str, what: str) -> StageError:
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
    strings), read line by line, so that the checks name the line that differs; a malformed line is
    named here."""
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
                    "or remove the task from eval.tasks."
                ) from None
            if not isinstance(record, dict):
                raise StageError(
                    f"Task file {file}, line {number}: not a JSON object. Fix the line or remove "
                    "the task from eval.tasks."
                )
            records.append(record)
    return records, list(dict.fromkeys(key for record in records for key in record))


def _load(file: Path, scratch: Path, unquoted: bool):
    """The file as a `datasets` Dataset; its loader's exception when it cannot read it."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    options = {"cache_dir": str(scratch), "split": "train"}
    suffix = file.suffix.lower()
    if suffix in HEADER_SUFFIXES:
        # Every value is text as written (no "NA" read as missing); blank lines are skipped, so that
        # the line numbers below name what remains.
        return datasets.load_dataset(
            "csv",
            data_files=str(file),
            sep="\t" if suffix == ".tsv" else ",",
            keep_default_na=False,
            na_filter=False,
            # XNLI's and XStoryCloze's TSVs hold sentences that open with a quotation mark
            # unescaped: read as written, as their own loaders do.
            quoting=csv.QUOTE_NONE if unquoted and suffix == ".tsv" else csv.QUOTE_MINIMAL,
            **options,
        )
    if suffix == ".parquet":
        return datasets.load_dataset("parquet", data_files=str(file), **options)
    return datasets.load_dataset("json", data_files=str(file), **options)


def read_records(
    file: Path, scratch: Path, unquoted: bool = False
) -> tuple[list[dict], list[str], Place]:
    """A TSV, CSV, JSONL or Parquet file's records (datasets' loaders on a local path), its columns,
    and where record `i` is in it. `unquoted`: a TSV's quotation marks are text."""
    if not file.is_file():
        raise StageError(
            f"Task file {file} does not exist. Create it or fix the task's path in eval.tasks."
        )
    suffix = file.suffix.lower()
    lines: list[int] = []
    if suffix != ".parquet":
        lines = _data_lines(file, header=suffix in HEADER_SUFFIXES)
        if not lines:
            raise StageError(
                f"Task file {file} holds no record (an empty split). Fill it or remove the task "
                "from eval.tasks."
            )
    try:
        dataset = _load(file, scratch, unquoted)
    except Exception as error:  # each loader fails its own way: pandas, pyarrow, json
        if suffix == ".parquet" or suffix in HEADER_SUFFIXES:
            raise StageError(f"Task file {file} cannot be read: {error}") from None
        records, columns = _json_lines(file)
        return records, columns, lambda index: f"line {lines[index]}"
    if suffix == ".parquet":
        if len(dataset) == 0:
            raise StageError(
                f"Task file {file} holds no record (an empty split). Fill it or remove the task."
            )
        return dataset.to_list(), dataset.column_names, lambda index: f"row {index + 1}"
    if len(dataset) != len(lines):  # a quoted field over several lines: say the record's number
        return dataset.to_list(), dataset.column_names, lambda index: f"record {index + 1}"
    return dataset.to_list(), dataset.column_names, lambda index: f"line {lines[index]}"


def _missing_column(file: Path, columns: Sequence[str], required: Sequence[str]) -> StageError:
    missing = [column for column in required if column not in columns]
    return task_file_error(
        file,
        "the header" if file.suffix.lower() in HEADER_SUFFIXES else "every record",
        missing[0],
        f"the column is missing (found: {', '.join(columns) or 'none'}; needed: "
        f"{', '.join(required)})",
    )


def pick_columns(
    file: Path, columns: Sequence[str], namings: Sequence[Sequence[str]]
) -> Sequence[str]:
    """The first of `namings` (the published file's column names, then another publisher's) whose
    columns the file has all of; else the first naming's first missing column is named."""
    for naming in namings:
        if all(column in columns for column in naming):
            return naming
    raise _missing_column(file, columns, namings[0])


def require_columns(file: Path, columns: Sequence[str], required: Sequence[str]) -> None:
    pick_columns(file, columns, [required])


def field_text(file: Path, place: str, record: dict, field: str, empty_ok: bool = False) -> str:
    """The field's value as text, as written (the prompt formats decide what to strip); an empty
    one fails unless `empty_ok`."""
    value = record.get(field)
    if value is None or (not str(value).strip() and not empty_ok):
        raise task_file_error(file, place, field, "it is empty")
    return str(value)


def field_choice(file: Path, place: str, record: dict, field: str, allowed: Sequence[str]) -> int:
    """The index in `allowed` of the field's value (a number or text, compared as text without its
    surrounding spaces)."""
    value = record.get(field)
    text = str(value).strip() if value is not None else ""
    if text not in allowed:
        raise task_file_error(
            file, place, field, f"{value!r} is not {', '.join(allowed[:-1])} or {allowed[-1]}"
        )
    return list(allowed).index(text)
