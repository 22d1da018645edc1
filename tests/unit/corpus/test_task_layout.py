"""The clean stage's task layout: raw files read in parts by several tasks, and output shards merged
from the tasks' staged files, give what one task reading everything gives."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from pipeline.corpus.shards import STAGED, MergeShards
from pipeline.corpus.task_layout import LayoutReader, plan_layout

LIMIT = 3000  # clean.max_record_bytes here: some records are longer


def _lines() -> list[bytes]:
    """HPLT-shaped lines of every kind the reader meets: good, blank, malformed, too long, without
    an id (named by its line), and a last one without its newline."""
    lines = []
    for i in range(120):
        kind = i % 10
        if kind == 3:
            lines.append(b'{"id": "broken", "text": \n')
        elif kind == 5:
            lines.append(b"\n")
        elif kind == 7:
            lines.append(json.dumps({"id": f"long{i}", "text": "y" * LIMIT}).encode() + b"\n")
        elif kind == 8:
            lines.append(json.dumps({"text": f"Utan id {i}."}).encode() + b"\n")
        else:
            lines.append(json.dumps({"id": f"d{i}", "text": "Tekst. " * (i % 40 + 1)}).encode())
            lines[-1] += b"\n"
    lines[-1] = lines[-1].rstrip(b"\n")
    return lines


def _raw_files(folder) -> None:
    data = b"".join(_lines())
    folder.mkdir()
    (folder / "plain.jsonl").write_bytes(data)
    (folder / "web.jsonl.gz").write_bytes(gzip.compress(data))
    (folder / "web.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(data))
    whole = gzip.compress(data)
    (folder / "truncated.jsonl.gz").write_bytes(whole[: len(whole) * 2 // 3])
    (folder / "empty.jsonl.gz").write_bytes(gzip.compress(b""))
    rows = [
        {"id": f"p{i}", "text": " ".join(str(i * j) for j in range(200)) if i % 6 else None}
        for i in range(1, 60)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "rows.parquet", row_group_size=7)


def _read_in_parts(tmp_path, name: str, parts: int) -> tuple[list, list]:
    """The documents and bad records of `name` read as `parts` tasks of LayoutReader, in order."""
    work = tmp_path / f"{name}-{parts}"
    work.mkdir()
    layout = {"files": [name], "tasks": [[[0, part, parts]] for part in range(parts)]}
    (work / "task_layout.json").write_text(json.dumps(layout))
    documents, bad = [], []
    for rank in range(parts):
        reader = LayoutReader(
            str(tmp_path / "raw"),
            str(work / "task_layout.json"),
            str(work / "bad"),
            str(work / "progress"),
            max_record_bytes=LIMIT,
        )
        documents += [(d.id, d.text, d.metadata) for d in reader.run(rank=rank, world_size=parts)]
        bad += (work / "bad" / f"{rank:05d}.jsonl").read_text().splitlines()
        assert json.loads((work / "progress" / f"{rank:05d}.json").read_text())["done"] > 0
    return documents, [json.loads(line) for line in bad]


@pytest.mark.parametrize(
    "name",
    [
        "plain.jsonl",
        "web.jsonl.gz",
        "web.jsonl.zst",
        "truncated.jsonl.gz",
        "empty.jsonl.gz",
        "rows.parquet",
    ],
)
def test_a_file_read_in_parts_gives_what_it_gives_read_whole(tmp_path, name):
    _raw_files(tmp_path / "raw")
    whole = _read_in_parts(tmp_path, name, 1)
    assert whole[0] or name == "empty.jsonl.gz"
    assert whole[1]  # every file has bad records: their line numbers must survive the parts
    for parts in (2, 3, 8):
        assert _read_in_parts(tmp_path, name, parts) == whole, parts


def test_the_layout_shares_the_bytes_and_keeps_the_input_order(tmp_path):
    _raw_files(tmp_path / "raw")
    files = ["plain.jsonl", "rows.parquet", "web.jsonl.gz"]
    layout = plan_layout(tmp_path / "raw", files, tasks=6, min_part_bytes=1000)
    pieces = [tuple(piece) for task in layout["tasks"] for piece in task]
    # every part of every file once, in input order, runs of them per task
    assert pieces == sorted(pieces) and {p[0] for p in pieces} == {0, 1, 2}
    assert all(sorted(p[1] for p in pieces if p[0] == i) == list(range(n)) for i, _, n in pieces)
    parts = {files[i]: n for i, _, n in pieces}
    assert parts["plain.jsonl"] > 1 and 1 < parts["rows.parquet"] <= 9  # at most its row groups
    sizes = [(tmp_path / "raw" / name).stat().st_size for name in files]
    assert sum(layout["task_bytes"]) == pytest.approx(sum(sizes), abs=len(layout["tasks"]))
    assert plan_layout(tmp_path / "raw", files, tasks=1, min_part_bytes=1000)["tasks"] == [
        [[0, 0, 1], [1, 0, 1], [2, 0, 1]]
    ]
    bigger = plan_layout(tmp_path / "raw", files, tasks=6, min_part_bytes=10**9)
    assert all(parts == 1 for task in bigger["tasks"] for _, _, parts in task)


def test_merged_shards_are_the_same_bytes_however_the_documents_were_staged(tmp_path):
    lines = [
        json.dumps({"id": f"d{i}", "text": "x" * (i * 7 % 300)}).encode() + b"\n"
        for i in range(200)
    ]
    shards = {}
    for tasks in (1, 3, 7):
        work = tmp_path / str(tasks)
        staged = work / STAGED / "train"
        staged.mkdir(parents=True)
        for rank in range(tasks):
            share = lines[rank * len(lines) // tasks : (rank + 1) * len(lines) // tasks]
            (staged / f"{rank:05d}.jsonl").write_bytes(b"".join(share))
        for rank in range(tasks):
            MergeShards(work, shard_bytes=5000).run(rank=rank, world_size=tasks)
        shards[tasks] = {p.name: p.read_bytes() for p in sorted((work / "train").iterdir())}
    assert shards[1] == shards[3] == shards[7] and len(shards[1]) > 3
    merged = b"".join(gzip.decompress(data) for data in shards[1].values())
    assert merged == b"".join(lines)
