"""Which source each sequence of the global stream comes from: an exact, even interleave by weight.

Source `s` gives `pass_tokens[s]` tokens per pass of the plan, so it gets that share of the sequences.
Its j-th sequence (j = 0, 1, ...) is due at the ideal time (j + 1/2) / pass_tokens[s]; the global stream
takes the sequences in order of that time (ties: the source listed first). Every prefix of the stream
then holds each source's share to within one sequence or so, every source finishes its pass at the
same point, and all of it is a pure function of the position: sequence n is found in O(sources x
log) time without any table over the stream (Megatron's blended dataset keeps one entry per sample).
Times are exact fractions, so the order is the same on every machine.
"""

from __future__ import annotations

import heapq
from fractions import Fraction
from typing import Sequence

import numpy as np


class Blend:
    def __init__(self, pass_tokens: Sequence[int]) -> None:
        if not pass_tokens or min(pass_tokens) <= 0:
            raise ValueError(f"every blended source needs tokens, got {list(pass_tokens)}")
        self.pass_tokens = [int(t) for t in pass_tokens]
        self.total = sum(self.pass_tokens)

    def _due(self, source: int, j: int) -> tuple[Fraction, int, int]:
        return Fraction(2 * j + 1, 2 * self.pass_tokens[source]), source, j

    def take(self, start: int, count: int) -> tuple[list[int], np.ndarray, np.ndarray]:
        """Sequences start .. start+count-1: (sequences each source gave before `start`, source of each,
        index of each within its source's stream)."""
        sources = len(self.pass_tokens)
        # Sequence j of source s lands at position <= (j + 1/2) * total / tokens_s + sources / 2, so every j
        # below this bound comes before `start`; the few after it are sorted out by the heap.
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
