"""The training data: a deterministic, resumable stream of fixed-length sequences from a pack
folder.

    sampler = PackedSampler("work/nob/pack", seq_len=2048, global_batch_size=256, seed=1, rank=r, world=dp)
    for batch in sampler:                        # this rank's share of each global batch, endlessly
        inputs, labels = batch.tokens[:, :-1], batch.tokens[:, 1:]
        ...
        checkpoint["data"] = sampler.state_dict()   # small JSON-able dict: the next step and the consumption
    sampler.load_state_dict(checkpoint["data"])     # the identical stream from there, with any `world`

The stream. Each source of the plan is an endless stream of its documents (`SourceStream` below):
per pass of the plan each document is read as many times as its epochs say (floor or ceil for a
fractional part), in a seeded order, each ending with EOS. A source's stream is cut into consecutive
windows of `seq_len + 1` tokens that overlap by one (window j starts at token j * seq_len), so
inputs and labels are the window shifted by one and no token is skipped or padded: documents run
across window edges, as in Megatron's GPT dataset and torchtitan. The sources are interleaved window
by window in proportion to their tokens per pass (`Blend` below), so every global batch follows the
plan's weights and all sources end their pass together. Global batch `step` is sequences `step *
global_batch_size ...` of that stream; data-parallel rank r of `world` takes the r-th contiguous
slice. The stream depends only on the pack folder, `seed` and `seq_len` (the batch size only groups
it), never on `world`, so resuming with another data-parallel degree continues it exactly.

After a full pass the stream goes on with the next pass, in a new order (the pass number is part of
the shuffle seed), without a gap: the sequence that crosses the end holds the last tokens of one
pass and the first of the next. `passes(step)` says how far training has come.

Document boundaries: `segment_ids` numbers the documents within each sequence (0, 1, ...; a document
continued from the previous sequence is 0), for attention masks that keep to one document
(pipeline/kernels: `segment_ids`); `cu_seqlens()` gives the same as FlashAttention's varlen offsets.

State: `state_dict()` holds the next step, the sequences each source has given so far, and what the
stream depends on (seed, seq_len, global batch size, a fingerprint of packed.json);
`load_state_dict` refuses a state from another stream, naming what differs.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache
from pathlib import Path
from typing import Iterator, Optional, Sequence

import numpy as np

from pipeline.packing.packed import PackedData, PackedSource
from pipeline.packing.shards import PackedDataError, repack_hint

STATE_VERSION = 1


class SamplerStateError(ValueError):
    """A saved sampler state that does not belong to this stream; the message says what differs."""


@dataclass
class Batch:
    """Sequences of `seq_len + 1` tokens (int64) with, per sequence, its source and its window in
    that source."""

    tokens: np.ndarray
    segment_ids: np.ndarray
    source: np.ndarray
    window: np.ndarray
    step: int

    def __len__(self) -> int:
        return len(self.tokens)

    def rank_slice(self, rank: int, world: int) -> "Batch":
        """Data-parallel rank `rank`'s contiguous slice of a global batch."""
        if not 0 <= rank < world or len(self) % world:
            raise ValueError(
                f"cannot give rank {rank} of {world} an equal slice of {len(self)} sequences"
            )
        size = len(self) // world
        part = slice(rank * size, (rank + 1) * size)
        return Batch(
            self.tokens[part],
            self.segment_ids[part],
            self.source[part],
            self.window[part],
            self.step,
        )

    def cu_seqlens(self, row: int) -> np.ndarray:
        """Cumulative document lengths of one sequence: [0, end of document 0, ..., seq_len + 1]
        (int32)."""
        changes = np.flatnonzero(np.diff(self.segment_ids[row])) + 1
        return np.concatenate([[0], changes, [self.segment_ids.shape[1]]]).astype(np.int32)


