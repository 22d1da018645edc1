"""Deterministic held-out split by document id, for tokenizer and model evaluation."""

from __future__ import annotations

import hashlib

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.disk_base import DiskWriter

# A fixed salt keeps the split independent of any other hash of the ids (e.g. sharding).
_SALT = b"heldout-v1:"


def is_heldout(doc_id: str, fraction: float) -> bool:
    digest = hashlib.blake2b(_SALT + doc_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") < fraction * 2**64


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
