"""RoPE in Triton on q and k where one projection left them side by side with v, forward and
backward.

Imported only when a call runs the Triton backend. The projection's output (batch, seq, (heads + 2
kv_heads) x head_dim) is read once and written once, q and k rotated and v copied, in the same
layout, so the attention takes the three together (`stacked_flash_attention`, whose gradient is
again one tensor of that layout) and the backward is one more pass that rotates the gradients of q
and k back.
In PyTorch the same takes a negation, a concatenation, two products and a sum on each of q and k,
their backward, and a concatenation of the three gradients. Dimension i pairs with i + head_dim / 2
(the rotate-half convention of Llama, Mistral, Qwen and the others that the model takes); the
arithmetic is float32 and rounded once.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import ROPE_BLOCK_HEADS, ROPE_WARPS


@triton.jit
def _rotate_stacked(
    src_ptr,
    dst_ptr,
    cos_ptr,
    sin_ptr,
    stride_row,
    stride_table,
    seq_len,
    rotated_heads,
    heads,
    HALF: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    BLOCK_HEADS: tl.constexpr,
    TRANSPOSE: tl.constexpr,
):
    """One token's BLOCK_HEADS heads: the first `rotated_heads` of the row (q's and k's) rotated by
    their position's cos and sin (with TRANSPOSE, by the rotation's transpose: the gradient; cos and
    sin scaled by YaRN or LongRoPE make it no inverse), the rest (v's) copied."""
    row = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1) * BLOCK_HEADS + tl.arange(0, BLOCK_HEADS)[:, None]
    col = tl.arange(0, BLOCK_HALF)[None, :]
    inside = (head < heads) & (col < HALF)
    first = head * (2 * HALF) + col
    src = src_ptr + row * stride_row
    x1 = tl.load(src + first, mask=inside, other=0.0).to(tl.float32)
    x2 = tl.load(src + first + HALF, mask=inside, other=0.0).to(tl.float32)
    table = (row % seq_len) * stride_table + col
    cos1 = tl.load(cos_ptr + table, mask=col < HALF, other=0.0).to(tl.float32)
    cos2 = tl.load(cos_ptr + table + HALF, mask=col < HALF, other=0.0).to(tl.float32)
    sin1 = tl.load(sin_ptr + table, mask=col < HALF, other=0.0).to(tl.float32)
    sin2 = tl.load(sin_ptr + table + HALF, mask=col < HALF, other=0.0).to(tl.float32)
    if TRANSPOSE:
        y1 = x1 * cos1 + x2 * sin2
        y2 = x2 * cos2 - x1 * sin1
    else:
        y1 = x1 * cos1 - x2 * sin1
        y2 = x2 * cos2 + x1 * sin2
    rotated = head < rotated_heads
    y1 = tl.where(rotated, y1, x1)
    y2 = tl.where(rotated, y2, x2)
    dst = dst_ptr + row * stride_row
    tl.store(dst + first, y1.to(dst_ptr.dtype.element_ty), mask=inside)
    tl.store(dst + first + HALF, y2.to(dst_ptr.dtype.element_ty), mask=inside)


def _launch(
    src: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rotated_heads: int,
    head_dim: int,
    transpose: bool,
) -> torch.Tensor:
    src = src.contiguous()
    batch, seq, width = src.shape
    heads = width // head_dim
    dst = torch.empty_like(src)
    half = head_dim // 2
    grid = (batch * seq, triton.cdiv(heads, ROPE_BLOCK_HEADS))
    _rotate_stacked[grid](
        src,
        dst,
        cos,
        sin,
        width,
        cos.stride(0),
        seq,
        rotated_heads,
        heads,
        HALF=half,
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_HEADS=ROPE_BLOCK_HEADS,
        TRANSPOSE=transpose,
        num_warps=ROPE_WARPS,
    )
    return dst


class _RotateStacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, rotated_heads, head_dim):
        ctx.save_for_backward(cos, sin)
        ctx.rotated_heads, ctx.head_dim = rotated_heads, head_dim
        return _launch(qkv, cos, sin, rotated_heads, head_dim, transpose=False)

    @staticmethod
    def backward(ctx, grad):
        cos, sin = ctx.saved_tensors
        return (
            _launch(grad, cos, sin, ctx.rotated_heads, ctx.head_dim, transpose=True),
            None,
            None,
            None,
            None,
        )


def rotate_stacked_qkv(
    qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """qkv (batch, seq, (heads + 2 kv_heads) x head_dim) with q and k rotated by RoPE at positions
    0 .. seq - 1 (cos and sin (seq, head_dim), contiguous rows), v unchanged."""
    kv_heads = (qkv.shape[-1] // head_dim - heads) // 2
    return _RotateStacked.apply(qkv, cos.contiguous(), sin.contiguous(), heads + kv_heads, head_dim)
