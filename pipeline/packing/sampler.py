"""The training data: a deterministic, resumable stream of fixed-length sequences from a pack folder.

    sampler = PackedSampler("work/nob/pack", seq_len=2048, global_batch_size=256, seed=1, rank=r, world=dp)
    for batch in sampler:                        # this rank's share of each global batch, endlessly
        inputs, labels = batch.tokens[:, :-1], batch.tokens[:, 1:]
        ...
        checkpoint["data"] = sampler.state_dict()   # small JSON-able dict: the next step and the consumption
    sampler.load_state_dict(checkpoint["data"])     # the identical stream from there, with any `world`

The stream. Each source of the plan is an endless stream of its documents (pipeline/packing/stream.py):
per pass of the plan each document is read as many times as its epochs say (floor or ceil for a
fractional part), in a seeded order, each ending with EOS. A source's stream is cut into consecutive
windows of `seq_len + 1` tokens that overlap by one (window j starts at token j * seq_len), so inputs
and labels are the window shifted by one and no token is skipped or padded: documents run across
window edges, as in Megatron's GPT dataset and torchtitan. The sources are interleaved window by window
in proportion to their tokens per pass (pipeline/packing/blend.py), so every global batch follows the
plan's weights and all sources end their pass together. Global batch `step` is sequences
`step * global_batch_size ...` of that stream; data-parallel rank r of `world` takes the r-th
contiguous slice. The stream depends only on the pack folder, `seed` and `seq_len` (the batch size only
groups it), never on `world`, so resuming with another data-parallel degree continues it exactly.

After a full pass the stream goes on with the next pass, in a new order (the pass number is part of the
shuffle seed), without a gap: the sequence that crosses the end holds the last tokens of one pass and
the first of the next. `passes(step)` says how far training has come.

Document boundaries: `segment_ids` numbers the documents within each sequence (0, 1, ...; a document
continued from the previous sequence is 0), for attention masks that keep to one document
(pipeline/kernels: `segment_ids`); `cu_seqlens()` gives the same as FlashAttention's varlen offsets.

State: `state_dict()` holds the next step, the sequences each source has given so far, and what the
stream depends on (seed, seq_len, global batch size, a fingerprint of packed.json); `load_state_dict`
refuses a state from another stream, naming what differs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

import numpy as np

from pipeline.packing.blend import Blend
from pipeline.packing.packed import PackedData
from pipeline.packing.shards import PackedDataError, repack_hint
from pipeline.packing.stream import SourceStream

STATE_VERSION = 1


class SamplerStateError(ValueError):
    """A saved sampler state that does not belong to this stream; the message says what differs."""


@dataclass
class Batch:
    """Sequences of `seq_len + 1` tokens (int64) with, per sequence, its source and its window in that source."""

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
            raise ValueError(f"cannot give rank {rank} of {world} an equal slice of {len(self)} sequences")
        size = len(self) // world
        part = slice(rank * size, (rank + 1) * size)
        return Batch(self.tokens[part], self.segment_ids[part], self.source[part], self.window[part], self.step)

    def cu_seqlens(self, row: int) -> np.ndarray:
        """Cumulative document lengths of one sequence: [0, end of document 0, ..., seq_len + 1] (int32)."""
        changes = np.flatnonzero(np.diff(self.segment_ids[row])) + 1
        return np.concatenate([[0], changes, [self.segment_ids.shape[1]]]).astype(np.int32)


class PackedSampler:
    def __init__(self, pack_dir, seq_len: int, global_batch_size: int, seed: int, rank: int = 0,
                 world: int = 1) -> None:
        if seq_len < 1 or global_batch_size < 1:
            raise ValueError(f"seq_len ({seq_len}) and global_batch_size ({global_batch_size}) must be >= 1")
        if not 0 <= rank < world or global_batch_size % world:
            raise ValueError(f"global_batch_size {global_batch_size} must split evenly over {world} data-parallel "
                             f"ranks, and rank ({rank}) must be in [0, {world})")
        self.data = PackedData(Path(pack_dir))
        if not self.data.sources:
            raise PackedDataError(f"{self.data.folder}: the plan reads no source (every source has 0 tokens). "
                                  f"{repack_hint(self.data.folder)}")
        self.seq_len, self.global_batch_size, self.seed = seq_len, global_batch_size, seed
        self.rank, self.world = rank, world
        self.names = [source.name for source in self.data.sources]
        self.streams = [SourceStream(source, i, seed, self.data.eos_id, self.data.vocab_size, self.data.folder)
                        for i, source in enumerate(self.data.sources)]
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
        """This rank's slice of each global batch from the current step on (only its own rows are read)."""
        local = self.global_batch_size // self.world
        while True:
            batch = self._sequences(self.step * self.global_batch_size + self.rank * local, local, self.step)
            self.step += 1
            yield batch

    def consumed(self, step: int) -> dict[str, int]:
        """Sequences each source has given before global batch `step`."""
        counts, _, _ = self.blend.take(step * self.global_batch_size, 0)
        return dict(zip(self.names, counts))

    def _identity(self) -> dict:
        return {"seed": self.seed, "seq_len": self.seq_len, "global_batch_size": self.global_batch_size,
                "packed": self.data.fingerprint}

    def state_dict(self) -> dict:
        return {"version": STATE_VERSION, **self._identity(), "step": self.step,
                "sequences": self.step * self.global_batch_size, "consumed": self.consumed(self.step)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from a saved state; fails, naming the differences, if it belongs to another stream."""
        if state.get("version") != STATE_VERSION:
            raise SamplerStateError(f"sampler state version {state.get('version')!r}; this code reads {STATE_VERSION}")
        differences = [f"{key}: saved {state.get(key)!r}, now {value!r}" for key, value in self._identity().items()
                       if state.get(key) != value]
        if differences:
            raise SamplerStateError(
                "the saved sampler state belongs to another data stream (" + "; ".join(differences) + "). Resume "
                f"with the seed, seq_len and global batch size of the run that saved it and the same pack folder "
                f"({self.data.folder}; `packed` is a fingerprint of its packed.json, which changes when the data is "
                "packed again), or start the data from step 0.")
        if state.get("consumed") != self.consumed(state["step"]):
            raise SamplerStateError(f"the saved per-source consumption {state.get('consumed')} does not match step "
                                    f"{state['step']} of this stream ({self.consumed(state['step'])}).")
        self.step = int(state["step"])
