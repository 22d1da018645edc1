"""A new vocabulary's embedding rows from the base model's (`warmup.init`).

Every method but `random` starts from the same plan: a special token takes the row of the old token with
the same role, and a new token whose bytes are an old token copies that row (a shared token). They differ
in the other new tokens:
- `mean` (FVT, Gee et al. 2022, as in NorMistral-warm): the mean of the old rows of the pieces the *old*
  tokenizer cuts the token's bytes into;
- `focus` (FOCUS, Dobler & de Melo 2023; focus.py): a sparsemax-weighted sum of shared tokens' rows, weighted
  by how close static fastText vectors learnt on the target text put the new token to each shared one;
- `align` (TokAlign, Li et al. 2025; align.py): the row of the one old token whose co-occurrence embedding,
  learnt on the same text tokenized both ways, is nearest, both measured against the shared tokens;
- `random`: every row drawn from a normal with the old matrix's standard deviation, the baseline.
A new token that `focus` or `align` has no evidence for (too rare in the text) keeps its `mean` row. A row
is always a weighted sum of old rows, so the same plan serves the untied LM head.

Static token vectors learnt on the target text: what `focus` compares new tokens with shared ones by.

fastText skip-gram (Bojanowski et al. 2017) on the text tokenized with the *new* tokenizer, each token a
word: a token's vector comes from its contexts and, through character n-grams, from its spelling, so rare
tokens that look like common ones still land near them. Tokens are written in the byte-level alphabet (no
whitespace, whatever the tokenizer's own spelling), one document per line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np
import torch
from tokenizers import Tokenizer

from pipeline.errors import StageError
from pipeline.tokenization.folder import special_ids
from pipeline.tokenization.surfaces import byte_level_spelling, vocabulary_bytes

METHODS = ("mean", "random", "focus", "align")
# The methods that learn from text of the language (warmup.transfer_bytes of it).
TEXT_METHODS = ("focus", "align")


def needs_text(method: str) -> bool:
    return method in TEXT_METHODS


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

    def set(self, new_id: int, kind: str, old_ids: list[int], weights: Optional[list[float]] = None) -> None:
        weights = weights or [1.0 / len(old_ids)] * len(old_ids)
        self.rows[new_id] = Row(kind, tuple(old_ids), tuple(weights))

    def ids_of(self, kind: str) -> list[int]:
        return sorted(new_id for new_id, row in self.rows.items() if row.kind == kind)

    def counts(self) -> dict[str, int]:
        return dict(Counter(row.kind for row in self.rows.values()))


def _pieces(surface: bytes, old: Tokenizer, old_by_bytes: dict[bytes, int]) -> list[int]:
    """The old ids that spell `surface`: the old tokenizer's encoding, or byte by byte for a part of a
    UTF-8 character (byte-level tokens can end inside one)."""
    try:
        text = surface.decode("utf-8")
    except UnicodeDecodeError:
        single = [old_by_bytes.get(bytes([byte])) for byte in surface]
        return [] if None in single else single
    return old.encode(text, add_special_tokens=False).ids


def plan_rows(new: Tokenizer, old: Tokenizer, new_roles: dict[str, int],
              old_roles: dict[str, Optional[int]]) -> TransferPlan:
    """The `mean` plan: special rows by role, shared tokens `copied`, the rest `averaged` over their old pieces."""
    old_specials = special_ids(old)
    old_by_bytes: dict[bytes, int] = {}
    for old_id, surface in sorted(vocabulary_bytes(old, old_specials).items()):
        old_by_bytes.setdefault(surface, old_id)
    plan = TransferPlan()
    for role, new_id in new_roles.items():
        old_id = old_roles.get(role)
        if old_id is not None:
            plan.set(new_id, "special", [old_id])
    # The base's other special tokens that the new tokenizer keeps (an extended or kept base tokenizer: SmolLM2's
    # <repo_name>, <file_sep> ...): their rows, by content.
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
        pieces = [piece for piece in _pieces(surface, old, old_by_bytes) if piece not in old_specials]
        if pieces:
            plan.set(new_id, "averaged", pieces)
    if not plan.ids_of("copied") and not plan.ids_of("averaged"):
        raise StageError("The base model's tokenizer shares no token with the new one and cannot spell any new token "
                         "(a different script, or a vocabulary without byte fallback), so no new row can be built "
                         "from the base's embeddings. Use a base whose tokenizer covers the language's script, or "
                         "set warmup.init=random to start the new embeddings from scratch on purpose.")
    return plan


def build_matrix(old_matrix: torch.Tensor, new_rows: int, plan: Optional[TransferPlan], method: str,
                 generator: torch.Generator) -> tuple[torch.Tensor, dict[str, int]]:
    """The new matrix (new_rows x hidden), in float32 then the old dtype, and how many rows of each kind.

    Rows that `plan` has no entry for (and every row under `random`) are drawn at random.
    """
    if method not in METHODS:
        raise ValueError(f"warmup.init={method!r} is not a known initialisation; choose one of {', '.join(METHODS)}")
    old = old_matrix.detach().float()
    std = old.std().item()
    matrix = torch.randn(new_rows, old.shape[1], generator=generator) * std
    counts = Counter()
    if method != "random":
        planned = sorted(plan.rows)
        entries = [(position, old_id, weight) for position, new_id in enumerate(planned)
                   for old_id, weight in zip(plan.rows[new_id].old_ids, plan.rows[new_id].weights)]
        positions, old_ids, weights = zip(*entries)
        # One sparse (planned x old) product builds every weighted sum at once, for any vocabulary size.
        mixing = torch.sparse_coo_tensor(torch.tensor([positions, old_ids]), torch.tensor(weights, dtype=torch.float32),
                                         (len(planned), old.shape[0]), check_invariants=True)
        matrix[torch.tensor(planned)] = torch.sparse.mm(mixing, old)
        counts.update(plan.counts())
    counts["random"] = new_rows - sum(counts.values())
    return matrix.to(old_matrix.dtype), dict(counts)


# FOCUS trains 100-dimensional vectors for 3 epochs with a minimum count of 10 on gigabytes; the few megabytes
# that `warmup.transfer_bytes` allows want a lower minimum count.
DIM = 100
EPOCHS = 3
MIN_COUNT = 5
# Hash buckets of the character n-grams: fastText's default of 2 million costs 800 MB of vectors, far more
# than the n-grams of a vocabulary of 10^4 to 10^5 tokens need.
BUCKETS = 1 << 18


@dataclass
class TokenVectors:
    ids: np.ndarray      # the token ids that have a vector (seen at least MIN_COUNT times)
    vectors: np.ndarray  # (len(ids), dim), unit length


# fastText's skip-gram in a child process: the wheel's training leaves its large matrices uninitialised, which is
# harmless on the fresh (zeroed) pages of a new process but gives other vectors, or a NaN, in a process whose
# heap holds freed memory (measured: memory filled with garbage, freed, then training: "Encountered NaN").
# The child takes every allocation of 64 KiB or more from fresh pages (glibc's MALLOC_MMAP_THRESHOLD_).
_TRAIN_IN_CHILD = """
import sys, fasttext, numpy as np
corpus, out, dim, epoch, min_count, buckets = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
model = fasttext.train_unsupervised(corpus, model="skipgram", dim=dim, epoch=epoch, minCount=min_count,
                                    bucket=buckets, thread=1, verbose=0)
