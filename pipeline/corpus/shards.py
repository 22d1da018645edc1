"""The clean stage's output shards, the same bytes whatever the task layout (task_layout.py) and the
workers.

Each task writes the documents of each output folder (`train`, `heldout`, `heldout_source`,
`rejected/<filter>`) to a staged file of its own, `staged/<folder>/<rank>.jsonl`, uncompressed; the
merge phase reads a folder's staged files in task order, which is input order, as one text, and
shard k of the folder holds the documents that start in its bytes [k * shard_bytes, (k + 1) *
shard_bytes) (all of them for `clean.shard_bytes=-1`). Its tasks write the shards side by side,
each a gzip file without a time stamp (`write_lines`), so that the same documents give the same
bytes.
"""

from __future__ import annotations

import gzip
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterable, Iterator, Optional

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

STAGED = "staged"
SHARD_NAME = "{index:05d}.jsonl.gz"
# zlib's default level: gzip's 9 takes half as long again for files barely smaller.
_LEVEL = 6


def staged_writer(work: Path, folder: str):
    """The datatrove writer of a task's documents for `work/<folder>/`."""
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(work / STAGED / folder), compression=None)


def write_lines(path: Path, lines: Iterable[bytes]) -> int:
    """Write `lines` to the gzip file `path` (through a temporary file: never half a shard under
    its name), with no time stamp or name in its header; returns the number of lines."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    written = 0
    with (
        open(tmp, "wb") as raw,
        gzip.GzipFile(filename="", mode="wb", compresslevel=_LEVEL, fileobj=raw, mtime=0) as out,
    ):
        for line in lines:
            out.write(line)
            written += 1
    os.replace(tmp, path)
    return written


@dataclass(frozen=True)
class Shard:
    """Shard `index` of the output folder `folder`: the documents that start in bytes [start, end)
    (end None: to the end) of its staged files, each given with the offset where it begins."""

    folder: str
    index: int
    start: int
    end: Optional[int]
    staged: tuple[tuple[Path, int], ...]


def planned_shards(work: Path, shard_bytes: int) -> list[Shard]:
    """Every shard of every output folder staged in `work`, folder by folder."""
    shards = []
    folders = sorted({path.parent for path in (work / STAGED).rglob("*.jsonl")})
    for folder in folders:
        staged, offset = [], 0
        for path in sorted(folder.glob("*.jsonl")):
            staged.append((path, offset))
            offset += path.stat().st_size
        count = 1 if shard_bytes <= 0 else max(1, math.ceil(offset / shard_bytes))
        name = folder.relative_to(work / STAGED).as_posix()
        for index in range(count):
            start = index * shard_bytes if shard_bytes > 0 else 0
            end = start + shard_bytes if shard_bytes > 0 else None
            shards.append(Shard(name, index, start, end, tuple(staged)))
    return shards


def _lines_from(handle: BinaryIO, start: int, end: Optional[int]) -> Iterator[bytes]:
    """The lines of `handle` that start in [start, end)."""
    if start > 0:
        handle.seek(start - 1)
        handle.readline()  # the rest of the line that holds byte start - 1, which starts before
    while end is None or handle.tell() < end:
        line = handle.readline()
        if not line:
            return
        yield line


def shard_lines(shard: Shard) -> Iterator[bytes]:
    """The documents of `shard`, as JSON lines, in order."""
    for path, offset in shard.staged:
        size = path.stat().st_size
        if offset + size <= shard.start or (shard.end is not None and offset >= shard.end):
            continue
        with open(path, "rb") as handle:
            end = None if shard.end is None else shard.end - offset
            yield from _lines_from(handle, max(0, shard.start - offset), end)


class MergeShards(PipelineStep):
    """The merge phase: task `rank` of `world_size` writes shards rank, rank + world_size, ... of
    the list of `planned_shards` (an empty one is not written)."""

    type = "💽 - WRITER"
    name = "🧩 Output shards"

    def __init__(self, work: Path, shard_bytes: int):
        super().__init__()
        self.work = Path(work)
        self.shard_bytes = shard_bytes

    def run(
        self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1
    ) -> DocumentsPipeline:
        for shard in planned_shards(self.work, self.shard_bytes)[rank::world_size]:
            lines = shard_lines(shard)
            first = next(lines, None)
            if first is None:
                continue
            folder = self.work / shard.folder
            folder.mkdir(parents=True, exist_ok=True)
            written = write_lines(
                folder / SHARD_NAME.format(index=shard.index), itertools.chain([first], lines)
            )
            self.stat_update("documents", value=written)
            self.stat_update("shards")
        return data
