"""A datatrove reader for raw web-corpus files that never crashes on bad input and never loses good
data.

Reads `*.jsonl`, `*.jsonl.gz`, `*.jsonl.zst` and `*.parquet` with HPLT's fields (`text`, `id`, `url`
or `u`, `lang`/`document_lang`, `collection`). Unlike datatrove's stock JsonlReader, which drops the
rest of a file after one invalid UTF-8 byte and stops the task on a truncated `.gz`, it reads line
by line in binary, keeps every valid record, and counts each bad one (stat `bad_records`, one stat
per reason) with its file and line in `bad_records/<rank>.jsonl`.

A file can be read in parts (`read_part`), each by a task of its own (task_layout.py): part i of n of
a JSONL file is the lines that start in bytes [i*U/n, (i+1)*U/n) of its decompressed text (U bytes,
read through once to measure, which costs a few seconds per GB next to the filters' hours); the part
reads the file from its start up to there, counting lines, so that line numbers (of bad records, and
of the ids of records without one) are the file's. Part i of n of a Parquet file is its share of the
row groups.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from pathlib import Path
from typing import Callable, Iterator, Optional

import orjson
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.readers.base import BaseDiskReader
from datatrove.pipeline.readers.jsonl import JsonlReader
from datatrove.utils.logging import logger

RAW_PATTERNS = ("*.jsonl", "*.jsonl.gz", "*.jsonl.zst", "*.parquet")

# Fields kept as document metadata; HPLT v1.2 uses `url`/`document_lang`, v2 uses `u`/`lang`.
_URL_FIELDS = ("url", "u")
_LANG_FIELDS = ("lang", "document_lang")
_KEPT_FIELDS = ("source", "collection")
_MAX_LOGGED_PER_FILE = 20
TOO_LONG = "record_too_long"
# The rest of a too-long line is read in pieces of at most this size (or the limit, if smaller) and
# dropped.
_SKIP_BYTES = 2**20
# Parquet rows converted at a time: web documents are ~10 KB, so a batch is small next to the record
# limit.
_PARQUET_BATCH_ROWS = 64
# What a truncated or corrupt compressed file raises: the records before it are kept.
_DAMAGE = (EOFError, zlib.error, OSError, ValueError)


def _raw_file_names(folder: Path) -> list[str]:
    found = {p for pattern in RAW_PATTERNS for p in folder.rglob(pattern) if p.is_file()}
    return sorted(str(p.relative_to(folder)) for p in found)


def _is_text(name: str) -> bool:
    # A name that is not valid UTF-8 comes from the OS with surrogates, which no file list or log
    # can hold.
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def shown(name: str) -> str:
    """A file name as text whatever its bytes: invalid UTF-8 escaped (`caf\\xe9.jsonl`)."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def find_raw_files(folder: Path) -> list[str]:
    """Relative paths of the raw files below `folder`, sorted, so every run shards them alike. Files
    whose names are not valid UTF-8 are left out (`unreadable_names`), with a warning."""
    names = _raw_file_names(folder)
    for name in names:
        if not _is_text(name):
            logger.warning(
                f"Skipping {folder / shown(name)}: its name is not valid UTF-8; rename it to read "
                "it."
            )
    return [name for name in names if _is_text(name)]


def unreadable_names(folder: Path) -> list[str]:
    """The raw files below `folder` whose names are not valid UTF-8, escaped: bad records of their
    own."""
    return [shown(name) for name in _raw_file_names(folder) if not _is_text(name)]


def fingerprint_files(folder: Path, files: list[str]) -> dict:
    """Count, size and a hash of the names, sizes and modification times of `files`: changes when
    they do."""
    fingerprint = hashlib.sha256()
    total = 0
    for name in files:
        stat = (folder / name).stat()
        total += stat.st_size
        # Whole seconds: tar (its default format) and some file systems keep no finer time, and a
        # corpus carried to a cluster that way is the same input.
        fingerprint.update(f"{name}\0{stat.st_size}\0{int(stat.st_mtime)}\n".encode())
    # No path: a folder moved or copied with its files' times kept (mv, cp -p, rsync -a, tar) is the
    # same input.
    return {"files": len(files), "bytes": total, "fingerprint": fingerprint.hexdigest()[:16]}


