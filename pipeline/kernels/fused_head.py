"""The LM head and its cross-entropy fused: the (tokens, vocabulary) logits exist only a chunk of
rows at a time, on one device or over the vocabulary shards of tensor-parallel ranks.

For each chunk of rows: logits = rows @ weight.T in the hidden states' dtype; per row, the float32
log-sum-exp and the target's logit (over the shards: lse = m + log(sum_r exp(lse_r - m)) with m the
largest lse_r, target logits summed); the loss; and at once the gradient of the logits, (softmax -
one-hot) x the row's weight in the loss, written over the logits, from which the chunk's gradients
of the rows and of the weight follow by two matmuls. The backward only scales those by the incoming
gradient. Soft-capped logits (Gemma 2: c * tanh(logits / c)) are capped in the chunk, and their
gradient multiplied by the cap's slope, 1 - tanh^2, before the matmuls. Under tensor parallelism the rows' gradient is this shard's part: the caller sums it over
the ranks (the head's input goes through an all-reduce in the backward).

The per-row primitives come from the backend: the Triton kernels of cross_entropy.py on a GPU, their
PyTorch twins in reference.py elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

# Rows per chunk: the chunk's logits take chunk x vocab x 2 bytes (bf16), 256 MiB at vocab 131072
# with 1024 rows, while each chunk's matmuls stay large enough to run at full speed.
CHUNK_LOGIT_ELEMENTS = 1024 * 131072
REDUCTIONS = ("mean", "sum")


@dataclass(frozen=True)
class VocabShard:
    """This rank's rows of a head cut by vocabulary: ids `start` .. `start + weight rows - 1`, and
    the function that combines per-row statistics over the shards in place (`all_reduce(tensor,
    "max" | "sum")`).

    `size` is every rank's shard, padding rows included: the same on all ranks, whereas the weight a
    rank passes holds only its real rows (fewer on the last shard, none on a shard of padding only).
    The chunks follow `size`, so that every rank cuts the tokens alike and takes part in the same
    all-reduces."""

    start: int
    size: int
    all_reduce: Callable[[torch.Tensor, str], None]


@dataclass(frozen=True)
class RowPrimitives:
    # (logits (rows, cols), targets (rows,), vocab_start) -> (lse, target logit) per row, float32;
    # the target's logit is 0 where the columns do not hold it.
    statistics: Callable
    # (logits, out, targets, lse, grad_lse, grad_target, vocab_start): out = grad_lse * softmax +
    # grad_target * one-hot(target), row by row (out may be logits itself).
    softmax_gradient: Callable


def _combined(lse: torch.Tensor, target_logit: torch.Tensor, shard: Optional[VocabShard]):
    if shard is None:
        return lse, target_logit
    highest = lse.clone()
    shard.all_reduce(highest, "max")
    total = torch.exp(lse - highest)
    shard.all_reduce(total, "sum")
    target_logit = target_logit.clone()
    shard.all_reduce(target_logit, "sum")
    return highest + torch.log(total), target_logit


class _FusedHeadLoss(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx, hidden, weight, targets, ignore_index, chunk_size, reduction, shard, ops, softcap
    ):
        rows = hidden.reshape(-1, hidden.shape[-1])
        rows = rows if rows.stride(-1) == 1 else rows.contiguous()
        targets = targets.reshape(-1).contiguous()
        valid = targets != ignore_index
        # each row's weight in the loss: 1/n_valid for the mean over the rows that count, 1 for
        # their sum
        divisor = valid.sum().clamp(min=1).float() if reduction == "mean" else 1.0
        row_scale = valid.float() / divisor
        start = 0 if shard is None else shard.start
        grad_rows = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        loss = torch.zeros((), device=rows.device, dtype=torch.float32)
        for first in range(0, rows.shape[0], chunk_size):
            chunk = slice(first, first + chunk_size)
            logits = rows[chunk] @ weight.t()
            if softcap is not None:
                logits, slope = _soft_capped(logits, softcap)
            if logits.shape[1]:
                lse, target_logit = ops.statistics(logits, targets[chunk], start)
            # a shard of padding ids only: it adds nothing, yet takes part in every all-reduce
            else:
                lse = torch.full((logits.shape[0],), float("-inf"), device=logits.device)
                target_logit = torch.zeros_like(lse)
            lse, target_logit = _combined(lse, target_logit, shard)
            loss += torch.where(valid[chunk], lse - target_logit, 0.0).sum()
            if grad_rows is None and grad_weight is None:
                continue
            scale = row_scale[chunk]
            if logits.shape[1]:
                ops.softmax_gradient(logits, logits, targets[chunk], lse, scale, -scale, start)
                if softcap is not None:
                    logits.mul_(slope)
            if grad_rows is not None:
                torch.matmul(logits, weight, out=grad_rows[chunk])
            if grad_weight is not None:
                grad_weight.addmm_(logits.t(), rows[chunk])
        ctx.save_for_backward(grad_rows, grad_weight)
        ctx.hidden_shape = hidden.shape
        return loss / divisor

    @staticmethod
    def backward(ctx, grad_loss):
        grad_rows, grad_weight = ctx.saved_tensors
        grad_hidden = (
            (grad_rows * grad_loss).view(ctx.hidden_shape) if grad_rows is not None else None
        )
        return (
            grad_hidden,
            grad_weight * grad_loss if grad_weight is not None else None,
            *([None] * 7),
        )


def _soft_capped(logits: torch.Tensor, softcap: float) -> tuple[torch.Tensor, torch.Tensor]:
    """c * tanh(logits / c) in the logits' dtype and transformers' order of operations, and its
    slope 1 - tanh^2 (the gradient's factor)."""
    tanh = torch.tanh(logits / softcap)
    return tanh * softcap, 1 - tanh * tanh


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ops: RowPrimitives,
    ignore_index: int = -100,
    chunk_size: Optional[int] = None,
    reduction: str = "mean",
    shard: Optional[VocabShard] = None,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(
            f"linear_cross_entropy: hidden {tuple(hidden.shape)} needs one target per row; targets "
            f"are {tuple(targets.shape)}"
        )
    if reduction not in REDUCTIONS:
        raise ValueError(
            f"linear_cross_entropy: reduction={reduction!r}; allowed: {', '.join(REDUCTIONS)}"
        )
    head_rows = weight.shape[0]
    if shard is not None:
        if head_rows > shard.size:
            raise ValueError(
                f"linear_cross_entropy: this rank's head has {head_rows} rows, more than the "
                "vocabulary "
                f"shard's size {shard.size}"
            )
        head_rows = shard.size  # the same on every rank: so are the chunks
    chunk_size = chunk_size or max(1, CHUNK_LOGIT_ELEMENTS // max(1, head_rows))
    return _FusedHeadLoss.apply(
        hidden, weight, targets, ignore_index, chunk_size, reduction, shard, ops, softcap
    )
