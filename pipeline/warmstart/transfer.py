"""A new vocabulary's embedding rows from the base model's (`warmup.init`).

`mean` (FVT, Gee et al. 2022, as in NorMistral-warm): a new token whose bytes are an old token copies
that row; any other new token starts as the mean of the old rows of the pieces the *old* tokenizer cuts
its bytes into; special tokens take the row of the old token with the same role. `random` draws every
row from a normal with the old matrix's standard deviation, the baseline the mean start is measured
against. The same mapping serves the untied LM head.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
from tokenizers import Tokenizer

from pipeline.tokenization.folder import special_ids
from pipeline.tokenization.surfaces import vocabulary_bytes

METHODS = ("mean", "random")


@dataclass
class RowSources:
    """For each new id, the old ids its row is built from (one id: a copy; several: their mean)."""

    old_ids: dict[int, list[int]] = field(default_factory=dict)
    kinds: dict[int, str] = field(default_factory=dict)

    def counts(self) -> dict[str, int]:
        return dict(Counter(self.kinds.values()))


def _pieces(surface: bytes, old: Tokenizer, old_by_bytes: dict[bytes, int]) -> list[int]:
    """The old ids that spell `surface`: the old tokenizer's encoding, or byte by byte for a part of a
    UTF-8 character (byte-level tokens can end inside one)."""
    try:
        text = surface.decode("utf-8")
    except UnicodeDecodeError:
        single = [old_by_bytes.get(bytes([byte])) for byte in surface]
        return [] if None in single else single
    return old.encode(text, add_special_tokens=False).ids


def plan_rows(new: Tokenizer, old: Tokenizer, new_roles: dict[str, int], old_roles: dict[str, Optional[int]]) -> RowSources:
    """Where each row of the new matrix comes from under `mean`."""
    old_specials = special_ids(old)
    old_by_bytes: dict[bytes, int] = {}
    for old_id, surface in sorted(vocabulary_bytes(old, old_specials).items()):
        old_by_bytes.setdefault(surface, old_id)
    sources = RowSources()
    for role, new_id in new_roles.items():
        old_id = old_roles.get(role)
        if old_id is not None:
            sources.old_ids[new_id], sources.kinds[new_id] = [old_id], "special"
    for new_id, surface in vocabulary_bytes(new, special_ids(new)).items():
        if new_id in sources.kinds:
            continue
        if surface in old_by_bytes:
            sources.old_ids[new_id], sources.kinds[new_id] = [old_by_bytes[surface]], "copied"
            continue
        pieces = [piece for piece in _pieces(surface, old, old_by_bytes) if piece not in old_specials]
        if pieces:
            sources.old_ids[new_id], sources.kinds[new_id] = pieces, "averaged"
    return sources


def build_matrix(old_matrix: torch.Tensor, new_rows: int, sources: Optional[RowSources], method: str,
                 generator: torch.Generator) -> tuple[torch.Tensor, dict[str, int]]:
    """The new matrix (new_rows x hidden), in float32 then the old dtype, and how each row was made.

    Rows that `sources` has no origin for (and every row under `random`) are drawn at random.
    """
    if method not in METHODS:
        raise ValueError(f"warmup.init={method!r} is not a known initialisation; choose one of {', '.join(METHODS)}")
    old = old_matrix.detach().float()
    std = old.std().item()
    matrix = torch.randn(new_rows, old.shape[1], generator=generator) * std
    counts = Counter()
    if method == "mean":
        for new_id, old_ids in sources.old_ids.items():
            matrix[new_id] = old[old_ids].mean(dim=0)
        counts.update(sources.counts())
    counts["random"] = new_rows - sum(counts.values())
    return matrix.to(old_matrix.dtype), dict(counts)
