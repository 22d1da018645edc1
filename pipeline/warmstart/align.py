"""`align`: each new token takes the row of the one old token used most like it in the same text
(TokAlign, Li, Zhang & Zong 2025, arXiv 2506.03523).

The target text is tokenized both ways and each vocabulary gets co-occurrence embeddings of its own
(below). The two spaces are learnt apart, so they are compared through the tokens both
vocabularies share: a token's *relative* representation is its cosine similarity to each anchor (shared
tokens frequent in both tokenizations), which means the same on both sides. A new token is mapped to the
old token with the nearest relative representation, by CSLS (Conneau et al. 2018) rather than plain cosine,
so that a few "hub" tokens close to everything do not take most of the new tokens. Every tenth shared token
is kept out of the anchors to measure the alignment: the share of those mapped back onto themselves is
reported. New tokens rarer than the embeddings' minimum count keep their `mean` row.

TokAlign uses 300 anchors and cosine, on corpora of billions of tokens; on the few megabytes of a low-resource
language, CSLS and every frequent shared token as an anchor recovered several times more held-out shared
tokens (the work that introduced this module reports the figures).

Co-occurrence embeddings of token ids: what `align` compares the two vocabularies by.

GloVe factorises the log co-occurrence counts of a corpus; its count-based twin, used here, factorises their
positive pointwise mutual information (PPMI, with context counts smoothed to the power 0.75) by a truncated
SVD (Levy, Goldberg & Dagan 2015 show the two perform alike). It needs no training loop and, with its random
start seeded, gives the same vectors for the same text every time.
"""

from __future__ import annotations

import numpy as np
import torch

from pipeline.warmstart.transfer import TokenVectors, TransferPlan

# Anchors: at most this many (the relative representations' width), the most frequent shared tokens first.
MAX_ANCHORS = 2000
# Fewer anchors than this describe too little of either space to align them.
MIN_ANCHORS = 20
# Every HELD_OUT-th shared token measures the alignment instead of anchoring it.
HELD_OUT = 10
# CSLS neighbourhood: a candidate's hubness is its mean similarity to its CSLS_K nearest queries.
CSLS_K = 10
# Rows compared at a time: bounds the similarity blocks' memory for large vocabularies.
CHUNK = 1024


def _relative(found: TokenVectors, ids: list[int], anchor_ids: list[int]) -> torch.Tensor:
    """Unit-length cosine similarities of `ids`' vectors to the anchors' vectors, in one space."""
    position = {token_id: row for row, token_id in enumerate(found.ids.tolist())}
    vectors = torch.from_numpy(found.vectors).float()
    similarities = vectors[[position[i] for i in ids]] @ vectors[[position[i] for i in anchor_ids]].T
    return torch.nn.functional.normalize(similarities, dim=1)


def _mean_top(queries: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """For each key, the mean of its CSLS_K highest similarities to the queries."""
    top = torch.cat([queries[start:start + CHUNK] @ keys.T for start in range(0, len(queries), CHUNK)]) \
        .topk(min(CSLS_K, len(queries)), dim=0).values
    return top.mean(dim=0)


def csls_nearest(queries: torch.Tensor, candidates: torch.Tensor) -> torch.Tensor:
    """Index of each query's nearest candidate by CSLS: 2 cos - (candidate's hubness) - (query's hubness);
    the query's term does not change its own argmax, so it is left out."""
    hubness = _mean_top(queries, candidates)
    return torch.cat([(2 * queries[start:start + CHUNK] @ candidates.T - hubness).argmax(dim=1)
                      for start in range(0, len(queries), CHUNK)])


def align_rows(plan: TransferPlan, new_sequences: list[np.ndarray], old_sequences: list[np.ndarray],
               new_vocab: int, old_vocab: int, old_specials: set[int], seed: int) -> dict:
    """Rewrite the plan's `averaged` (and unplanned) rows of tokens frequent enough as `aligned` rows; returns
    what the method saw, for the warmup report."""
    new_found = cooccurrence_vectors(new_sequences, new_vocab, seed)
    old_found = cooccurrence_vectors(old_sequences, old_vocab, seed)
    new_has, old_has = set(new_found.ids.tolist()), set(old_found.ids.tolist())
    summary = {"text_tokens_new": int(sum(len(s) for s in new_sequences)),
               "text_tokens_old": int(sum(len(s) for s in old_sequences)),
               "new_tokens_with_vectors": len(new_has), "old_tokens_with_vectors": len(old_has)}
    # Shared tokens seen often enough in both tokenizations, most frequent first (the best-estimated vectors).
    new_counts, old_counts = token_counts(new_sequences, new_vocab), token_counts(old_sequences, old_vocab)
    pairs = [(new_id, plan.rows[new_id].old_ids[0]) for new_id in plan.ids_of("copied")
             if new_id in new_has and plan.rows[new_id].old_ids[0] in old_has]
    pairs.sort(key=lambda pair: (-min(new_counts[pair[0]], old_counts[pair[1]]), pair[0]))
    held_out = pairs[HELD_OUT - 1::HELD_OUT]
    anchors = [pair for index, pair in enumerate(pairs) if index % HELD_OUT != HELD_OUT - 1][:MAX_ANCHORS]
    targets = [new_id for new_id in sorted(new_has) if new_id not in plan.rows or plan.rows[new_id].kind == "averaged"]
    summary["anchors"] = len(anchors)
    if len(anchors) < MIN_ANCHORS or not targets:
        summary["fallback"] = (f"only {len(anchors)} shared tokens are frequent in both tokenizations (align needs "
                               f"{MIN_ANCHORS}): every new row stays `mean`" if len(anchors) < MIN_ANCHORS
                               else "no new token is frequent enough: every new row stays `mean`")
        return summary
    candidates = sorted(old_has - old_specials)
    old_relative = _relative(old_found, candidates, [old_id for _, old_id in anchors])
    queries = targets + [new_id for new_id, _ in held_out]
    nearest = csls_nearest(_relative(new_found, queries, [new_id for new_id, _ in anchors]), old_relative).tolist()
    for new_id, index in zip(targets, nearest):
        plan.set(new_id, "aligned", [candidates[index]])
    recovered = [candidates[index] == old_id for (_, old_id), index in zip(held_out, nearest[len(targets):])]
    summary["held_out_shared_tokens"] = len(recovered)
    if recovered:
        summary["held_out_shared_recovered"] = round(float(np.mean(recovered)), 4)
    return summary


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
