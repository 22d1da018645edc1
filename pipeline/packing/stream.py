"""One source's endless token stream: its documents in a seeded order, pass after pass.

A pass of the plan reads document d `repeats[d]` times (pipeline/packing/repetition.py). It is laid
out as epochs: epoch k holds the documents read more than k times, in a seeded random order that
differs per source, pass and epoch, so a document never repeats within an epoch and the extra reads
of a fractional epoch come last. The passes follow one another without a gap: a position in the
stream is a pass (position // pass tokens), an epoch and a document found by binary search. Only the
order of the epoch being read (and, across an epoch's end, of the next) is held in memory, 12 bytes per
document (its ids and cumulative lengths), so the stream costs the same for one epoch or forty.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from pipeline.packing.packed import PackedSource
from pipeline.packing.shards import PackedDataError, repack_hint


class SourceStream:
    def __init__(self, source: PackedSource, position: int, seed: int, eos_id: int, vocab_size: int,
                 pack_dir) -> None:
        """`position`: the source's place in packed.json, part of its shuffle seed."""
        self.source, self.seed, self.position, self.pack_dir = source, seed, position, pack_dir
        self.eos_id, self.vocab_size = eos_id, vocab_size
        self.pass_tokens = source.pass_tokens
        epochs = int(source.repeats.max())
        # Where each epoch starts within a pass, in tokens.
        self.epoch_starts = np.concatenate([[0], np.cumsum([int(source.document_tokens[source.repeats > k].sum())
                                                             for k in range(epochs)])])
        self._epoch = lru_cache(maxsize=2)(self._order)  # the epoch being read and, across a boundary, the next

    def _order(self, pass_index: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The documents of one epoch in their shuffled order, and where each ends (tokens into the epoch)."""
        members = np.flatnonzero(self.source.repeats > epoch)
        dtype = np.int32 if self.source.documents < 2**31 else np.int64
        order = np.random.default_rng([self.seed, self.position, pass_index, epoch]).permutation(members).astype(dtype)
        return order, np.cumsum(self.source.document_tokens[order])

    def _broken(self, document: int, what: str) -> PackedDataError:
        shard = self.source.shards[int(self.source.document_shard[document])].path
        return PackedDataError(f"source `{self.source.name}`, document {document} in {shard} {what}. "
                               f"{repack_hint(self.pack_dir)}")

    def read(self, start: int, length: int, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Stream tokens start .. start+length-1 into `tokens`; `starts` marks where a document begins."""
        filled = 0
        starts[:] = False
        while filled < length:
            pass_index, offset = divmod(start + filled, self.pass_tokens)
            epoch = int(np.searchsorted(self.epoch_starts, offset, side="right")) - 1
            offset -= int(self.epoch_starts[epoch])
            order, ends = self._epoch(pass_index, epoch)
            i = int(np.searchsorted(ends, offset, side="right"))
            while filled < length and i < len(order):  # documents of this epoch, one after the other
                document = int(order[i])
                size = int(self.source.document_tokens[document])
                within = offset - (int(ends[i]) - size)
                take = min(size - within, length - filled)
                piece = self.source.document(document)[within:within + take]
                tokens[filled:filled + take] = piece
                starts[filled] = within == 0
                if within + take == size and piece[-1] != self.eos_id:
                    raise self._broken(document, f"does not end with EOS ({self.eos_id}): its index and tokens "
                                                 "disagree")
                if piece.max() >= self.vocab_size:
                    raise self._broken(document, f"holds token id {int(piece.max())}, outside the vocabulary of "
                                                 f"{self.vocab_size:,}")
                filled += take
                offset += take
                i += 1
