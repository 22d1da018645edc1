"""A datatrove reader for raw web-corpus files that never crashes on bad input and never loses good
data.

Reads `*.jsonl`, `*.jsonl.gz`, `*.jsonl.zst` and `*.parquet` with HPLT's fields (`text`, `id`, `url`
or `u`, `lang`/`document_lang`, `collection`). Unlike datatrove's stock JsonlReader, which drops the
rest of a file after one invalid UTF-8 byte and stops the task on a truncated `.gz`, it reads line
by line in binary, keeps every valid record, and counts each bad one (stat `bad_records`, one stat
per reason) with its file and line in `bad_records/<rank>.jsonl`.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import zlib
from pathlib import Path
from typing import Iterator, Optional

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
        if path.endswith(".gz"):
            return gzip.GzipFile(fileobj=raw)
        if path.endswith(".zst"):
            import zstandard

            return io.BufferedReader(
                zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            )
        return raw

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
            yield None
            skip = min(self.max_record_bytes, _SKIP_BYTES)
            while (piece := stream.readline(skip)) and not piece.endswith(b"\n"):
                pass

    def _read_jsonl(self, path: str) -> Iterator[Document]:
        line = 0
        stream = self._open_lines(path)
        lines = self._lines(stream)
        try:
            while True:
                try:
                    raw_line = next(lines, b"")
                except (EOFError, zlib.error, OSError, ValueError) as error:
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
                    try:
                        text = raw_line.decode("utf-8")
                    except UnicodeDecodeError as error:
                        raise BadRecord("invalid_utf8", str(error)) from None
                    try:
                        record = orjson.loads(text)
                    except orjson.JSONDecodeError as error:
                        raise BadRecord("malformed_json", str(error)) from None
                    yield self._document(record, path, line)
                except BadRecord as bad:
                    self._bad(path, line, bad.reason, bad.detail)
        finally:
            stream.close()
        if line == 0:
            self._bad(path, 0, "empty_file")

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

    def _read_parquet(self, path: str) -> Iterator[Document]:
        import pyarrow.parquet as pq

        # Bounded here: the rows converted at a time (one small batch), and a too-long text never
        # becomes a Python string. Not bounded: pyarrow reads a row group's column chunk and decodes
        # its pages whole, so a long text is held once in Arrow's memory before it is counted; the
        # file's writer bounds those, not this limit.
        row = 0
        try:
            with self.data_folder.open(path, "rb") as f:
                for batch in pq.ParquetFile(f).iter_batches(batch_size=_PARQUET_BATCH_ROWS):
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
        if row == 0:
            self._bad(path, 0, "empty_file")

    def read_file(self, filepath: str) -> DocumentsPipeline:
        reader = self._read_parquet if filepath.endswith(".parquet") else self._read_jsonl
        for document in reader(filepath):
            self.stat_update("docs_in")
            self.stat_update("chars_in", value=len(document.text))
            yield document

    def run(
        self, data: Optional[DocumentsPipeline] = None, rank: int = 0, world_size: int = 1
    ) -> DocumentsPipeline:
        self.bad_records_folder.mkdir(parents=True, exist_ok=True)
        # Opened per task (not in __init__) so a resumed task rewrites its own log from scratch.
        with open(
            self.bad_records_folder / f"{rank:05d}.jsonl", "w", encoding="utf-8"
        ) as self._bad_log:
            yield from super().run(data, rank, world_size)
        self._bad_log = None


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
