"""How many times each document is read in one pass of the plan: the index that replaces copies.

A source planned for `e` epochs reads each document floor(e) times, and a share of its documents once
more so that the extra reads add up to frac(e) of its tokens (to within one document). Which documents
get the extra read is a seeded choice (`pack.seed`) over the whole source, made by tokens so that long
and short documents are alike. With rehydration (FineWeb-2) each target document has its own epochs,
its duplicate-cluster weight x the plan's scale (pipeline/mixing/rehydration.py, recomputed here with
exact tokens); the same rule applies within each group of documents that share a number of epochs.

The result, one uint16 per document, is stored as `repeats.npy` beside the source's shards and read
by the sampler: repetition costs two bytes per document, never a copy.
"""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from pipeline.mixing.rehydration import Rehydration, rehydrate

REPEATS_FILE = "repeats.npy"
REPEATS_DTYPE = np.dtype("<u2")
# Epochs within this of a whole number are that number (float rounding of tokens / unique tokens).
_WHOLE = 1e-9


def rehydrated_epochs(cluster_sizes: np.ndarray, document_tokens: np.ndarray, table: Sequence[tuple[int, float]],
                      epochs: float) -> tuple[np.ndarray, Rehydration]:
    """Each document's epochs: its cluster size's weight, scaled so that the token-weighted mean is `epochs`."""
    by_cluster_size: dict[int, list[int]] = {}
    for size in np.unique(cluster_sizes):
        members = cluster_sizes == size
        by_cluster_size[int(size)] = [int(members.sum()), int(document_tokens[members].sum())]
    rehydration = rehydrate(by_cluster_size, table, epochs)
    min_sizes = np.array([size for size, _ in table])
    weights = np.array([weight for _, weight in table])
    rows = np.searchsorted(min_sizes, cluster_sizes, side="right") - 1
    return weights[rows] * rehydration.scale, rehydration


def repetitions(document_tokens: np.ndarray, document_epochs: np.ndarray, seed: int, source: str) -> np.ndarray:
    """Reads per document: floor(epochs), plus one for a seeded share of the documents of each fractional group."""
    whole = np.floor(document_epochs + _WHOLE)
    if whole.max(initial=0) >= np.iinfo(REPEATS_DTYPE).max:
        raise ValueError(f"source `{source}`: {whole.max():g} epochs exceed the {np.iinfo(REPEATS_DTYPE).max} "
                         "that the repeats index holds")
    repeats = whole.astype(REPEATS_DTYPE)
    fraction = np.where(document_epochs - whole > _WHOLE, document_epochs - whole, 0.0)
    rng = np.random.default_rng([seed, zlib.crc32(source.encode("utf-8"))])
    groups, group_of = np.unique(document_epochs, return_inverse=True)
    for group in range(len(groups)):
        members = np.flatnonzero(group_of == group)
        part = fraction[members[0]]
        if part == 0:
            continue
        order = rng.permutation(members)
        reached = np.cumsum(document_tokens[order])
        wanted = part * reached[-1]
        # The prefix whose tokens come closest to the wanted share.
        count = int(np.searchsorted(reached, wanted))
        below = reached[count - 1] if count else 0
        if count < len(order) and reached[count] - wanted < wanted - below:
            count += 1
        repeats[order[:count]] += 1
    return repeats
