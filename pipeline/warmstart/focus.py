"""`focus`: a new token's row as a sparse, similarity-weighted sum of the rows of shared tokens (FOCUS,
Dobler & de Melo 2023, arXiv 2305.14481).

Static vectors learnt on the target text (transfer.py) tell which shared tokens a new token is used
and spelt like. Sparsemax turns its cosine similarities to them into weights that are zero for all but the
closest few, so a new row mixes a handful of old rows instead of blurring many. New tokens without a vector
(rarer than the vectors' minimum count) keep their `mean` row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from pipeline.warmstart.transfer import TransferPlan, fasttext_vectors

# New tokens compared with the shared ones at a time: bounds the similarity block's memory for large vocabularies.
CHUNK = 1024


def sparsemax(scores: torch.Tensor) -> torch.Tensor:
    """Each row's Euclidean projection onto the probability simplex (Martins & Astudillo 2016): weights that
    sum to 1 with exact zeros below a threshold."""
    ordered, _ = scores.sort(dim=-1, descending=True)
    below = ordered.cumsum(dim=-1) - 1
    rank = torch.arange(1, scores.shape[-1] + 1, dtype=scores.dtype)
    support = (ordered - below / rank > 0).sum(dim=-1, keepdim=True)
    threshold = below.gather(-1, support - 1) / support
    return (scores - threshold).clamp(min=0)


def focus_rows(plan: TransferPlan, new_tokenizer: Tokenizer, sequences: list[np.ndarray], scratch: Path) -> dict:
    """Rewrite the plan's `averaged` (and unplanned) rows that have a vector as `focus` rows; returns what
    the method saw, for the warmup report."""
    found = fasttext_vectors(sequences, new_tokenizer, scratch)
    position = {token_id: row for row, token_id in enumerate(found.ids.tolist())}
    shared = [new_id for new_id in plan.ids_of("copied") if new_id in position]
    targets = [new_id for new_id in position if new_id not in plan.rows or plan.rows[new_id].kind == "averaged"]
    summary = {"text_tokens": int(sum(len(s) for s in sequences)), "tokens_with_vectors": len(found.ids),
               "shared_with_vectors": len(shared)}
    if not shared or not targets:
        summary["fallback"] = ("no shared token has a vector: every new row stays `mean`" if not shared
                               else "no new token has a vector: every new row stays `mean`")
        return summary
    vectors = torch.from_numpy(found.vectors).float()
    anchors = vectors[[position[new_id] for new_id in shared]]
    anchor_old_ids = [plan.rows[new_id].old_ids[0] for new_id in shared]
    support_sizes = []
    for start in range(0, len(targets), CHUNK):
        chunk = targets[start:start + CHUNK]
        weights = sparsemax(vectors[[position[new_id] for new_id in chunk]] @ anchors.T)
        for new_id, row in zip(chunk, weights):
            chosen = row.nonzero().flatten().tolist()
            plan.set(new_id, "focus", [anchor_old_ids[i] for i in chosen], row[chosen].tolist())
            support_sizes.append(len(chosen))
    summary["mean_shared_tokens_per_row"] = round(float(np.mean(support_sizes)), 2)
    return summary