class BadRecord(Exception):
    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.detail = detail


class RawCorpusReader(BaseDiskReader):
    name = "📖 Raw corpus"

    def __init__(
        self,
        data_folder: str,
        paths_file: str,
        bad_records_folder: str,
        file_progress: bool = True,
        max_record_bytes: Optional[int] = None,
    ):
        """`max_record_bytes`: the clean stage's `clean.max_record_bytes`. None reads records whole:
        the readers of the clean stage's own outputs, whose records were read within that limit."""
        super().__init__(
            data_folder, paths_file=paths_file, file_progress=file_progress, add_file_path=False
        )
        self.bad_records_folder = Path(bad_records_folder)
        self.max_record_bytes = max_record_bytes
        self._bad_log = None
        self._logged: dict[str, int] = {}
        # The share of the part being read that is read (for progress reports), set as it opens.
        self.part_done: Callable[[], float] = lambda: 0.0
        self._raw_position: Callable[[], int] = lambda: 0

    # -- records -----------------------------------------------------------------------------------

    def _document(self, record, path: str, line: int) -> Document:
        if not isinstance(record, dict):
            raise BadRecord("not_an_object", type(record).__name__)
        text = record.get("text")
        if text is None:
            raise BadRecord("missing_text", f"fields: {sorted(record)[:10]}")
        if not isinstance(text, str):
            raise BadRecord("text_not_a_string", type(text).__name__)
        if not text.strip():
            raise BadRecord("empty_text")
        doc_id = record.get("id")
        if doc_id is None or str(doc_id) == "":
            doc_id = f"{path}:{line}"
        metadata = {key: record[key] for key in _KEPT_FIELDS if record.get(key) is not None}
        url = next((record[k] for k in _URL_FIELDS if record.get(k)), None)
        if url is not None:
            metadata["url"] = url
        declared = next((record[k] for k in _LANG_FIELDS if record.get(k)), None)
        if declared is not None:
            metadata["declared_lang"] = declared
        metadata["raw_file"] = path
        return Document(text=text, id=str(doc_id), metadata=metadata)

    def _bad(self, path: str, line: int, reason: str, detail: str = "") -> None:
        self.stat_update("bad_records")
        self.stat_update(f"bad_records.{reason}")
        if self._bad_log is not None:
            self._bad_log.write(
                json.dumps({"file": path, "line": line, "reason": reason, "detail": detail}) + "\n"
            )
        count = self._logged.get(path, 0) + 1
        self._logged[path] = count
        if count <= _MAX_LOGGED_PER_FILE:
            logger.warning(f"Bad record in {path}, line {line}: {reason} {detail}".rstrip())
        elif count == _MAX_LOGGED_PER_FILE + 1:
            logger.warning(
                f"More bad records in {path}; see {self.bad_records_folder} for all of them."
            )

    def _too_long_detail(self) -> str:
        return f"over clean.max_record_bytes={self.max_record_bytes}; raise it to keep such records"

    # -- files -------------------------------------------------------------------------------------

    def _open_lines(self, path: str):
        raw = self.data_folder.open(path, "rb", compression=None)
        self._raw_position = raw.tell  # the bytes on disk read so far, for progress reports
        if path.endswith(".gz"):
            return gzip.GzipFile(fileobj=raw)
        if path.endswith(".zst"):
            import zstandard

            return io.BufferedReader(
                zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            )
        return raw

    def _text_bytes(self, path: str) -> int:
        """The decompressed size of a JSONL file, up to any damage: what its parts share."""
        if not path.endswith((".gz", ".zst")):
            return self.data_folder.size(path)
        size = 0
        stream = self._open_lines(path)
        try:
            while chunk := stream.read(_SKIP_BYTES):
                size += len(chunk)
        except _DAMAGE:
            pass  # the part that holds the damage counts it
        finally:
            stream.close()
        return size

    def _lines(self, stream) -> Iterator[Optional[bytes]]:
        """Each line of `stream` (with its newline), or None for one longer than `max_record_bytes`:
        of that one no more than the limit is ever held, and the rest is read in bounded pieces,
        each dropped, up to its newline."""
        if self.max_record_bytes is None:
            yield from iter(stream.readline, b"")
            return
        # One byte over the limit tells a line of exactly the limit (plus its newline) from a longer
        # one.
        while raw_line := stream.readline(self.max_record_bytes + 1):
            if len(raw_line) <= self.max_record_bytes or raw_line.endswith(b"\n"):
                yield raw_line
                continue
            del raw_line  # not held while the rest is skipped
            # Skipped before it is reported, so that a part of the file (`_read_jsonl`) sees where
            # the next line starts.
            skip = min(self.max_record_bytes, _SKIP_BYTES)
            while (piece := stream.readline(skip)) and not piece.endswith(b"\n"):
                pass
            yield None

    def _read_jsonl(self, path: str, part: int, parts: int) -> Iterator[Document]:
        start, end = 0, None
        if parts > 1:
            start, end = _share(self._text_bytes(path), part, parts)
            # What lies past the measured size (reading line by line may get further into damaged
            # data) is the last part's.
            end = None if part == parts - 1 else end
        stream = _CountingStream(self._open_lines(path))
        position, share = self._raw_position, self.data_folder.size(path) / parts
        try:
            try:
                line = _skip_to_line_start(stream, start)
            except _DAMAGE:
                return  # damage before this part's first line: the part that holds it counts it
            begun = position()
            self.part_done = lambda: (position() - begun) / max(share, 1.0)
            lines = self._lines(stream)
            while end is None or stream.offset < end:
                try:
                    raw_line = next(lines, b"")
                except _DAMAGE as error:
                    # Truncated or corrupt compressed data: keep what was read, count the rest once.
                    self._bad(path, line + 1, "truncated_or_corrupt_file", str(error))
                    return
                if raw_line is None:
                    line += 1
                    self._bad(path, line, TOO_LONG, self._too_long_detail())
                    continue
                if not raw_line:
                    break
                line += 1
                if not raw_line.strip():
                    continue
                try:
                    yield self._document(self._record(raw_line), path, line)
                except BadRecord as bad:
                    self._bad(path, line, bad.reason, bad.detail)
        finally:
            stream.close()
        if end is None and stream.offset == 0:
            self._bad(path, 0, "empty_file")

    @staticmethod
    def _record(raw_line: bytes):
        try:
            text = raw_line.decode("utf-8")
        except UnicodeDecodeError as error:
            raise BadRecord("invalid_utf8", str(error)) from None
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError as error:
            raise BadRecord("malformed_json", str(error)) from None

    def _parquet_rows(self, batch) -> Iterator[Optional[dict]]:
        """Each row of a record batch as a dict, or None for one whose `text` is longer than
        `max_record_bytes`, never made a Python string."""
        import pyarrow as pa
        import pyarrow.compute as pc

        text = batch.column("text") if "text" in batch.schema.names else None
        limited = (
            self.max_record_bytes is not None
            and text is not None
            and (pa.types.is_string(text.type) or pa.types.is_large_string(text.type))
        )
        too_long = (
            [(n or 0) > self.max_record_bytes for n in pc.binary_length(text).to_pylist()]
            if limited
            else []
        )
        if not any(too_long):
            yield from batch.to_pylist()
            return
        for index, skipped in enumerate(too_long):
            yield None if skipped else batch.slice(index, 1).to_pylist()[0]

    def _read_parquet(self, path: str, part: int, parts: int) -> Iterator[Document]:
        import pyarrow.parquet as pq

        # Bounded here: the rows converted at a time (one small batch), and a too-long text never
        # becomes a Python string. Not bounded: pyarrow reads a row group's column chunk and decodes
        # its pages whole, so a long text is held once in Arrow's memory before it is counted; the
        # file's writer bounds those, not this limit.
        row = 0
        try:
            with self.data_folder.open(path, "rb") as f:
                parquet = pq.ParquetFile(f)
                groups = range(*_share(parquet.num_row_groups, part, parts))
                rows = [parquet.metadata.row_group(g).num_rows for g in range(groups.stop)]
                row = first = sum(rows[: groups.start])
                last = sum(rows)
                self.part_done = lambda: (row - first) / max(last - first, 1)
                batches = parquet.iter_batches(
                    batch_size=_PARQUET_BATCH_ROWS, row_groups=list(groups)
                )
                for batch in batches:
                    for record in self._parquet_rows(batch):
                        row += 1
                        try:
                            if record is None:
                                raise BadRecord(TOO_LONG, self._too_long_detail())
                            yield self._document(record, path, row)
                        except BadRecord as bad:
                            self._bad(path, row, bad.reason, bad.detail)
        except (OSError, ValueError) as error:
            self._bad(path, row + 1, "truncated_or_corrupt_file", str(error))
            return
        if row == 0 and part == parts - 1:
            self._bad(path, 0, "empty_file")

    def read_part(self, path: str, part: int, parts: int) -> DocumentsPipeline:
        """The documents of part `part` of `parts` of the file `path`."""
        reader = self._read_parquet if path.endswith(".parquet") else self._read_jsonl
        for document in reader(path, part, parts):
            self.stat_update("docs_in")
            self.stat_update("chars_in", value=len(document.text))
            yield document

    def read_file(self, filepath: str) -> DocumentsPipeline:
        return self.read_part(filepath, 0, 1)

    def documents(self, rank: int, world_size: int) -> DocumentsPipeline:
        """Task `rank`'s documents: datatrove's shard of the paths file (files rank, rank +
        world_size, ...)."""
        return super().run(None, rank, world_size)

    def run(
        self, data: Optional[DocumentsPipeline] = None, rank: int = 0, world_size: int = 1
    ) -> DocumentsPipeline:
        self.bad_records_folder.mkdir(parents=True, exist_ok=True)
        # Opened per task (not in __init__) so a resumed task rewrites its own log from scratch.
        with open(
            self.bad_records_folder / f"{rank:05d}.jsonl", "w", encoding="utf-8"
        ) as self._bad_log:
            yield from self.documents(rank, world_size)
        self._bad_log = None


