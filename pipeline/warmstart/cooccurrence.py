"""Co-occurrence embeddings of token ids: what `align` compares the two vocabularies by.

GloVe factorises the log co-occurrence counts of a corpus; its count-based twin, used here, factorises their
positive pointwise mutual information (PPMI, with context counts smoothed to the power 0.75) by a truncated
SVD (Levy, Goldberg & Dagan 2015 show the two perform alike). It needs no training loop and, with its random
start seeded, gives the same vectors for the same text every time.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.warmstart.static_vectors import TokenVectors

# Tokens either side that count as context, each weighted 1/distance as in GloVe.
WINDOW = 5
DIM = 100
# Rarer tokens get no vector: a few co-occurrences give noise, not a meaning.
MIN_COUNT = 5
CONTEXT_SMOOTHING = 0.75
# Randomized SVD: extra directions sampled and power iterations (enough for the leading 100 of a PPMI matrix).
OVERSAMPLING = 10
ITERATIONS = 4


def token_counts(sequences: list[np.ndarray], vocab_size: int) -> np.ndarray:
    if not sequences:
        return np.zeros(vocab_size, dtype=np.int64)
    return np.bincount(np.concatenate(sequences), minlength=vocab_size)


def cooccurrence_vectors(sequences: list[np.ndarray], vocab_size: int, seed: int) -> TokenVectors:
    """Unit-length vectors for the ids seen at least MIN_COUNT times (fewer than DIM + 1 such ids: none)."""
    counts = token_counts(sequences, vocab_size)
    ids = np.flatnonzero(counts >= MIN_COUNT)
    if len(ids) <= DIM:
        return TokenVectors(np.zeros(0, dtype=np.int64), np.zeros((0, DIM), dtype=np.float32))
    compact = np.full(vocab_size, -1, dtype=np.int64)
    compact[ids] = np.arange(len(ids))
    tokens = compact[np.concatenate(sequences)]
    documents = np.repeat(np.arange(len(sequences)), [len(s) for s in sequences])
    keys, weights = [], []
    for distance in range(1, WINDOW + 1):
        left, right = tokens[:-distance], tokens[distance:]
        kept = (left >= 0) & (right >= 0) & (documents[:-distance] == documents[distance:])
        # Both directions: the counts are symmetric, so a token's row total is also its context total.
        keys += [left[kept] * len(ids) + right[kept], right[kept] * len(ids) + left[kept]]
        weights.append(np.full(2 * int(kept.sum()), 1.0 / distance))
    # A sort of the pair keys sums the weights of each pair (faster than torch's sparse coalesce on a CPU).
    pairs, where = np.unique(np.concatenate(keys), return_inverse=True)
    value = torch.from_numpy(np.bincount(where, weights=np.concatenate(weights)))
    row, column = torch.from_numpy(pairs // len(ids)), torch.from_numpy(pairs % len(ids))
    row_total = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, row, value)
    smoothed = row_total ** CONTEXT_SMOOTHING
    pmi = value.log() - row_total[row].log() - (smoothed[column] / smoothed.sum()).log()
    positive = pmi > 0
    ppmi = torch.sparse_coo_tensor(torch.stack([row[positive], column[positive]]), pmi[positive].float(),
                                   (len(ids), len(ids)), is_coalesced=True, check_invariants=True)
    vectors = symmetric_embedding(ppmi, DIM, torch.Generator().manual_seed(seed)).numpy()
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return TokenVectors(ids.astype(np.int64), vectors / np.maximum(norms, 1e-12))


def symmetric_embedding(matrix: torch.Tensor, dim: int, generator: torch.Generator) -> torch.Tensor:
    """U·sqrt(S) of a truncated SVD of a symmetric sparse matrix, by randomized subspace iteration (Halko et al.
    2011). For a symmetric matrix the singular vectors are eigenvectors, so only `matrix @ x` is needed:
    torch.svd_lowrank also multiplies by the transpose, several times slower with a sparse matrix on a CPU."""
    basis = torch.randn(matrix.shape[0], dim + OVERSAMPLING, generator=generator)
    for _ in range(ITERATIONS):
        basis, _ = torch.linalg.qr(matrix @ basis)
    eigenvalues, rotation = torch.linalg.eigh(basis.T @ (matrix @ basis))
    largest = eigenvalues.abs().argsort(descending=True)[:dim]
    return basis @ rotation[:, largest] * eigenvalues[largest].abs().sqrt()
