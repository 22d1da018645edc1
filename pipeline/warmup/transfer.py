"""A new vocabulary's embedding rows from the base model's (`warmup.init`).

`mean` starts from a plan: a special token takes the row of the old token with the same role, a new
token whose bytes are an old token copies that row (a shared token), and every other new token takes
the mean of the old rows of the pieces the *old* tokenizer cuts its bytes into (FVT, Gee et al.
2022, as in NorMistral-warm). `random` draws every row from a normal with the old matrix's standard
deviation, the baseline. A row is always a weighted sum of old rows, so the same plan serves the
untied LM head.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Optional

import torch
from tokenizers import Tokenizer

from pipeline.errors import StageError
from pipeline.tokenization.folder import special_ids
from pipeline.tokenization.surfaces import vocabulary_bytes

METHODS = ("mean", "random")


@dataclass(frozen=True)
class Row:
    """One new row: the weighted sum of old rows `old_ids` (weights summing to 1); `kind` says why."""

    kind: str
    old_ids: tuple[int, ...]
    weights: tuple[float, ...]


@dataclass
class TransferPlan:
    """Where each new row comes from; new ids without an entry are drawn at random."""

    rows: dict[int, Row] = field(default_factory=dict)

    def set(self, new_id: int, kind: str, old_ids: list[int]) -> None:
        self.rows[new_id] = Row(kind, tuple(old_ids), (1.0 / len(old_ids),) * len(old_ids))

    def ids_of(self, kind: str) -> list[int]:
        return sorted(new_id for new_id, row in self.rows.items() if row.kind == kind)

    def counts(self) -> dict[str, int]:
        return dict(Counter(row.kind for row in self.rows.values()))


def _pieces(surface: bytes, old: Tokenizer, old_by_bytes: dict[bytes, int]) -> list[int]:
    """The old ids that spell `surface`: the old tokenizer's encoding, or byte by byte for a part of
    a UTF-8 character (byte-level tokens can end inside one)."""
    try:
        text = surface.decode("utf-8")
    except UnicodeDecodeError:
        single = [old_by_bytes.get(bytes([byte])) for byte in surface]
        return [] if None in single else single
    return old.encode(text, add_special_tokens=False).ids


def plan_rows(
    new: Tokenizer, old: Tokenizer, new_roles: dict[str, int], old_roles: dict[str, Optional[int]]
) -> TransferPlan:
    """The `mean` plan: special rows by role, shared tokens `copied`, the rest `averaged` over their
    old pieces."""
    old_specials = special_ids(old)
    old_by_bytes: dict[bytes, int] = {}
    for old_id, surface in sorted(vocabulary_bytes(old, old_specials).items()):
        old_by_bytes.setdefault(surface, old_id)
    plan = TransferPlan()
    for role, new_id in new_roles.items():
        old_id = old_roles.get(role)
        if old_id is not None:
            plan.set(new_id, "special", [old_id])
    # The base's other special tokens that the new tokenizer keeps (an extended or kept base
    # tokenizer: SmolLM2's <repo_name>, <file_sep> ...): their rows, by content.
    old_special_by_content = {old.id_to_token(old_id): old_id for old_id in old_specials}
    new_specials = special_ids(new)
    for new_id in sorted(new_specials - set(plan.rows)):
        old_id = old_special_by_content.get(new.id_to_token(new_id))
        if old_id is not None:
            plan.set(new_id, "special", [old_id])
    for new_id, surface in vocabulary_bytes(new, new_specials).items():
        if new_id in plan.rows:
            continue
        if surface in old_by_bytes:
            plan.set(new_id, "copied", [old_by_bytes[surface]])
            continue
        pieces = [
            piece for piece in _pieces(surface, old, old_by_bytes) if piece not in old_specials
        ]
        if pieces:
            plan.set(new_id, "averaged", pieces)
    if not plan.ids_of("copied") and not plan.ids_of("averaged"):
        raise StageError(
            "The base model's tokenizer shares no token with the new one and cannot spell any new "
            "token "
            "(a different script, or a vocabulary without byte fallback), so no new row can be "
            "built "
            "from the base's embeddings. Use a base whose tokenizer covers the language's script, "
            "or "
            "set warmup.init=random to start the new embeddings from scratch on purpose."
        )
    return plan


def build_matrix(
    old_matrix: torch.Tensor,
    new_rows: int,
    plan: Optional[TransferPlan],
    method: str,
    generator: torch.Generator,
) -> tuple[torch.Tensor, dict[str, int]]:
    """The new matrix (new_rows x hidden), in float32 then the old dtype, and how many rows of each
    kind.

    Rows that `plan` has no entry for (and every row under `random`) are drawn at random.
    """
    if method not in METHODS:
        raise ValueError(
            f"warmup.init={method!r} is not a known initialisation; choose one of "
            f"{', '.join(METHODS)}"
        )
    old = old_matrix.detach().float()
    std = old.std().item()
    matrix = torch.randn(new_rows, old.shape[1], generator=generator) * std
    counts = Counter()
    if method != "random":
        planned = sorted(plan.rows)
        entries = [
            (position, old_id, weight)
            for position, new_id in enumerate(planned)
            for old_id, weight in zip(plan.rows[new_id].old_ids, plan.rows[new_id].weights)
        ]
        positions, old_ids, weights = zip(*entries)
        # One sparse (planned x old) product builds every weighted sum at once, for any vocabulary
        # size.
        mixing = torch.sparse_coo_tensor(
            torch.tensor([positions, old_ids]),
            torch.tensor(weights, dtype=torch.float32),
            (len(planned), old.shape[0]),
            check_invariants=True,
        )
        matrix[torch.tensor(planned)] = torch.sparse.mm(mixing, old)
        counts.update(plan.counts())
    counts["random"] = new_rows - sum(counts.values())
    return matrix.to(old_matrix.dtype), dict(counts)
