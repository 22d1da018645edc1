"""Fused RMSNorm and LayerNorm in Triton, forward and backward, over the last axis.

Imported only when a call runs the Triton backend. One program normalises one row held whole in
registers (hidden sizes up to 65536), statistics in float32; the forward keeps only the per-row
1/std (and mean) for the backward. The backward recomputes the normalised row, writes dx, and sums
the weight (and bias) gradients of a contiguous chunk of rows in float32 registers; the chunks' partial
sums are added on the host in a fixed order, so the result is deterministic (no atomics).
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import ROWWISE, current_arch

MAX_HIDDEN = 65536


@triton.jit
def _norm_forward(x_ptr, weight_ptr, bias_ptr, y_ptr, mean_ptr, rstd_ptr, stride_x, stride_y, n_cols, eps,
                  BLOCK: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0).to(tl.float32)
    if RMS:
        centred = x
    else:
        mean = tl.sum(x, 0) / n_cols
        centred = tl.where(inside, x - mean, 0.0)
        tl.store(mean_ptr + row, mean)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, 0) / n_cols + eps)
    tl.store(rstd_ptr + row, rstd)
    y = centred * rstd * tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * stride_y + cols, y.to(y_ptr.dtype.element_ty), mask=inside)


@triton.jit
def _norm_backward(x_ptr, weight_ptr, dy_ptr, dx_ptr, mean_ptr, rstd_ptr, dweight_ptr, dbias_ptr,
                   stride_x, stride_dy, stride_dx, n_rows, n_cols, rows_per_program,
                   BLOCK: tl.constexpr, RMS: tl.constexpr, HAS_BIAS: tl.constexpr):
    chunk = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    dweight = tl.zeros([BLOCK], dtype=tl.float32)
    dbias = tl.zeros([BLOCK], dtype=tl.float32)
    first = chunk.to(tl.int64) * rows_per_program
    x_row = x_ptr + first * stride_x
    dy_row = dy_ptr + first * stride_dy
    dx_row = dx_ptr + first * stride_dx
    for row in range(first, tl.minimum(first + rows_per_program, n_rows)):
        x = tl.load(x_row + cols, mask=inside, other=0.0).to(tl.float32)
        dy = tl.load(dy_row + cols, mask=inside, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        if RMS:
            normed = x * rstd
        else:
            normed = tl.where(inside, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        dnormed = dy * weight
        # d/dx of (x - mean) * rstd: rstd * (dn - mean(dn * n) * n [- mean(dn) for LayerNorm])
        dx = dnormed - normed * (tl.sum(dnormed * normed, 0) / n_cols)
        if not RMS:
            dx -= tl.sum(dnormed, 0) / n_cols
        tl.store(dx_row + cols, (dx * rstd).to(dx_ptr.dtype.element_ty), mask=inside)
        dweight += dy * normed
        if HAS_BIAS:
            dbias += dy
        x_row += stride_x
        dy_row += stride_dy
        dx_row += stride_dx
    tl.store(dweight_ptr + chunk * n_cols + cols, dweight, mask=inside)
    if HAS_BIAS:
        tl.store(dbias_ptr + chunk * n_cols + cols, dbias, mask=inside)


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _block(n_cols: int, where: str) -> int:
    if n_cols > MAX_HIDDEN:
        raise ValueError(f"{where}: hidden size {n_cols} > {MAX_HIDDEN} is more than the Triton kernel holds in "
                         f"registers; use the reference backend (set_backend('reference'))")
    return triton.next_power_of_2(n_cols)


class _Norm(torch.autograd.Function):

    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        rows = _rows(x)
        n_rows, n_cols = rows.shape
        block = _block(n_cols, "rms_norm" if rms else "layer_norm")
        config = ROWWISE[current_arch(x.device)]
        y = torch.empty_like(rows)
        rstd = torch.empty(n_rows, device=x.device, dtype=torch.float32)
        mean = rstd if rms else torch.empty_like(rstd)  # RMSNorm never touches it
        _norm_forward[(n_rows,)](rows, weight, bias if bias is not None else weight, y, mean, rstd, rows.stride(0),
                                 y.stride(0), n_cols, eps, BLOCK=block, RMS=rms, HAS_BIAS=bias is not None,
                                 num_warps=config.num_warps)
        ctx.save_for_backward(rows, weight, mean, rstd)
        ctx.settings = (rms, bias is not None, x.shape)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy):
        rows, weight, mean, rstd = ctx.saved_tensors
        rms, has_bias, shape = ctx.settings
        n_rows, n_cols = rows.shape
        dy = _rows(dy)
        config = ROWWISE[current_arch(rows.device)]
        # enough chunks to fill the GPU, each long enough that its partial sums are cheap to add afterwards
        programs = max(1, min(n_rows, 4 * torch.cuda.get_device_properties(rows.device).multi_processor_count
                              if rows.is_cuda else 8))
        rows_per_program = triton.cdiv(n_rows, programs)
        programs = triton.cdiv(n_rows, rows_per_program)
        dx = torch.empty_like(rows)
        dweight = torch.empty(programs, n_cols, device=rows.device, dtype=torch.float32)
        dbias = torch.empty_like(dweight) if has_bias else dweight
        _norm_backward[(programs,)](rows, weight, dy, dx, mean, rstd, dweight, dbias, rows.stride(0), dy.stride(0),
                                    dx.stride(0), n_rows, n_cols, rows_per_program, BLOCK=_block(n_cols, "norm"),
                                    RMS=rms, HAS_BIAS=has_bias, num_warps=config.num_warps)
        grad_weight = dweight.sum(0).to(weight.dtype)
        grad_bias = dbias.sum(0).to(weight.dtype) if has_bias else None
        return dx.view(shape), grad_weight, grad_bias, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _Norm.apply(x, weight, None, eps, True)


def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float) -> torch.Tensor:
    return _Norm.apply(x, weight, bias, eps, False)
