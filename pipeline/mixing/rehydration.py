"""Rehydration (FineWeb-2): repeat each target document by the size of the duplicate cluster it
stood for.

Deduplication keeps one document per near-duplicate cluster and the clean stage records how many
documents that cluster had (`minhash_cluster_size`, 1 when unique). FineWeb-2 found that documents
duplicated more often are on average of higher quality, and upsamples them by a table of cluster
size -> weight (default 1 -> x1, 2 -> x2, 3-4 -> x3, 5-99 -> x5, 100+ -> x8). Here the weights are
scaled so that the byte-weighted mean repetition equals the target's planned epochs: the epoch cap
holds on average, and rehydration only moves repetitions from unique documents to duplicated ones.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from pipeline.mixing.planner import effective_tokens


def row_for(cluster_size: int, table: Sequence[tuple[int, float]]) -> int:
    """The index of the last row (sorted by min_cluster_size) whose min_cluster_size <=
    cluster_size."""
    return max(i for i, (min_size, _) in enumerate(table) if min_size <= cluster_size)


def weight_for(cluster_size: int, table: Sequence[tuple[int, float]]) -> float:
    """The table's weight for one document; its repetitions in the plan are this x
    `Rehydration.scale`."""
    return table[row_for(cluster_size, table)][1]


@dataclass(frozen=True)
class Bucket:
    """The documents whose cluster size lies in [min_cluster_size, max_cluster_size] (None: no upper
    end)."""

    min_cluster_size: int
    max_cluster_size: Optional[int]
    weight: float
    docs: int
    bytes: int
    # How many times each of these documents is seen: weight x the plan's scale.
    epochs: float

    @property
    def label(self) -> str:
        if self.max_cluster_size is None:
            return f"{self.min_cluster_size}+"
        if self.max_cluster_size == self.min_cluster_size:
            return str(self.min_cluster_size)
        return f"{self.min_cluster_size}-{self.max_cluster_size}"

    def effective_tokens(self, bytes_per_token: float) -> float:
        return effective_tokens(self.bytes / bytes_per_token, self.epochs)


@dataclass(frozen=True)
class Rehydration:
    buckets: tuple[Bucket, ...]
    # Byte-weighted mean of the table's weights over the target, and the factor that turns a weight
    # into epochs (target epochs / mean weight).
    mean_weight: float
    scale: float

    @property
    def mean_epochs(self) -> float:
        total = sum(b.bytes for b in self.buckets)
        return sum(b.epochs * b.bytes for b in self.buckets) / total

    def effective_tokens(self, bytes_per_token: float) -> float:
        """The scaling law applied to each cluster-size range with its own number of epochs."""
        return sum(b.effective_tokens(bytes_per_token) for b in self.buckets)


def rehydrate(
    by_cluster_size: Mapping[int, Sequence[int]], table: Sequence[tuple[int, float]], epochs: float
) -> Rehydration:
    """Group (documents, bytes) per cluster size into the table's ranges and scale the weights to
    `epochs`.

    `table` is [(min_cluster_size, weight), ...], ascending, starting at 1.
    """
    totals = [[0, 0] for _ in table]
    for size, (docs, size_bytes) in by_cluster_size.items():
        row = row_for(size, table)
        totals[row][0] += docs
        totals[row][1] += size_bytes
    all_bytes = sum(size_bytes for _, size_bytes in by_cluster_size.values())
    weighted = sum(
        weight_for(size, table) * size_bytes for size, (_, size_bytes) in by_cluster_size.items()
    )
    mean_weight = weighted / all_bytes
    scale = epochs / mean_weight
    buckets = tuple(
        Bucket(
            min_size,
            table[i + 1][0] - 1 if i + 1 < len(table) else None,
            weight,
            docs,
            size_bytes,
            weight * scale,
        )
        for i, ((min_size, weight), (docs, size_bytes)) in enumerate(zip(table, totals))
    )
    return Rehydration(buckets, mean_weight, scale)