def _share(size: int, part: int, parts: int) -> tuple[int, int]:
    """[start, end) of part `part` of `parts` of `size` units (bytes, row groups)."""
    return part * size // parts, (part + 1) * size // parts


class _CountingStream:
    """A binary stream that counts the bytes read from it: the offset of the next line."""

    def __init__(self, stream) -> None:
        self.stream = stream
        self.offset = 0

    def read(self, size: int = -1) -> bytes:
        data = self.stream.read(size)
        self.offset += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data = self.stream.readline(size)
        self.offset += len(data)
        return data

    def close(self) -> None:
        self.stream.close()


def _skip_to_line_start(stream: _CountingStream, start: int) -> int:
    """Reads `stream` up to the first line that starts at or after byte `start`; returns the number
    of lines before it."""
    newlines, last = 0, b"\n"
    while stream.offset < start and (chunk := stream.read(min(_SKIP_BYTES, start - stream.offset))):
        newlines += chunk.count(b"\n")
        last = chunk[-1:]
    if last != b"\n":  # `start` falls inside a line, which belongs to the part before
        while piece := stream.readline(_SKIP_BYTES):
            if piece.endswith(b"\n"):
                return newlines + 1
    return newlines


class TaskOutputReader(JsonlReader):
    """Reads exactly the file that task `rank` of the previous phase wrote (`<rank>.jsonl.gz`).

    MinHash's removal lists refer to documents by their index within a task, so the task that
    filters duplicates must see the same documents in the same order as the task that signed them.
    """

    name = "📖 Task output"

    def run(
        self, data: Optional[DocumentsPipeline] = None, rank: int = 0, world_size: int = 1
    ) -> DocumentsPipeline:
        filename = f"{rank:05d}.jsonl.gz"
        if self.data_folder.exists(filename):
            yield from self.read_files_shard([filename])
