"""Held-out text for tokenizer and model evaluation: whole sources, and a deterministic split by document id.

A held-out source is every document of the raw files, or of the records' `source`, that `clean.heldout_sources`
names (glob patterns): text of a kind the model never trains on. Of the rest, the held-out documents are those with
the smallest id hashes: every document whose hash falls below `clean.heldout_fraction` (decided while streaming, in
any task), topped up after the stage to at least `clean.heldout_min_documents` (so that a small language still has
text to evaluate on).
"""

from __future__ import annotations

import gzip
import hashlib
import heapq
import json
import os
from collections import defaultdict
from fnmatch import fnmatchcase
from pathlib import Path, PurePosixPath

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.disk_base import DiskWriter

from pipeline.corpus.source_counts import UNKNOWN_FILE, Counts

# A fixed salt keeps the split independent of any other hash of the ids (e.g. sharding).
_SALT = b"heldout-v1:"
# The shard that the top-up adds to `heldout/`.
TOP_UP_SHARD = "min_documents.jsonl.gz"


def id_hash(doc_id: str) -> int:
    """The document's place in the held-out order, uniform in [0, 2**64)."""
    return int.from_bytes(hashlib.blake2b(_SALT + doc_id.encode("utf-8"), digest_size=8).digest(), "big")


def is_heldout(doc_id: str, fraction: float) -> bool:
    return id_hash(doc_id) < fraction * 2**64


def is_heldout_source(raw_file: str, source: str, patterns: list[str]) -> bool:
    """Whether a document is held out with its whole source: a pattern matches its raw file's path below
    `${raw_dir}/<lang>/` or name (`regjeringen_*` also holds out `2024/regjeringen_a.jsonl.gz`), or its record's
    `source` field (one book of a file of books: `*Sherlock-Holmes*`)."""
    name = PurePosixPath(raw_file).name
    return any(fnmatchcase(raw_file, pattern) or fnmatchcase(name, pattern) or fnmatchcase(source, pattern)
               for pattern in patterns)


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
                if is_heldout_source(doc.metadata.get("raw_file", ""), str(doc.metadata.get("source", "")),
                                     self.patterns):
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


def top_up_heldout(train: Path, heldout: Path, missing: int) -> Counts:
    """Move the `missing` training documents with the smallest id hashes from the `train` shards to `heldout`;
    returns the documents and characters moved, per raw file ({raw file: [documents, characters]}). Reads every
    training document once: it runs when the split holds too few documents, i.e. on a small corpus."""
    if missing <= 0:
        return {}
    shards = sorted(train.glob("*.jsonl.gz"))
    order = ((id_hash(json.loads(line)["id"]), shard, index)
             for shard in shards for index, line in enumerate(_lines(shard)))
    chosen = {(shard, index) for _, shard, index in heapq.nsmallest(missing, order)}
    moved: list[bytes] = []
    for shard in shards:
        lines = _lines(shard)
        kept = [line for index, line in enumerate(lines) if (shard, index) not in chosen]
        moved += [line for index, line in enumerate(lines) if (shard, index) in chosen]
        if not kept:
            shard.unlink()
        elif len(kept) < len(lines):
            _write_atomic(shard, kept)
    heldout.mkdir(parents=True, exist_ok=True)
    _write_atomic(heldout / TOP_UP_SHARD, moved)
    by_file: Counts = defaultdict(lambda: [0, 0])
    for record in map(json.loads, moved):
        entry = by_file[record.get("metadata", {}).get("raw_file", UNKNOWN_FILE)]
        entry[0] += 1
        entry[1] += len(record["text"])
    return dict(by_file)


def _write_atomic(path: Path, lines: list[bytes]) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with gzip.open(tmp, "wb") as handle:
        handle.writelines(lines)
    os.replace(tmp, path)
