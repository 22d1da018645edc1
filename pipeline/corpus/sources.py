"""A corpus on disk and its documents: a clean stage output (its `train/`, `heldout/` or
`heldout_source/` shards, whose documents carry the duplicate-cluster sizes) or any folder of raw
files that the clean stage's reader understands.

Read in one process (`read_documents`) or file by file on several (`over_files`, with a progress bar
over the compressed bytes). The mix, tokenizer, pack, warmup, pretrain and evaluate stages read
their text this way.
"""

from __future__ import annotations

import logging
import multiprocessing
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar


from pipeline.corpus.reader import RawCorpusReader, find_raw_files, fingerprint_files
from pipeline.corpus.report import REPORT_TEXT_FILE
from pipeline.progress import Progress
from pipeline.work_folder import read_marker

log = logging.getLogger(__name__)

CLEAN_OUTPUT, RAW_FOLDER = "clean output", "raw folder"
CLEAN_SPLITS = (TRAIN_SPLIT, HELDOUT_SPLIT, HELDOUT_SOURCE_SPLIT) = (
    "train",
    "heldout",
    "heldout_source",
)
T = TypeVar("T")


@dataclass(frozen=True)
class SourceInput:
    name: str
    path: Path
    kind: str  # CLEAN_OUTPUT or RAW_FOLDER
    # The folder the files are read from (`<path>/train` for a clean output) and the files in it.
    folder: Path
    files: tuple[str, ...]
    # Hashed into the mix stage's config hash, so that a changed source reruns the plan; by content,
    # not path.
    fingerprint: dict


def clean_output(name: str, path: Path, split: str = TRAIN_SPLIT) -> SourceInput:
    """A finished clean stage output (its marker exists); the shards of one of its splits are the
    source: `train/`, `heldout/` (by document id) or `heldout_source/` (whole raw files held out,
    `clean.heldout_sources`). An empty split, or one that an older clean did not write, is a source
    without files."""
    if split not in CLEAN_SPLITS:
        raise ValueError(f"clean_output: split {split!r} is not one of {', '.join(CLEAN_SPLITS)}")
    marker = read_marker(path)
    files = tuple(find_raw_files(path / split))
    return SourceInput(
        name,
        path,
        CLEAN_OUTPUT,
        path / split,
        files,
        {"kind": CLEAN_OUTPUT, "config_hash": marker["config_hash"]},
    )


def what_clean_kept(path: Path) -> str:
    """What the finished clean output `path` kept, rejected and could not read, for messages about
    its text."""
    kept = read_marker(path)["metrics"]
    rejected = (
        ", ".join(f"{name} {count:,}" for name, count in kept["rejected"].items() if count)
        or "none"
    )
    return (
        f"{kept['docs_out']:,} of {kept['docs_in']:,} documents kept, rejected by {rejected}, "
        f"{kept['bad_records']:,} bad records ({path / REPORT_TEXT_FILE})"
    )


def raw_folder(name: str, path: Path) -> SourceInput:
    files = tuple(find_raw_files(path))
    fingerprint = {"kind": RAW_FOLDER, **fingerprint_files(path, list(files))}
    return SourceInput(name, path, RAW_FOLDER, path, files, fingerprint)


def source_reader(source: SourceInput, paths_file: Path, bad_records_dir: Path):
    """The datatrove reader of the source's files (listed in `paths_file`); shard `i` of
    `len(files)` is file `i`.

    The clean stage's own readers: datatrove's JSONL reader for its output (which keeps the
    metadata), the robust raw reader for anything else.
    """
    if source.kind == CLEAN_OUTPUT:
        from datatrove.pipeline.readers import JsonlReader

        return JsonlReader(str(source.folder), paths_file=str(paths_file), file_progress=False)
    return RawCorpusReader(
        str(source.folder), str(paths_file), str(bad_records_dir), file_progress=False
    )


FileTask = tuple[SourceInput, Path, Path, int]  # source, paths file, bad-records folder, file index


def paths_file(source: SourceInput, scratch: Path) -> Path:
    """The list of the source's files that datatrove's readers take."""
    scratch.mkdir(parents=True, exist_ok=True)
    paths_file = scratch / "files.txt"
    paths_file.write_text("".join(f"{name}\n" for name in source.files), encoding="utf-8")
    return paths_file


def read_documents(source: SourceInput, scratch: Path) -> Iterator:
    """The source's documents, file after file, in one process (bad records are logged in
    `scratch`); none from a source without files (an empty split)."""
    if not source.files:
        return
    yield from source_reader(source, paths_file(source, scratch), scratch / "bad_records").run()


def over_files(
    source: SourceInput,
    scratch: Path,
    workers: int,
    per_file: Callable[[FileTask], T],
    description: str,
) -> Iterator[T]:
    """`per_file(task)` for each file of the source, in file order, on `workers` processes, with a
    progress's log lines (a bar too on a terminal) over the compressed bytes. Bad records are logged
    in `scratch/bad_records`."""
    files = paths_file(source, scratch)
    tasks = [(source, files, scratch / "bad_records", index) for index in range(len(source.files))]
    sizes = [(source.folder / name).stat().st_size for name in source.files]
    with Progress(description, sum(sizes), "B", log) as progress:
        if workers > 1 and len(tasks) > 1:
            with multiprocessing.Pool(min(workers, len(tasks))) as pool:
                # imap keeps the order, so each result is matched with its file's size.
                for result, size in zip(pool.imap(per_file, tasks), sizes):
                    progress.update(size)
                    yield result
        else:
            for task, size in zip(tasks, sizes):
                result = per_file(task)
                progress.update(size)
                yield result