words = list(model.words)
vectors = np.stack([model.get_word_vector(w) for w in words]) if words else np.zeros((0, dim), np.float32)
np.savez(out, words=np.asarray(words, dtype=str), vectors=vectors)
"""


def _train_skipgram(corpus: Path, out: Path) -> tuple[list[str], np.ndarray]:
    """(words, vectors) of fastText skip-gram on `corpus`, trained in a child process (see above)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}
    done = subprocess.run([sys.executable, "-c", _TRAIN_IN_CHILD, str(corpus), str(out), str(DIM), str(EPOCHS),
                           str(MIN_COUNT), str(BUCKETS)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise StageError(f"fastText's training of the focus vectors failed (exit {done.returncode}) on {corpus}:\n"
                         f"{done.stderr[-2000:]}\nwarmup.init=mean needs no vectors.")
    with np.load(out, allow_pickle=False) as saved:
        words, vectors = saved["words"].tolist(), saved["vectors"]
    out.unlink()
    return words, vectors


def fasttext_vectors(sequences: list[np.ndarray], tokenizer: Tokenizer, scratch: Path) -> TokenVectors:
    """On one thread with fastText's fixed seed (its Python API takes none for unsupervised training), so the
    same text always gives the same vectors; Hogwild threads would not."""
    counts = np.bincount(np.concatenate(sequences), minlength=tokenizer.get_vocab_size(with_added_tokens=True)) \
        if sequences else np.zeros(0, dtype=np.int64)
    if not (counts >= MIN_COUNT).any():  # fastText refuses an empty vocabulary
        return TokenVectors(np.zeros(0, dtype=np.int64), np.zeros((0, DIM), dtype=np.float32))
    words = {token_id: byte_level_spelling(surface)
             for token_id, surface in vocabulary_bytes(tokenizer, special_ids(tokenizer)).items()}
    scratch.mkdir(parents=True, exist_ok=True)
    corpus = scratch / "tokens.txt"
    with corpus.open("w", encoding="utf-8") as handle:
        for sequence in sequences:
            handle.write(" ".join(words[token_id] for token_id in sequence.tolist() if token_id in words) + "\n")
    learnt, learnt_vectors = _train_skipgram(corpus, scratch / "vectors.npz")
    corpus.unlink()
    by_word = {word: token_id for token_id, word in words.items()}
    row_of = {word: row for row, word in enumerate(learnt)}
    ids = np.asarray(sorted(by_word[word] for word in learnt if word in by_word), dtype=np.int64)
    vectors = learnt_vectors[[row_of[words[token_id]] for token_id in ids.tolist()]] if len(ids) else \
        np.zeros((0, DIM), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return TokenVectors(ids, vectors / np.maximum(norms, 1e-12))
