"""Cross-entropy for large vocabularies in Triton: per-row statistics of a logits (shard) and the fused LM head.

Imported only when a call runs the Triton backend. Two kernels, one program per row, streaming the vocab in
`block_n`-wide chunks, all arithmetic in float32 on the logits' own dtype in memory (never a float32 copy):
- `_row_statistics`: log-sum-exp of the row and the logit of the row's target if this shard holds it
  (0 otherwise): what a vocab-parallel cross-entropy all-reduces across tensor-parallel ranks;
- `_softmax_gradient`: d/dlogits of g_lse * lse + g_target * target_logit = g_lse * softmax + g_target * onehot,
  written in place over the logits when asked.
`linear_cross_entropy` runs the LM-head matmul chunk by chunk of rows: only a (chunk, vocab) logits buffer
ever exists; each chunk's loss and its gradients with respect to hidden states and weight are computed in the
forward (the chunk's logits are gone by the backward), and the backward scales them by the incoming gradient.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import ROWWISE, current_arch

# Rows per chunk of the fused LM head: the chunk's logits take chunk x vocab x 2 bytes (bf16), 256 MiB at
# vocab 131072 with 1024 rows, while each chunk's matmuls stay large enough to run at full speed.
CHUNK_LOGIT_ELEMENTS = 1024 * 131072


@triton.jit
def _row_statistics(logits_ptr, targets_ptr, lse_ptr, target_logit_ptr, stride_row, n_cols, vocab_start,
                    BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    row_ptr = logits_ptr + row * stride_row
    # per-lane running maximum and sum; combined across lanes once at the end
    lane_max = tl.full([BLOCK], float("-inf"), dtype=tl.float32)
    lane_sum = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        x = tl.load(row_ptr + start + cols, mask=start + cols < n_cols, other=float("-inf")).to(tl.float32)
        new_max = tl.maximum(lane_max, x)
        safe_max = tl.where(new_max == float("-inf"), 0.0, new_max)  # lanes that saw only padding so far
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
def _softmax_gradient(logits_ptr, grad_ptr, targets_ptr, lse_ptr, grad_lse_ptr, grad_target_ptr, stride_row,
                      stride_grad_row, n_cols, vocab_start, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    lse = tl.load(lse_ptr + row)
    grad_lse = tl.load(grad_lse_ptr + row)
    grad_target = tl.load(grad_target_ptr + row)
    local = tl.load(targets_ptr + row).to(tl.int64) - vocab_start
    for start in range(0, n_cols, BLOCK):
        inside = start + cols < n_cols
        x = tl.load(logits_ptr + row * stride_row + start + cols, mask=inside, other=0.0).to(tl.float32)
        grad = tl.exp(x - lse) * grad_lse + tl.where(start + cols == local, grad_target, 0.0)
        tl.store(grad_ptr + row * stride_grad_row + start + cols, grad.to(grad_ptr.dtype.element_ty), mask=inside)


def _launch_statistics(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int):
    config = ROWWISE[current_arch(logits.device)]
    lse = torch.empty(logits.shape[0], device=logits.device, dtype=torch.float32)
    target_logit = torch.empty_like(lse)
    if logits.shape[0]:
        _row_statistics[(logits.shape[0],)](logits, targets, lse, target_logit, logits.stride(0), logits.shape[1],
                                            vocab_start, BLOCK=config.block_n, num_warps=config.num_warps)
    return lse, target_logit


def _launch_gradient(logits, grad, targets, lse, grad_lse, grad_target, vocab_start: int) -> None:
    config = ROWWISE[current_arch(logits.device)]
    if logits.shape[0]:
        _softmax_gradient[(logits.shape[0],)](logits, grad, targets, lse, grad_lse.contiguous(),
                                              grad_target.contiguous(), logits.stride(0), grad.stride(0),
                                              logits.shape[1], vocab_start, BLOCK=config.block_n,
                                              num_warps=config.num_warps)


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
        _launch_gradient(logits, grad, targets, lse, grad_lse.float(), grad_target.float(), ctx.vocab_start)
        return grad, None, None


def vocab_shard_statistics(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0):
    return _ShardStatistics.apply(logits, targets, vocab_start)


class _LinearCrossEntropy(torch.autograd.Function):

    @staticmethod
    def forward(ctx, hidden, weight, targets, ignore_index, chunk_size):
        rows = _row_major(hidden.reshape(-1, hidden.shape[-1]))
        targets = targets.reshape(-1).contiguous()
        valid = targets != ignore_index
        n_valid = valid.sum()
        # every token's gradient carries 1/n_valid (mean over the tokens that count); ignored tokens none
        row_scale = valid.float() / n_valid.clamp(min=1)
        needs_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grad_rows = torch.empty_like(rows) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        loss_sum = torch.zeros((), device=rows.device, dtype=torch.float32)
        for start in range(0, rows.shape[0], chunk_size):
            chunk = slice(start, start + chunk_size)
            logits = rows[chunk] @ weight.t()
            lse, target_logit = _launch_statistics(logits, targets[chunk], 0)
            loss_sum += torch.where(valid[chunk], lse - target_logit, 0.0).sum()
            if needs_grad:
                scale = row_scale[chunk]
                _launch_gradient(logits, logits, targets[chunk], lse, scale, -scale, 0)  # in place
                if grad_rows is not None:
                    torch.matmul(logits, weight, out=grad_rows[chunk])
                if grad_weight is not None:
                    grad_weight.addmm_(logits.t(), rows[chunk])
        ctx.save_for_backward(grad_rows, grad_weight)
        ctx.hidden_shape = hidden.shape
        return loss_sum / n_valid

    @staticmethod
    def backward(ctx, grad_loss):
        grad_rows, grad_weight = ctx.saved_tensors
        grad_hidden = (grad_rows * grad_loss).view(ctx.hidden_shape) if grad_rows is not None else None
        return grad_hidden, grad_weight * grad_loss if grad_weight is not None else None, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100,
                         chunk_size: Optional[int] = None) -> torch.Tensor:
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: hidden {tuple(hidden.shape)} needs one target per row; targets "
                         f"are {tuple(targets.shape)}")
    chunk_size = chunk_size or max(1, CHUNK_LOGIT_ELEMENTS // weight.shape[0])
    return _LinearCrossEntropy.apply(hidden, weight, targets, ignore_index, chunk_size)
