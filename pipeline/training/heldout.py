"""Held-out bits per byte during training: the same rows, scored the same way, before, during and
after.

The rows come from pipeline/evaluation/bits_per_byte.py, the definition `stage=evaluate` uses too:
every token of every held-out document scored once, in windows of the training sequence length. The
pipeline engine's loss is the summed NLL over the scored labels divided by all labels of a
micro-batch, so its mean over the micro-batches times their positions is the exact sum.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from pipeline.evaluation.bits_per_byte import ScoringRows, bits_per_byte


def save_rows(rows: ScoringRows, path: Path) -> None:
    np.savez(
        path,
        inputs=rows.inputs,
        labels=rows.labels,
        segment_ids=rows.segment_ids,
        counts=np.asarray([rows.bytes, rows.tokens, rows.documents], dtype=np.int64),
    )


def load_rows(path: Path) -> ScoringRows:
    stored = np.load(path, allow_pickle=False)
    utf8_bytes, tokens, documents = (int(value) for value in stored["counts"])
    return ScoringRows(
        stored["inputs"], stored["labels"], stored["segment_ids"], utf8_bytes, tokens, documents
    )


# Each function below copies all of its rows to the device at once, when the engine asks for the
# first micro-batch: a copy from pageable host memory waits until the GPU has run everything queued
# before it, and one per micro-batch left the GPU idle at every micro-batch while the host queued
# the next one's work (2-4 ms per micro-batch in a profiled H100 step of the 1.3B model).


def micro_batches(tokens: np.ndarray, segment_ids: np.ndarray, micro: int, device: torch.device):
    """((input ids, segment ids), labels) of training windows (seq_len + 1 tokens each), `micro` at
    a time."""
    # int64: DeepSpeed's pipeline sends other integer types between stages as garbage.
    windows = torch.from_numpy(tokens).to(device, torch.int64)
    segments = torch.from_numpy(segment_ids).to(device, torch.int64)
    segments = segments - segments[:, :1]
    for start in range(0, len(windows), micro):
        part = slice(start, start + micro)
        window, segment = windows[part], segments[part]
        yield (window[:, :-1], segment[:, :-1]), window[:, 1:]


def row_batches(rows: ScoringRows, part: slice, micro: int, device: torch.device):
    """((input ids, segment ids), labels) of the scoring rows in `part` (held-out text, or the
    in-loop tasks' TaskRows), `micro` at a time."""
    inputs, labels, segments = (
        torch.from_numpy(array[part]).to(device)
        for array in (rows.inputs, rows.labels, rows.segment_ids)
    )
    for start in range(0, len(inputs), micro):
        batch = slice(start, start + micro)
        yield (inputs[batch], segments[batch]), labels[batch]


def heldout_bpb(engine, rows: ScoringRows, micro: int, dp_rank: int, dp_world: int) -> float:
    """Bits per byte over all held-out rows (their number a multiple of micro x dp_world); each
    data-parallel replica scores its share."""
    share = len(rows) // dp_world
    part = slice(dp_rank * share, (dp_rank + 1) * share)
    count = share // micro
    mean_loss = engine.engine.eval_batch(
        iter(row_batches(rows, part, micro, engine.engine.device)), num_micro_batches=count
    )
    # on the engine's device: NCCL reduces no host tensor (gloo, on a CPU, does)
    nats = torch.tensor(
        float(mean_loss) * count * micro * rows.inputs.shape[1],
        dtype=torch.float64,
        device=engine.engine.device,
    )
    if dp_world > 1:
        dist.all_reduce(nats, group=engine.engine.grid.get_data_parallel_group())
    return bits_per_byte(nats.item(), rows.bytes)
