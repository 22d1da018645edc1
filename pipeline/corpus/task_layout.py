"""How the clean stage's filter phase shares the raw files among its tasks, so that its wall time
falls with the workers whatever the files' sizes (HPLT's large languages come as a few very large
files).

Each task gets an equal share of the input's bytes on disk: a file larger than one share is read in
parts, by several tasks, each part at least `clean.min_part_bytes`. A part of a JSONL file (plain,
`.gz` or `.zst`) is the lines that start in its share of the file's decompressed bytes (reader.py); a
part of a Parquet file, a run of its row groups. The tasks take the parts and the small files in
input order, each a run of them, so that every document of task r comes before every document of
task r+1: whatever the layout, the documents pass in the order that one task reading every file
would see, which keeps MinHash's choice of the duplicate to keep and the output shards (shards.py)
the same.

The layout is recorded in `task_layout.json` in the work folder, which the tasks read (`LayoutReader`)
and a resumed run compares with its own.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

from datatrove.data import DocumentsPipeline

from pipeline.corpus.progress_files import TaskProgressFile
from pipeline.corpus.reader import RawCorpusReader

LAYOUT_FILE = "task_layout.json"
# A part of a raw file: [index in the run's file list, part, parts].
Piece = list[int]


def plan_layout(folder: Path, files: list[str], tasks: int, min_part_bytes: int) -> dict:
    """The task layout of `files` (below `folder`) for about `tasks` tasks, as `task_layout.json`
    holds it: the files, each task's pieces, and each task's share of the bytes on disk (what the
    filter phase's progress counts)."""
    sizes = [(folder / name).stat().st_size for name in files]
    share = max(sum(sizes) / tasks, 1.0)
    pieces = []
    for index, (name, size) in enumerate(zip(files, sizes)):
        parts = _part_count(folder / name, size, share, min_part_bytes)
        pieces += [([index, part, parts], size / parts) for part in range(parts)]
    runs: list[list[Piece]] = [[]]
    held = [0.0]
    for piece, size in pieces:
        if runs[-1] and held[-1] + size > share:
            runs.append([])
            held.append(0.0)
        runs[-1].append(piece)
        held[-1] += size
    return {"files": files, "tasks": runs, "task_bytes": [round(size) for size in held]}


def _part_count(path: Path, size: int, share: float, min_part_bytes: int) -> int:
    wanted = min(math.ceil(size / share), size // min_part_bytes)
    if wanted <= 1:
        return 1
    if path.name.endswith(".parquet"):
        return min(wanted, _row_groups(path))
    return wanted


def _row_groups(path: Path) -> int:
    """The Parquet file's row groups, its smallest parts; 1 for a file without rows or whose footer
    cannot be read (one task reads it and counts what is wrong)."""
    import pyarrow.parquet as pq

    try:
        metadata = pq.ParquetFile(path).metadata
    except (OSError, ValueError):
        return 1
    return metadata.num_row_groups if metadata.num_rows else 1


class LayoutReader(RawCorpusReader):
    """The raw reader of the clean stage's filter phase: task `rank` reads the pieces that the task
    layout gives it, and reports the bytes it has read to `progress_folder/<rank>.json`."""

    def __init__(
        self,
        data_folder: str,
        layout_file: str,
        bad_records_folder: str,
        progress_folder: str,
        max_record_bytes: Optional[int],
    ):
        super().__init__(
            data_folder,
            None,
            bad_records_folder,
            file_progress=False,
            max_record_bytes=max_record_bytes,
        )
        self.layout_file = Path(layout_file)
        self.progress_folder = Path(progress_folder)

    def documents(self, rank: int, world_size: int) -> DocumentsPipeline:
        record = json.loads(self.layout_file.read_text(encoding="utf-8"))
        if len(record["tasks"]) != world_size:
            raise RuntimeError(
                f"{self.layout_file} lays out {len(record['tasks'])} tasks, but this phase runs "
                f"{world_size}: the work folder was changed under a running clean. Run it again."
            )
        progress = TaskProgressFile(self.progress_folder / f"{rank:05d}.json")
        done = 0.0
        for index, part, parts in record["tasks"][rank]:
            path = record["files"][index]
            piece = self.data_folder.size(path) / parts
            for document in self.read_part(path, part, parts):
                self.update_doc_stats(document)
                progress.report(done + piece * min(1.0, self.part_done()))
                yield document
            done += piece
            progress.report(done, now=True)
