"""Held-out bits per byte during training: the same text, cut the same way, before, during and after.

The held-out documents are tokenized with the model's tokenizer, each ends with EOS, and the stream is
cut into windows of `seq_len + 1` tokens overlapping by one, so every token but the first is predicted
once, within its own document (segment ids). Bits per byte = the summed negative log-likelihood of the
predicted tokens, in bits, over the UTF-8 bytes those tokens spell (EOS spells none): comparable across
tokenizers, unlike a per-token loss.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np
import torch
import torch.distributed as dist
from tokenizers import Tokenizer

from pipeline.warmstart.surfaces import vocabulary_bytes
from pipeline.warmstart.transfer import special_ids


@dataclass
class HeldoutWindows:
    tokens: np.ndarray        # (windows, seq_len + 1) int64
    segment_ids: np.ndarray   # (windows, seq_len + 1) int64
    target_bytes: int         # UTF-8 bytes spelled by the predicted tokens

    def __len__(self) -> int:
        return len(self.tokens)


def byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """Bytes each token id spells (0 for special tokens)."""
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token_id, surface in vocabulary_bytes(tokenizer, special_ids(tokenizer)).items():
        lengths[token_id] = len(surface)
    return lengths


def heldout_windows(texts: Iterable[str], tokenizer: Tokenizer, eos_id: int, seq_len: int, max_tokens: int,
                    multiple: int) -> HeldoutWindows:
    """Windows over the documents up to `max_tokens`, their number a multiple of `multiple` (whole
    evaluation batches), at least one batch when the text allows."""
    stream, segments, taken = [], [], 0
    for index, text in enumerate(texts):
        ids = tokenizer.encode(text, add_special_tokens=False).ids + [eos_id]
        stream.extend(ids)
        segments.extend([index] * len(ids))
        taken += len(ids)
        if taken >= max_tokens + 1 and taken >= multiple * seq_len + 1:
            break
    windows = (len(stream) - 1) // seq_len // multiple * multiple
    tokens = np.asarray(stream, dtype=np.int64)
    segment_ids = np.asarray(segments, dtype=np.int64)
    starts = np.arange(windows)[:, None] * seq_len + np.arange(seq_len + 1)[None, :]
    lengths = byte_lengths(tokenizer)
    window_tokens = tokens[starts] if windows else np.zeros((0, seq_len + 1), dtype=np.int64)
    target_bytes = int(lengths[window_tokens[:, 1:]].sum()) if windows else 0
    return HeldoutWindows(window_tokens, segment_ids[starts] if windows else window_tokens.copy(), target_bytes)


def micro_batches(tokens: np.ndarray, segment_ids: np.ndarray, micro: int, device: torch.device):
    """((input ids, segment ids), labels) for DeepSpeed's pipeline, `micro` sequences at a time."""
    for start in range(0, len(tokens), micro):
        window = torch.from_numpy(tokens[start:start + micro]).to(device, torch.int64)
        # int64: DeepSpeed's pipeline sends other integer types between stages as garbage.
        segments = torch.from_numpy(segment_ids[start:start + micro]).to(device, torch.int64)
        segments = segments - segments[:, :1]
        yield (window[:, :-1], segments[:, :-1]), window[:, 1:]


def heldout_bpb(engine, windows: HeldoutWindows, micro: int, dp_rank: int, dp_world: int) -> float:
    """Bits per byte over all held-out windows; each data-parallel replica scores its share."""
    share = len(windows) // dp_world
    part = slice(dp_rank * share, (dp_rank + 1) * share)
    tokens, segments = windows.tokens[part], windows.segment_ids[part]
    device = engine.engine.device
    count = len(tokens) // micro
    mean_loss = engine.engine.eval_batch(iter(micro_batches(tokens, segments, micro, device)),
                                         num_micro_batches=count)
    nats = torch.tensor(float(mean_loss) * count * micro * (tokens.shape[1] - 1), dtype=torch.float64)
    if dp_world > 1:
        dist.all_reduce(nats, group=engine.engine.grid.get_data_parallel_group())
    return nats.item() / math.log(2) / windows.target_bytes
