"""Bits per byte of a model with its own tokenizer on a set of documents: fair across tokenizers.

The one definition used by the training stages' held-out scores and by `stage=evaluate`.

Each document is fed as `[start] + tokens`, where `start` is the token the model saw before
documents in training (EOS in packed data), so its first token is predicted too. Long documents are
cut into windows of at most `seq_len` inputs; the first window scores every token it predicts, each
later window moves on by `stride` tokens and scores only those, the rest of it being context. Every
token, hence every byte, is scored exactly once. The windows are packed into rows of `seq_len`
tokens with one segment id per window, so that a window attends only to itself (the same logits as
alone: ALiBi and RoPE depend on relative positions only); positions that are context or padding have
the label `IGNORE`.

Bits per byte = the summed negative log-likelihood in bits over the documents' UTF-8 bytes; token
perplexity (exp of the mean per-token NLL) is kept for reference, not comparison. Rows built here
also say which document each position belongs to, so that the NLL is summed per document too (what
a bootstrap over documents resamples: uncertainty.py).
"""

from __future__ import annotations

import math
from itertools import islice
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

import numpy as np
import torch

# The label of a position that is not scored (PyTorch's cross_entropy ignore_index).
IGNORE = -100


@dataclass(frozen=True)
class Window:
    document: int
    begin: int  # first input position
    end: int  # one past the last input position
    scored: int  # the window's last `scored` predictions count


def windows(document: int, targets: int, seq_len: int, stride: int) -> Iterator[Window]:
    """Windows over a document of `targets` predicted tokens (inputs are positions 0..targets-1)."""
    end = min(targets, seq_len)
    yield Window(document, 0, end, end)
    while end < targets:
        new_end = min(targets, end + stride)
        yield Window(document, max(0, new_end - seq_len), new_end, new_end - end)
        end = new_end


@dataclass
class ScoringRows:
    """Held-out documents as rows of `seq_len` tokens, ready for any forward pass."""

    inputs: np.ndarray  # (rows, seq_len) int64
    labels: np.ndarray  # (rows, seq_len) int64: the next token where scored, else IGNORE
    segment_ids: (
        np.ndarray
    )  # (rows, seq_len) int64: one id per window of the row, another for the padding
    bytes: int  # UTF-8 bytes of the documents
    tokens: int  # scored tokens (every token of every document)
    documents: int
    # (rows, seq_len) int64: the index of the text each position belongs to, -1 on padding; and
    # (texts,) int64: each text's UTF-8 bytes (0 for an empty text, which is not scored). None for
    # rows read back from a training stage's heldout.npz, which keeps the totals only.
    document_ids: Optional[np.ndarray] = None
    document_bytes: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return len(self.inputs)

    def padded_to(self, multiple: int) -> "ScoringRows":
        """The same rows and extra rows that score nothing, so that their number is a multiple of
        `multiple` (whole evaluation batches on every data-parallel replica)."""
        extra = -len(self) % multiple
        if not extra:
            return self
        seq_len = self.inputs.shape[1]

        def more(array: np.ndarray, value: int) -> np.ndarray:
            return np.concatenate([array, np.full((extra, seq_len), value, dtype=np.int64)])

        return ScoringRows(
            more(self.inputs, 0),
            more(self.labels, IGNORE),
            more(self.segment_ids, 0),
            self.bytes,
            self.tokens,
            self.documents,
            None if self.document_ids is None else more(self.document_ids, -1),
            self.document_bytes,
        )


# Documents tokenized at once (on all cores: tokenizers' encode_batch): enough to keep the cores
# busy, few enough that a capped set tokenizes little it does not score.
ENCODE_BATCH = 256


def _encoded(texts: Iterable[str], tokenizer) -> Iterator[tuple[str, object]]:
    """(text, its encoding) in order, tokenized ENCODE_BATCH documents at a time."""
    texts = iter(texts)
    while batch := list(islice(texts, ENCODE_BATCH)):
        yield from zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False))


def scoring_rows(
    texts: Iterable[str],
    tokenizer,
    start_id: int,
    seq_len: int,
    stride: int,
    max_tokens: Optional[int] = None,
) -> ScoringRows:
    """The documents' windows packed into rows in order, until `max_tokens` scored tokens: the
    document that crosses it is cut there, its bytes those of the text its kept tokens cover (a long
    first document, a law or a book, would otherwise make a held-out score of a few thousand tokens
    one of a hundred thousand). Empty documents (no token) are skipped."""
    rows_in, rows_label, rows_segment, rows_document = [], [], [], []
    row_in, row_label, row_segment, row_document = [], [], [], []
    document_bytes, tokens, documents = [], 0, 0

    def close_row() -> None:
        padding = seq_len - len(row_in)
        rows_in.append(row_in + [0] * padding)
        rows_label.append(row_label + [IGNORE] * padding)
        rows_segment.append(row_segment + [row_segment[-1] + 1] * padding)
        rows_document.append(row_document + [-1] * padding)
        for row in (row_in, row_label, row_segment, row_document):
            row.clear()

    for index, (text, encoding) in enumerate(_encoded(texts, tokenizer)):
        if max_tokens is not None and tokens >= max_tokens:
            break
        ids = encoding.ids
        if not ids:
            document_bytes.append(0)
            continue
        if max_tokens is not None and tokens + len(ids) > max_tokens:
            kept = max_tokens - tokens
            ids, text = ids[:kept], text[: encoding.offsets[kept - 1][1]]
        sequence = [start_id, *ids]
        document_bytes.append(len(text.encode("utf-8")))
        tokens += len(ids)
        documents += 1
        for window in windows(index, len(ids), seq_len, stride):
            size = window.end - window.begin
            if len(row_in) + size > seq_len:
                close_row()
            segment = row_segment[-1] + 1 if row_segment else 0
            row_in.extend(sequence[window.begin : window.end])
            targets = sequence[window.begin + 1 : window.end + 1]
            row_label.extend([IGNORE] * (size - window.scored) + targets[size - window.scored :])
            row_segment.extend([segment] * size)
            row_document.extend([index] * size)
    if row_in:
        close_row()

    def array(rows: list) -> np.ndarray:
        return np.asarray(rows, dtype=np.int64).reshape(-1, seq_len)

    return ScoringRows(
        array(rows_in),
        array(rows_label),
        array(rows_segment),
        sum(document_bytes),
        tokens,
        documents,
        array(rows_document),
        np.asarray(document_bytes, dtype=np.int64),
    )


