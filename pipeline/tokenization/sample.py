"""The tokenizer's training text: the mix plan's sources in the plan's proportions, within
`tokenizer.sample_bytes`.

The sample is the planned training stream, scaled down. A source's share is its share of the planned
bytes (its epochs x its unique bytes: the plan's sampling weight, counted in bytes of text rather
than in estimated tokens, so that scripts with more bytes per token are not shortchanged). The total
is the largest that repeats no document, the planned bytes divided by the most epochs any source
gets (repeating text would only multiply its counts), and at most `tokenizer.sample_bytes`. A source
that gives less than all of its text keeps each document with the probability that gives its share,
decided by a seeded hash of the document id: the same seed gives the same sample, drawn from the
whole source rather than its first files, and a source never exceeds its share. A source the plan
gives no tokens gives nothing. The clean outputs' held-out split is never read: only `train/`.

The sample goes to one JSONL file (a JSON string per document) that the trainer streams, so memory
holds the sampled documents of one input file at a time, whatever the size of the corpus.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import BinaryIO, Iterator, Optional

import orjson

from pipeline.corpus.sources import FileTask, over_files, source_reader
from pipeline.mixing.sources import planned_source

# Shares within this of a source's size take all of it (float rounding of planned / max epochs).
_ALL = 1 - 1e-9


@dataclass(frozen=True)
class Share:
    name: str
    unique_bytes: int
    planned_bytes: float
    # Bytes to take; None takes the whole source.
    cap_bytes: Optional[int]
    keep_probability: float


@dataclass
class SampledSource:
    share: Share
    input: str  # clean output or raw folder
    path: str
    # The folder read (`<path>/train` for a clean output); None for a source that gives nothing.
    folder: Optional[str] = None
    documents_read: int = 0
    bytes_read: int = 0
    documents: int = 0
    bytes: int = 0
    bad_records: int = 0


def shares(plan_sources: list[dict], sample_bytes: int) -> list[Share]:
    """What each source of the plan gives to a sample of at most `sample_bytes`."""
    planned = {s["name"]: s["epochs"] * s["unique_bytes"] for s in plan_sources}
    total_planned = sum(planned.values())
    if total_planned == 0:
        return [Share(s["name"], s["unique_bytes"], 0.0, 0, 0.0) for s in plan_sources]
    most_epochs = max(s["epochs"] for s in plan_sources if planned[s["name"]] > 0)
    total = min(sample_bytes, total_planned / most_epochs)
    result = []
    for s in plan_sources:
        name, unique = s["name"], s["unique_bytes"]
        wanted = planned[name] / total_planned * total
        probability = wanted / unique if unique > 0 else 0.0
        if probability >= _ALL:
            result.append(Share(name, unique, planned[name], None, 1.0))
        else:
            result.append(Share(name, unique, planned[name], int(wanted), probability))
    return result


def keeps(seed: int, source: str, doc_id: str, probability: float) -> bool:
    """A document's seeded coin toss: the same seed, source and id always give the same answer."""
    if probability >= 1:
        return True
    digest = hashlib.blake2b(f"{seed}\0{source}\0{doc_id}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < probability * 2**64


def _sample_file(
    task: FileTask, seed: int, probability: float
) -> tuple[list[tuple[str, int]], int, int, int]:
    """The kept texts of one file with their UTF-8 sizes, and the documents, bytes and bad records
    read."""
    source = task[0]
    reader = source_reader(*task[:3])
    kept, docs, size = [], 0, 0
    for document in reader.run(rank=task[3], world_size=len(source.files)):
        docs += 1
        text_bytes = len(document.text.encode("utf-8"))
        size += text_bytes
        if keeps(seed, source.name, document.id, probability):
            kept.append((document.text, text_bytes))
    return kept, docs, size, int(reader.stats["bad_records"].total)


def write_sample(
    plan_sources: list[dict],
    sample_bytes: int,
    seed: int,
    out: Path,
    scratch: Path,
    work_dir: str,
    workers: int,
) -> list[SampledSource]:
    """Write the sample to `out` (JSONL of strings); what each source gave."""
    plan_by_name = {s["name"]: s for s in plan_sources}
    sampled = []
    with open(out, "wb") as sink:
        for share in shares(plan_sources, sample_bytes):
            entry = plan_by_name[share.name]
            result = SampledSource(share, entry["input"], entry["path"])
            sampled.append(result)
            if share.keep_probability == 0:
                continue  # not even opened: a source the plan does not use need not exist
            source = planned_source(entry, work_dir)
            result.folder = str(source.folder)
            per_file = partial(_sample_file, seed=seed, probability=share.keep_probability)
            files = over_files(
                source, scratch / share.name, workers, per_file, f"tokenizer: sampling {share.name}"
            )
            for texts, docs, size, bad in files:
                result.documents_read += docs
                result.bytes_read += size
                result.bad_records += bad
                for text, text_bytes in texts:
                    if share.cap_bytes is not None and result.bytes + text_bytes > share.cap_bytes:
                        continue
                    write_document(sink, text)
                    result.documents += 1
                    result.bytes += text_bytes
            if not result.bad_records:
                shutil.rmtree(scratch / share.name / "bad_records", ignore_errors=True)
    return sampled


def write_document(sink: BinaryIO, text: str) -> None:
    sink.write(orjson.dumps(text) + b"\n")


def read_sample(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for line in f:
            yield orjson.loads(line)