class PackedSampler:
    def __init__(
        self,
        pack_dir,
        seq_len: int,
        global_batch_size: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if seq_len < 1 or global_batch_size < 1:
            raise ValueError(
                f"seq_len ({seq_len}) and global_batch_size ({global_batch_size}) must be >= 1"
            )
        if not 0 <= rank < world or global_batch_size % world:
            raise ValueError(
                f"global_batch_size {global_batch_size} must split evenly over {world} "
                "data-parallel "
                f"ranks, and rank ({rank}) must be in [0, {world})"
            )
        self.data = PackedData(Path(pack_dir))
        if not self.data.sources:
            raise PackedDataError(
                f"{self.data.folder}: the plan reads no source (every source has 0 tokens). "
                f"{repack_hint(self.data.folder)}"
            )
        self.seq_len, self.global_batch_size, self.seed = seq_len, global_batch_size, seed
        self.rank, self.world = rank, world
        self.names = [source.name for source in self.data.sources]
        self.streams = [
            SourceStream(source, i, seed, self.data.eos_id, self.data.vocab_size, self.data.folder)
            for i, source in enumerate(self.data.sources)
        ]
        self.blend = Blend([stream.pass_tokens for stream in self.streams])
        self.step = 0

    @property
    def pass_tokens(self) -> int:
        """Tokens of one pass of the plan, all sources together."""
        return self.blend.total

    def passes(self, step: Optional[int] = None) -> float:
        """Passes of the plan read before `step` (default: the next step)."""
        step = self.step if step is None else step
        return step * self.global_batch_size * self.seq_len / self.pass_tokens

    def batch(self, step: int) -> Batch:
        """Global batch `step`: `global_batch_size` sequences, the same whatever the rank and world."""
        return self._sequences(step * self.global_batch_size, self.global_batch_size, step)

    def _sequences(self, start: int, count: int, step: int) -> Batch:
        _, sources, windows = self.blend.take(start, count)
        width = self.seq_len + 1
        tokens = np.empty((count, width), np.int64)
        starts = np.zeros((count, width), bool)
        for row, (source, window) in enumerate(zip(sources, windows)):
            self.streams[source].read(int(window) * self.seq_len, width, tokens[row], starts[row])
        starts[:, 0] = False  # the first document of a sequence is 0 whether it begins there or not
        return Batch(tokens, np.cumsum(starts, axis=1, dtype=np.int32), sources, windows, step)

    def __iter__(self) -> Iterator[Batch]:
        """This rank's slice of each global batch from the current step on (only its own rows are
        read)."""
        local = self.global_batch_size // self.world
        while True:
            batch = self._sequences(
                self.step * self.global_batch_size + self.rank * local, local, self.step
            )
            self.step += 1
            yield batch

    def consumed(self, step: int) -> dict[str, int]:
        """Sequences each source has given before global batch `step`."""
        counts, _, _ = self.blend.take(step * self.global_batch_size, 0)
        return dict(zip(self.names, counts))

    def _identity(self) -> dict:
        return {
            "seed": self.seed,
            "seq_len": self.seq_len,
            "global_batch_size": self.global_batch_size,
            "packed": self.data.fingerprint,
        }

    def state_dict(self) -> dict:
        return {
            "version": STATE_VERSION,
            **self._identity(),
            "step": self.step,
            "sequences": self.step * self.global_batch_size,
            "consumed": self.consumed(self.step),
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state; fails, naming the differences, if it belongs to another
        stream."""
        if state.get("version") != STATE_VERSION:
            raise SamplerStateError(
                f"sampler state version {state.get('version')!r}; this code reads {STATE_VERSION}"
            )
        differences = [
            f"{key}: saved {state.get(key)!r}, now {value!r}"
            for key, value in self._identity().items()
            if state.get(key) != value
        ]
        if differences:
            raise SamplerStateError(
                "the saved sampler state belongs to another data stream ("
                + "; ".join(differences)
                + "). Resume "
                "with the seed, seq_len and global batch size of the run that saved it and the "
                "same pack folder "
                f"({self.data.folder}; `packed` is a fingerprint of its packed.json, which changes "
                "when the data is "
                "packed again), or start the data from step 0."
            )
        if state.get("consumed") != self.consumed(state["step"]):
            raise SamplerStateError(
                f"the saved per-source consumption {state.get('consumed')} does not match step "
                f"{state['step']} of this stream ({self.consumed(state['step'])})."
            )
        self.step = int(state["step"])


class Blend:
    """Which source each sequence of the global stream comes from: an exact, even interleave by
    weight.

    Source `s` gives `pass_tokens[s]` tokens per pass of the plan, so it gets that share of the
    sequences. Its j-th sequence (j = 0, 1, ...) is due at the ideal time (j + 1/2) /
    pass_tokens[s]; the global stream takes the sequences in order of that time (ties: the source
    listed first). Every prefix of the stream then holds each source's share to within one sequence
    or so, every source finishes its pass at the same point, and all of it is a pure function of the
    position: sequence n is found in O(sources x log) time without any table over the stream
    (Megatron's blended dataset keeps one entry per sample). Times are exact fractions, so the order
    is the same on every machine.
    """

    def __init__(self, pass_tokens: Sequence[int]) -> None:
        if not pass_tokens or min(pass_tokens) <= 0:
            raise ValueError(f"every blended source needs tokens, got {list(pass_tokens)}")
        self.pass_tokens = [int(t) for t in pass_tokens]
        self.total = sum(self.pass_tokens)

    def _due(self, source: int, j: int) -> tuple[Fraction, int, int]:
        return Fraction(2 * j + 1, 2 * self.pass_tokens[source]), source, j

    def take(self, start: int, count: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Sequences start .. start+count-1: (sequences each source gave before `start`, source of
        each, index of each within its source's stream)."""
        sources = len(self.pass_tokens)
        # Sequence j of source s lands at position <= (j + 1/2) * total / tokens_s + sources / 2, so
        # every j below this bound comes before `start`; the few after it are sorted out by the
        # heap.
        below = [max(0, (start - sources) * tokens // self.total) for tokens in self.pass_tokens]
        heap = [self._due(s, j) for s, j in enumerate(below)]
        heapq.heapify(heap)
        taken = list(below)
        for _ in range(start - sum(below)):
            _, s, j = heapq.heappushpop(heap, self._due(heap[0][1], heap[0][2] + 1))
            taken[s] += 1
        consumed = list(taken)
        picked_source, picked_index = np.empty(count, np.int64), np.empty(count, np.int64)
        for i in range(count):
            _, s, j = heapq.heappushpop(heap, self._due(heap[0][1], heap[0][2] + 1))
            picked_source[i], picked_index[i] = s, j
        return consumed, picked_source, picked_index


class SourceStream:
    """One source's endless token stream: its documents in a seeded order, pass after pass.

    A pass of the plan reads document d `repeats[d]` times (pipeline/packing/packed.py). It is laid
    out as epochs: epoch k holds the documents read more than k times, in a seeded random order that
    differs per source, pass and epoch, so a document never repeats within an epoch and the extra
    reads of a fractional epoch come last. The passes follow one another without a gap: a position
    in the stream is a pass (position // pass tokens), an epoch and a document found by binary
    search. Only the order of the epoch being read (and, across an epoch's end, of the next) is held
    in memory, 12 bytes per document (its ids and cumulative lengths), so the stream costs the same
    for one epoch or forty.
    """

    def __init__(
        self, source: PackedSource, position: int, seed: int, eos_id: int, vocab_size: int, pack_dir
    ) -> None:
        """`position`: the source's place in packed.json, part of its shuffle seed."""
        self.source, self.seed, self.position, self.pack_dir = source, seed, position, pack_dir
        self.eos_id, self.vocab_size = eos_id, vocab_size
        self.pass_tokens = source.pass_tokens
        epochs = int(source.repeats.max())
        # Where each epoch starts within a pass, in tokens.
        self.epoch_starts = np.concatenate(
            [
                [0],
                np.cumsum(
                    [int(source.document_tokens[source.repeats > k].sum()) for k in range(epochs)]
                ),
            ]
        )
        self._epoch = lru_cache(maxsize=2)(
            self._order
        )  # the epoch being read and, across a boundary, the next

    def _order(self, pass_index: int, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The documents of one epoch in their shuffled order, and where each ends (tokens into the
        epoch)."""
        members = np.flatnonzero(self.source.repeats > epoch)
        dtype = np.int32 if self.source.documents < 2**31 else np.int64
        order = (
            np.random.default_rng([self.seed, self.position, pass_index, epoch])
            .permutation(members)
            .astype(dtype)
        )
        return order, np.cumsum(self.source.document_tokens[order])

    def _broken(self, document: int, what: str) -> PackedDataError:
        shard = self.source.shards[int(self.source.document_shard[document])].path
        return PackedDataError(
            f"source `{self.source.name}`, document {document} in {shard} {what}. "
            f"{repack_hint(self.pack_dir)}"
        )

    def read(self, start: int, length: int, tokens: np.ndarray, starts: np.ndarray) -> None:
        """Stream tokens start .. start+length-1 into `tokens`; `starts` marks where a document
        begins."""
        filled = 0
        starts[:] = False
        while filled < length:
            pass_index, offset = divmod(start + filled, self.pass_tokens)
            epoch = int(np.searchsorted(self.epoch_starts, offset, side="right")) - 1
            offset -= int(self.epoch_starts[epoch])
            order, ends = self._epoch(pass_index, epoch)
            i = int(np.searchsorted(ends, offset, side="right"))
            while filled < length and i < len(
                order
            ):  # documents of this epoch, one after the other
                document = int(order[i])
                size = int(self.source.document_tokens[document])
                within = offset - (int(ends[i]) - size)
                take = min(size - within, length - filled)
                piece = self.source.document(document)[within : within + take]
                tokens[filled : filled + take] = piece
                starts[filled] = within == 0
                if within + take == size and piece[-1] != self.eos_id:
                    raise self._broken(
                        document,
                        f"does not end with EOS ({self.eos_id}): its index and tokens disagree",
                    )
                if piece.max() >= self.vocab_size:
                    raise self._broken(
                        document,
                        f"holds token id {int(piece.max())}, outside the vocabulary of "
                        f"{self.vocab_size:,}",
                    )
                filled += take
                offset += take
                i += 1
