"""Bits per byte of a model with its own tokenizer on a set of documents: fair across tokenizers.

Each document is fed as `[start] + tokens`, where `start` is the token the model saw before documents in
training (EOS in packed data), so its first token is predicted too. Long documents are cut into windows of
at most `seq_len` inputs; the first window scores every token it predicts, each later window moves on by
`stride` tokens and scores only those, the rest of it being context. Every token, hence every byte, is
scored exactly once. Bits per byte = the summed negative log-likelihood in bits over the documents' UTF-8
bytes; token perplexity (exp of the mean per-token NLL) is kept for reference, not comparison.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Iterator

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Window:
    document: int
    begin: int   # first input position
    end: int     # one past the last input position
    scored: int  # the window's last `scored` predictions count


@dataclass
class Score:
    nats: float = 0.0
    tokens: int = 0
    bytes: int = 0
    documents: int = 0

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes if self.bytes else float("nan")

    @property
    def token_perplexity(self) -> float:
        return math.exp(self.nats / self.tokens) if self.tokens else float("nan")

    def as_dict(self) -> dict:
        return {"bits_per_byte": self.bits_per_byte, "token_perplexity": self.token_perplexity,
                "tokens": self.tokens, "bytes": self.bytes, "documents": self.documents,
                "tokens_per_byte": self.tokens / self.bytes if self.bytes else None}


def windows(document: int, targets: int, seq_len: int, stride: int) -> Iterator[Window]:
    """Windows over a document of `targets` predicted tokens (inputs are positions 0..targets-1)."""
    end = min(targets, seq_len)
    yield Window(document, 0, end, end)
    while end < targets:
        new_end = min(targets, end + stride)
        yield Window(document, max(0, new_end - seq_len), new_end, new_end - end)
        end = new_end


def score_documents(model: torch.nn.Module, tokenizer, texts: Iterable[str], start_id: int, seq_len: int,
                    stride: int, batch_size: int, device: torch.device, progress=None) -> Score:
    """Summed NLL over every token of every document, and the documents' bytes."""
    score, sequences, pending = Score(), [], []
    for text in texts:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        if not ids:
            continue
        sequences.append(torch.tensor([start_id, *ids], dtype=torch.long))
        score.bytes += len(text.encode("utf-8"))
        score.documents += 1
        score.tokens += len(ids)
        pending.extend(windows(len(sequences) - 1, len(ids), seq_len, stride))
        while len(pending) >= batch_size:
            score.nats += _batch_nats(model, sequences, pending[:batch_size], device)
            if progress is not None:
                progress.update(sum(w.scored for w in pending[:batch_size]))
            pending = pending[batch_size:]
            sequences = _keep_referenced(sequences, pending)
    if pending:
        score.nats += _batch_nats(model, sequences, pending, device)
        if progress is not None:
            progress.update(sum(w.scored for w in pending))
    return score


def _keep_referenced(sequences: list, pending: list[Window]) -> list:
    """Drop the token tensors of documents no pending window reads (indices stay valid)."""
    needed = {window.document for window in pending}
    return [seq if index in needed else None for index, seq in enumerate(sequences)]


@torch.no_grad()
def _batch_nats(model: torch.nn.Module, sequences: list, batch: list[Window], device: torch.device) -> float:
    # Right padding is harmless under causal attention: no scored position sees it.
    length = max(window.end - window.begin for window in batch)
    inputs = torch.zeros((len(batch), length), dtype=torch.long)
    targets = torch.zeros((len(batch), length), dtype=torch.long)
    scored = torch.zeros((len(batch), length), dtype=torch.bool)
    for row, window in enumerate(batch):
        tokens = sequences[window.document]
        size = window.end - window.begin
        inputs[row, :size] = tokens[window.begin:window.end]
        targets[row, :size] = tokens[window.begin + 1:window.end + 1]
        scored[row, size - window.scored:size] = True
    logits = model(inputs.to(device))
    nats = 0.0
    for row in range(len(batch)):  # one row's log-softmax at a time: a large vocabulary stays in memory
        log_probs = F.log_softmax(logits[row].float(), dim=-1)
        picked = log_probs.gather(-1, targets[row].to(device)[:, None])[:, 0]
        nats -= picked[scored[row].to(device)].double().sum().item()
    return nats