def bits_per_byte(nats: float, utf8_bytes: int) -> float:
    if utf8_bytes <= 0:
        raise ValueError("bits per byte of no text: there is nothing to score")
    return nats / math.log(2) / utf8_bytes


@dataclass
class Score:
    nats: float
    tokens: int
    bytes: int
    documents: int
    # With score_rows' `first_added`: what the added tokens take.
    added: Optional[dict] = None
    # Where the rows say which text each position belongs to: each text's summed NLL (nats) and
    # UTF-8 bytes, in the texts' order (0 and 0 for an empty text).
    document_nats: Optional[np.ndarray] = None
    document_bytes: Optional[np.ndarray] = None

    @property
    def bits_per_byte(self) -> float:
        return bits_per_byte(self.nats, self.bytes)

    @property
    def token_perplexity(self) -> float:
        return math.exp(self.nats / self.tokens)

    def as_dict(self) -> dict:
        return {
            "bits_per_byte": self.bits_per_byte,
            "token_perplexity": self.token_perplexity,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "documents": self.documents,
            "tokens_per_byte": self.tokens / self.bytes,
        }


@torch.no_grad()
def score_rows(
    model: torch.nn.Module,
    rows: ScoringRows,
    batch_size: int,
    device: torch.device,
    progress=None,
    first_added: Optional[int] = None,
) -> Score:
    """The summed NLL (nats) of every scored token, `batch_size` rows per forward pass of a plain
    model, and per document where the rows say which is which; with `first_added`, for a tokenizer
    that extends its base's (every base token at its own id, the added ones from there), also what
    the added tokens take in the same pass, as `added`: {"first_added", "mass": their mean
    probability where a base token is the target, "base_targets", "added_targets": how many scored
    targets are of each kind}."""
    # Sums stay on the device: one transfer at the end, not one per row.
    nats, mass, base_targets, added_targets = (
        torch.zeros((), dtype=torch.float64, device=device) for _ in range(4)
    )
    per_document = (
        None
        if rows.document_bytes is None
        else torch.zeros(len(rows.document_bytes), dtype=torch.float64, device=device)
    )
    arrays = [rows.inputs, rows.labels, rows.segment_ids]
    if per_document is not None:
        arrays.append(rows.document_ids)
    for start in range(0, len(rows), batch_size):
        inputs, labels, segments, *documents = (
            torch.from_numpy(array[start : start + batch_size]).to(device) for array in arrays
        )
        logits = model(inputs, segments)
        # one row's log-softmax at a time: a large vocabulary stays in memory; over the scored
        # positions only (masking the others instead, to spare the host a wait per row, took 19%
        # longer on an H200 for SmolLM2: a window's context is half its positions)
        for row in range(len(inputs)):
            scored = labels[row] != IGNORE
            targets = labels[row][scored]
            log_probs = torch.log_softmax(logits[row][scored].float(), dim=-1)
            token_nats = -log_probs.gather(1, targets[:, None])[:, 0].double()
            nats += token_nats.sum()
            if per_document is not None:
                per_document.index_add_(0, documents[0][row][scored], token_nats)
            if first_added is not None:
                is_base = targets < first_added
                mass += log_probs[is_base, first_added:].logsumexp(dim=-1).exp().double().sum()
                base_targets += is_base.sum()
                added_targets += (~is_base).sum()
        if progress is not None:
            progress.update(int((rows.labels[start : start + batch_size] != IGNORE).sum()))
    added = None
    if first_added is not None:
        added = {
            "first_added": first_added,
            "mass": mass.item() / base_targets.item() if base_targets.item() else 0.0,
            "base_targets": int(base_targets.item()),
            "added_targets": int(added_targets.item()),
        }
    if per_document is None:
        return Score(nats.item(), rows.tokens, rows.bytes, rows.documents, added)
    # The total from the documents' sums, so that a bootstrap's point estimate is this very number.
    document_nats = per_document.cpu().numpy()
    return Score(
        float(np.sum(document_nats)),
        rows.tokens,
        rows.bytes,
        rows.documents,
        added,
        document_nats,
        rows.document_bytes,
    )


def score_documents(
    model: torch.nn.Module,
    tokenizer,
    texts: Iterable[str],
    start_id: int,
    seq_len: int,
    stride: int,
    batch_size: int,
    device: torch.device,
    progress=None,
    first_added: Optional[int] = None,
) -> Score:
    """Every token of every document scored once by a plain model (stage=evaluate), in total and
    per document; `first_added`: as score_rows."""
    rows = scoring_rows(texts, tokenizer, start_id, seq_len, stride)
    return score_rows(model, rows, batch_size, device, progress, first_added)
