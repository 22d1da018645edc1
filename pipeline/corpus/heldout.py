"""Held-out text for tokenizer and model evaluation: whole sources, and a deterministic split by
document id.

A held-out source is every document of the raw files, or of the records' `source`, that
`clean.heldout_sources` names (glob patterns): text of a kind the model never trains on. Of the
rest, the held-out documents are those with the smallest id hashes: every document whose hash falls
below `clean.heldout_fraction` (decided while streaming, in any task), topped up after the stage to
at least `clean.heldout_min_documents` (so that a small language still has text to evaluate on).
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import json
from collections import defaultdict
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.disk_base import DiskWriter

from pipeline.commit_steps import commit_step
from pipeline.corpus.shards import write_lines
from pipeline.corpus.source_counts import UNKNOWN_FILE, Counts

# A fixed salt keeps the split independent of any other hash of the ids (e.g. sharding).
_SALT = b"heldout-v1:"
# The shard that the top-up adds to `heldout/`.
TOP_UP_SHARD = "min_documents.jsonl.gz"


def id_hash(doc_id: str) -> int:
    """The document's place in the held-out order, uniform in [0, 2**64)."""
    return int.from_bytes(
        hashlib.blake2b(_SALT + doc_id.encode("utf-8"), digest_size=8).digest(), "big"
    )


def is_heldout(doc_id: str, fraction: float) -> bool:
    return id_hash(doc_id) < fraction * 2**64


def is_heldout_source(raw_file: str, source: str, patterns: list[str]) -> bool:
    """Whether a document is held out with its whole source: a pattern matches its raw file's path
    below `${raw_dir}/<lang>/` or name (`regjeringen_*` also holds out
    `2024/regjeringen_a.jsonl.gz`), or its record's `source` field (one book of a file of books:
    `*Sherlock-Holmes*`)."""
    name = PurePosixPath(raw_file).name
    return any(
        fnmatchcase(raw_file, pattern) or fnmatchcase(name, pattern) or fnmatchcase(source, pattern)
        for pattern in patterns
    )


class HeldoutSourceSplit(PipelineStep):
    """Writes the documents of held-out source files with `writer` and passes the others on."""

    type = "✂️ - SPLIT"
    name = "✂️ Held-out sources"

    def __init__(self, patterns: list[str], writer: DiskWriter):
        super().__init__()
        self.patterns = list(patterns)
        self.writer = writer

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.writer as writer:
            for doc in data:
                if is_heldout_source(
                    doc.metadata.get("raw_file", ""),
                    str(doc.metadata.get("source", "")),
                    self.patterns,
                ):
                    writer.write(doc, rank)
                    self.stat_update("heldout_source")
                    self.stat_update("heldout_source_chars", value=len(doc.text))
                else:
                    yield doc


class HeldoutSplit(PipelineStep):
    """Writes the held-out documents with `heldout_writer` and passes the training documents on."""

    type = "✂️ - SPLIT"
    name = "✂️ Held-out split"

    def __init__(self, fraction: float, heldout_writer: DiskWriter):
        super().__init__()
        self.fraction = fraction
        self.heldout_writer = heldout_writer

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        with self.heldout_writer as writer:
            for doc in data:
                if is_heldout(doc.id, self.fraction):
                    writer.write(doc, rank)
                    self.stat_update("heldout")
                    self.stat_update("heldout_chars", value=len(doc.text))
                else:
                    self.stat_update("train")
                    self.stat_update("train_chars", value=len(doc.text))
                    yield doc


def _lines(path: Path) -> list[bytes]:
    with gzip.open(path, "rb") as handle:
        return [line for line in handle if line.strip()]


def _id(line: bytes) -> str:
    return json.loads(line)["id"]


def choose_top_up(train: Path, missing: int) -> tuple[dict[str, list[str]], Counts]:
    """The `missing` training documents with the smallest id hashes: their ids by `train` shard, and
    the documents and characters they hold per raw file ({raw file: [documents, characters]}). Reads
    every training document once: it runs when the split holds too few documents, i.e. on a small
    corpus. Changes nothing (`move_to_heldout` does)."""
    if missing <= 0:
        return {}, {}

    def candidates():
        for shard in sorted(train.glob("*.jsonl.gz")):
            for line in _lines(shard):
                record = json.loads(line)
                raw_file = record.get("metadata", {}).get("raw_file", UNKNOWN_FILE)
                yield id_hash(record["id"]), shard.name, record["id"], raw_file, len(record["text"])

    ids: dict[str, list[str]] = defaultdict(list)
    by_file: Counts = defaultdict(lambda: [0, 0])
    for _, shard, doc_id, raw_file, chars in heapq.nsmallest(missing, candidates()):
        ids[shard].append(doc_id)
        by_file[raw_file][0] += 1
        by_file[raw_file][1] += chars
    return dict(ids), dict(by_file)


def move_to_heldout(train: Path, heldout: Path, chosen: dict[str, list[str]]) -> None:
    """Move the documents `choose_top_up` chose from their `train` shards to `heldout/`'s top-up
    shard. Taken again after a kill, it finishes the move: the top-up shard is written whole before
    any training shard loses a document, and a shard that has lost its documents already is left
    alone."""
    if not chosen:
        return
    leaving = {name: set(ids) for name, ids in chosen.items()}
    target = heldout / TOP_UP_SHARD
    if not target.exists():
        moved = [
            line
            for name in sorted(chosen)
            for line in _lines(train / name)
            if _id(line) in leaving[name]
        ]
        heldout.mkdir(parents=True, exist_ok=True)
        commit_step("clean: write the held-out top-up")
        write_lines(target, moved)
    for name in sorted(chosen):
        shard = train / name
        lines = _lines(shard) if shard.exists() else []
        kept = [line for line in lines if _id(line) not in leaving[name]]
        if len(kept) == len(lines):
            continue
        commit_step(f"clean: take the top-up out of train/{name}")
        if kept:
            write_lines(shard, kept)
        else:
            shard.unlink()
