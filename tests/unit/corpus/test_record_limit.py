"""`clean.max_record_bytes`: the raw reader never holds more of one record than the limit; a longer
record is a bad record (`record_too_long`) skipped unread, and every record after it is still read."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import tracemalloc

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.corpus.reader import RawCorpusReader
from tests.conftest import cli_env, marker, run_cli

KIB, MIB = 2**10, 2**20
LIMIT = KIB


def _line(doc_id: str, text: str) -> bytes:
    return json.dumps({"id": doc_id, "text": text}).encode() + b"\n"


def _exactly(limit: int) -> bytes:
    """A record line of exactly `limit` bytes before its newline: the longest one kept."""
    short = _line("exact", "")
    return _line("exact", "x" * (limit - len(short) + 1))


class RecordingStream:
    """A stream that remembers the largest piece of bytes it handed the reader."""

    def __init__(self, stream) -> None:
        self.stream, self.largest = stream, 0

    def _seen(self, piece: bytes) -> bytes:
        self.largest = max(self.largest, len(piece))
        return piece

    def readline(self, size: int = -1) -> bytes:
        return self._seen(self.stream.readline(size))

    def read(self, size: int = -1) -> bytes:
        return self._seen(self.stream.read(size))

    def close(self) -> None:
        self.stream.close()


def _read(tmp_path, name: str, limit: int):
    """The documents, bad records and stats of reading raw/<name> with `limit`, and the largest
    piece read."""
    (tmp_path / "files.txt").write_text(f"{name}\n", encoding="utf-8")
    reader = RawCorpusReader(
        str(tmp_path / "raw"),
        str(tmp_path / "files.txt"),
        str(tmp_path / "bad"),
        file_progress=False,
        max_record_bytes=limit,
    )
    streams = []
    open_lines = reader._open_lines

    def recorded(path: str) -> RecordingStream:
        streams.append(RecordingStream(open_lines(path)))
        return streams[-1]

    reader._open_lines = recorded
    tracemalloc.start()
    try:
        documents = list(reader.run())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    bad = [json.loads(line) for line in (tmp_path / "bad" / "00000.jsonl").read_text().splitlines()]
    largest = max((stream.largest for stream in streams), default=0)
    return documents, bad, reader.stats.to_dict()["stats"], largest, peak


@pytest.mark.parametrize("name", ["mixed.jsonl", "mixed.jsonl.gz"])
def test_a_record_over_the_limit_is_counted_and_skipped_unread(tmp_path, name):
    huge = b'{"id": "huge", "text": "' + b"a" * MIB + b'"}\n'
    lines = [
        _line("first", "Fyrsti tekstur."),
        _exactly(LIMIT),
        huge,
        _line("after", "Seinni tekstur."),
        _line("last", "Seinasti tekstur, uttan linjuskift.").rstrip(b"\n"),
    ]
    assert len(_exactly(LIMIT)) == LIMIT + 1
    data = b"".join(lines)
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / name).write_bytes(gzip.compress(data) if name.endswith(".gz") else data)

    documents, bad, stats, largest, peak = _read(tmp_path, name, LIMIT)

    assert [doc.id for doc in documents] == ["first", "exact", "after", "last"]
    assert [(b["file"], b["line"], b["reason"]) for b in bad] == [(name, 3, "record_too_long")]
    assert "clean.max_record_bytes" in bad[0]["detail"]
    assert stats["bad_records"] == stats["bad_records.record_too_long"] == 1
    # Never more than the limit and the one byte that tells a longer line; no hidden whole-line copy
    # either.
    assert largest <= LIMIT + 1
    assert peak < MIB // 2, (
        f"the reader held {peak} bytes at once while reading a {MIB}-byte record"
    )


def test_a_parquet_text_over_the_limit_is_counted_and_the_rest_kept(tmp_path):
    (tmp_path / "raw").mkdir()
    texts = ["Fyrsti tekstur.", "a" * (LIMIT + 1), "Seinni tekstur."]
    table = pa.table({"id": ["first", "huge", "after"], "text": texts})
    pq.write_table(table, tmp_path / "raw" / "mixed.parquet")

    documents, bad, stats, _, _ = _read(tmp_path, "mixed.parquet", LIMIT)

    assert [doc.id for doc in documents] == ["first", "after"]
    assert [(b["line"], b["reason"]) for b in bad] == [(2, "record_too_long")]
    assert stats["bad_records.record_too_long"] == 1


def _peak_rss_of_command(command: list[str], cwd) -> tuple[subprocess.CompletedProcess, int]:
    """Runs `command` and returns its peak resident memory in bytes (the largest of its processes).

    From a launcher of its own: Linux carries ru_maxrss across fork and exec, so a command started
    from this test process (or forked from the CLI server) would report at least this process' peak.
    """
    launcher = (
        "import resource, subprocess, sys; code = subprocess.run(sys.argv[1:]).returncode; "
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr); "
        "sys.exit(code)"
    )
    result = subprocess.run(
        [sys.executable, "-c", launcher, *command],
        cwd=cwd,
        env=cli_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, int(result.stderr.strip().splitlines()[-1])


def test_the_clean_stage_finishes_with_a_record_larger_than_its_memory(tmp_path):
    # Larger than the whole stage (~320 MB resident: Python, datatrove, language ID), so that
    # reading the line whole (at least once as bytes, then as text and as JSON) would take the stage
    # well past it.
    record_bytes = 600 * MIB
    folder = tmp_path / "raw" / "fao"
    folder.mkdir(parents=True)
    with gzip.open(folder / "broken_dump.jsonl.gz", "wb", compresslevel=1) as f:
        f.write(_line("before", "Hetta er ein stuttur tekstur á føroyskum."))
        # Declared English: were it read, the first filter would drop it at once, so a broken limit
        # fails on memory rather than after minutes of filtering.
        f.write(b'{"id": "huge", "lang": "eng", "text": "')
        for _ in range(record_bytes // MIB):
            f.write(b"a" * MIB)
        f.write(b'"}\n')
        f.write(_line("after", "Hetta er ein annar tekstur á føroyskum."))
    overrides = [
        "stage=clean",
        "lang=fao",
        f"raw_dir={tmp_path / 'raw'}",
        f"work_dir={tmp_path / 'out'}",
        "clean.dedup.enabled=false",
        f"clean.max_record_bytes={MIB}",
    ]

    result, peak = _peak_rss_of_command(
        [sys.executable, "-m", "pipeline", *overrides], cwd=tmp_path
    )

    assert result.returncode == 0, result.stderr[-3000:]
    metrics = marker(tmp_path / "out", "fao", "clean")["metrics"]
    assert metrics["bad_records"] == 1
    assert metrics["bad_records_by_reason"] == {"record_too_long": 1}
    assert metrics["docs_in"] == 2
    bad = (
        (tmp_path / "out" / "fao" / "clean" / "bad_records" / "records.jsonl")
        .read_text()
        .splitlines()
    )
    assert [(b["file"], b["line"]) for b in map(json.loads, bad)] == [("broken_dump.jsonl.gz", 2)]
    assert peak < record_bytes * 3 // 4, f"the stage's peak memory was {peak / MIB:.0f} MiB"


def test_a_limit_below_one_byte_fails_at_start_naming_the_key(tmp_path):
    (tmp_path / "raw" / "fao").mkdir(parents=True)
    (tmp_path / "raw" / "fao" / "a.jsonl").write_bytes(_line("a", "Tekstur."))
    result = run_cli(
        "stage=clean",
        "lang=fao",
        f"raw_dir={tmp_path / 'raw'}",
        f"work_dir={tmp_path / 'out'}",
        "clean.max_record_bytes=0",
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode != 0
    assert "clean.max_record_bytes" in result.stderr + result.stdout
    assert not (tmp_path / "out" / "fao" / "clean" / "_SUCCESS.json").exists()
