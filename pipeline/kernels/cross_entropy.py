"""Cross-entropy for large vocabularies in Triton: per-row statistics of a logits (shard) and the
fused LM head.

Imported only when a call runs the Triton backend. Two kernels, one program per row, streaming the
vocab in `block_n`-wide chunks, all arithmetic in float32 on the logits' own dtype in memory (never
a float32 copy):
- `_row_statistics`: log-sum-exp of the row and the logit of the row's target if this shard holds it
  (0 otherwise): what a vocab-parallel cross-entropy all-reduces across tensor-parallel ranks;
- `_softmax_gradient`: d/dlogits of g_lse * lse + g_target * target_logit = g_lse * softmax +
  g_target * onehot, written in place over the logits when asked. They are the GPU primitives of the
  fused LM head and loss (fused_head.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pipeline.kernels.fused_head import RowPrimitives
from pipeline.kernels.launch_configs import ROWWISE, current_arch


@triton.jit
def _row_statistics(
    logits_ptr,
    targets_ptr,
    lse_ptr,
    target_logit_ptr,
    stride_row,
    n_cols,
    vocab_start,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row * stride_row
    # per-lane running maximum and sum; combined across lanes once at the end
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(
            tl.float32
        )
        new_max = tl.maximum(lane_max, x)
        safe_max = tl.where(
            new_max == float("-inf"), 0.0, new_max
        )  # lanes that saw only padding so far
        lane_sum = lane_sum * tl.exp(lane_max - safe_max) + tl.exp(x - safe_max)
        lane_max = new_max
    row_max = tl.max(lane_max, 0)
    lse = row_max + tl.log(tl.sum(lane_sum * tl.exp(lane_max - row_max), 0))
    tl.store(lse_ptr + row, lse)
    local = tl.load(targets_ptr + row).to(tl.int64) - vocab_start
    holds = (local >= 0) & (local < n_cols)
    target_logit = tl.load(row_ptr + tl.where(holds, local, 0)).to(tl.float32)
    tl.store(target_logit_ptr + row, tl.where(holds, target_logit, 0.0))


@triton.jit
def _softmax_gradient(
    logits_ptr,
    grad_ptr,
    targets_ptr,
    lse_ptr,
    grad_lse_ptr,
    grad_target_ptr,
    stride_row,
    stride_grad_row,
    n_cols,
    vocab_start,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    grad_lse = tl.load(grad_lse_ptr + row)
    grad_target = tl.load(grad_target_ptr + row)
    local = tl.load(targets_ptr + row).to(tl.int64) - vocab_start
    for start in range(0, n_cols, BLOCK):
        inside = start + cols < n_cols
        x = tl.load(logits_ptr + row * stride_row + start + cols, mask=inside, other=0.0).to(
            tl.float32
        )
        grad = tl.exp(x - lse) * grad_lse + tl.where(start + cols == local, grad_target, 0.0)
        tl.store(
            grad_ptr + row * stride_grad_row + start + cols,
            grad.to(grad_ptr.dtype.element_ty),
            mask=inside,
        )


def _launch_statistics(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int):
    config = ROWWISE[current_arch(logits.device)]
    lse = torch.empty(logits.shape[0], device=logits.device, dtype=torch.float32)
    target_logit = torch.empty_like(lse)
    if logits.shape[0]:
        _row_statistics[(logits.shape[0],)](
            logits,
            targets,
            lse,
            target_logit,
            logits.stride(0),
            logits.shape[1],
            vocab_start,
            BLOCK=config.block_n,
            num_warps=config.num_warps,
        )
    return lse, target_logit


def _launch_gradient(logits, grad, targets, lse, grad_lse, grad_target, vocab_start: int) -> None:
    config = ROWWISE[current_arch(logits.device)]
    if logits.shape[0]:
        _softmax_gradient[(logits.shape[0],)](
            logits,
            grad,
            targets,
            lse,
            grad_lse.contiguous(),
            grad_target.contiguous(),
            logits.stride(0),
            grad.stride(0),
            logits.shape[1],
            vocab_start,
            BLOCK=config.block_n,
            num_warps=config.num_warps,
        )


def _row_major(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


class _ShardStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, vocab_start):
        logits, targets = _row_major(logits), targets.contiguous()
        lse, target_logit = _launch_statistics(logits, targets, vocab_start)
        ctx.save_for_backward(logits, targets, lse)
        ctx.vocab_start = vocab_start
        return lse, target_logit

    @staticmethod
    def backward(ctx, grad_lse, grad_target):
        logits, targets, lse = ctx.saved_tensors
        grad_lse = grad_lse if grad_lse is not None else torch.zeros_like(lse)
        grad_target = grad_target if grad_target is not None else torch.zeros_like(lse)
        grad = torch.empty_like(logits)
        _launch_gradient(
            logits, grad, targets, lse, grad_lse.float(), grad_target.float(), ctx.vocab_start
        )
        return grad, None, None


def vocab_shard_statistics(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0):
    return _ShardStatistics.apply(logits, targets, vocab_start)


# The per-row primitives of the fused LM head (fused_head.py) on a GPU.
ROW_PRIMITIVES = RowPrimitives(statistics=_launch_statistics, softmax_gradient=_launch_gradient)
