"""Fused RMSNorm and LayerNorm in Triton, forward and backward, over the last axis.

Imported only when a call runs the Triton backend. One program normalises one row held whole in
registers (hidden sizes up to 65536), statistics in float32; the forward keeps only the per-row
1/std (and mean) for the backward. With an addend (`add_rms_norm`, `add_layer_norm`: a block's
residual stream plus its attention output, or plus the previous block's MLP output), the forward
first adds the two rows, writes the sum and normalises it, and the backward adds the sum's gradient
from its other uses into dx: the additions that the model and autograd would run as two more passes
over the activations happen in the norm's own. The backward recomputes the normalised row, writes
dx, and sums the weight (and bias) gradients of a contiguous chunk of rows in float32 registers; the
chunks' partial sums are added on the host in a fixed order, so the result is deterministic (no
atomics). Its warps and programs come from the launch table (NORM_BACKWARD): few enough registers
per lane that two programs share a multiprocessor, and each program requests the next row before it
reduces the current one.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import NORM_BACKWARD, ROWWISE, current_arch

MAX_HIDDEN = 65536


@triton.jit
def _norm_forward(
    x_ptr,
    addend_ptr,
    total_ptr,
    weight_ptr,
    bias_ptr,
    y_ptr,
    mean_ptr,
    rstd_ptr,
    stride_x,
    stride_addend,
    stride_total,
    stride_y,
    n_cols,
    eps,
    BLOCK: tl.constexpr,
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    x = tl.load(x_ptr + row * stride_x + cols, mask=inside, other=0.0)
    if HAS_ADDEND:
        # Rounded to the activations' dtype before the statistics, as a separate addition would
        # store it.
        addend = tl.load(addend_ptr + row * stride_addend + cols, mask=inside, other=0.0)
        x = (x.to(tl.float32) + addend.to(tl.float32)).to(total_ptr.dtype.element_ty)
        tl.store(total_ptr + row * stride_total + cols, x, mask=inside)
    x = x.to(tl.float32)
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
def _add_pairs(a0, b0, a1, b1):
    return a0 + a1, b0 + b1


@triton.jit
def _norm_backward(
    x_ptr,
    weight_ptr,
    dy_ptr,
    dtotal_ptr,
    dx_ptr,
    mean_ptr,
    rstd_ptr,
    dweight_ptr,
    dbias_ptr,
    stride_x,
    stride_dy,
    stride_dtotal,
    stride_dx,
    n_rows,
    n_cols,
    rows_per_program,
    BLOCK: tl.constexpr,
    RMS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_ADDEND: tl.constexpr,
):
    """dx of the rows [chunk's first, end) and the chunk's weight (and bias) gradient sums; with an
    addend, x is the forward's sum and dtotal the sum's gradient from its other uses, added to dx
    (both summands get that dx)."""
    chunk = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    inside = cols < n_cols
    weight = tl.load(weight_ptr + cols, mask=inside, other=0.0).to(tl.float32)
    dweight = tl.zeros([BLOCK], dtype=tl.float32)
    dbias = tl.zeros([BLOCK], dtype=tl.float32)
    first = chunk.to(tl.int64) * rows_per_program
    end = tl.minimum(first + rows_per_program, n_rows)
    # The next row's x and dy are requested before this row's reductions (block-wide barriers) run,
    # so that their memory latency overlaps the arithmetic: a row loop without it waits on every
    # load.
    x_next = tl.load(x_ptr + first * stride_x + cols, mask=inside & (first < end), other=0.0)
    dy_next = tl.load(dy_ptr + first * stride_dy + cols, mask=inside & (first < end), other=0.0)
    for row in range(first, end):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        following = row + 1
        x_next = tl.load(
            x_ptr + following * stride_x + cols, mask=inside & (following < end), other=0.0
        )
        dy_next = tl.load(
            dy_ptr + following * stride_dy + cols, mask=inside & (following < end), other=0.0
        )
        rstd = tl.load(rstd_ptr + row)
        if RMS:
            normed = x * rstd
        else:
            normed = tl.where(inside, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
        dnormed = dy * weight
        # The parameters' sums first: dy is then dead across the reduction (with an addend's
        # gradient loaded after it, the 8192-wide backward spilled otherwise)
        dweight += dy * normed
        if HAS_BIAS:
            dbias += dy
        # d/dx of (x - mean) * rstd: rstd * (dn - mean(dn * n) * n [- mean(dn) for LayerNorm]);
        # LayerNorm's two sums share one reduction (one round of barriers)
        if RMS:
            dx = dnormed - normed * (tl.sum(dnormed * normed, 0) / n_cols)
        else:
            dot, total = tl.reduce((dnormed * normed, dnormed), 0, _add_pairs)
            dx = dnormed - normed * (dot / n_cols) - total / n_cols
        dx = dx * rstd
        if HAS_ADDEND:
            dx += tl.load(dtotal_ptr + row * stride_dtotal + cols, mask=inside, other=0.0).to(
                tl.float32
            )
        tl.store(dx_ptr + row * stride_dx + cols, dx.to(dx_ptr.dtype.element_ty), mask=inside)
    tl.store(dweight_ptr + chunk * n_cols + cols, dweight, mask=inside)
    if HAS_BIAS:
        tl.store(dbias_ptr + chunk * n_cols + cols, dbias, mask=inside)


@functools.lru_cache(maxsize=None)
def _multiprocessors(device: torch.device) -> int:
    return (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 4
    )


def _rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(-1) == 1 else rows.contiguous()


def _block(n_cols: int, where: str) -> int:
    if n_cols > MAX_HIDDEN:
        raise ValueError(
            f"{where}: hidden size {n_cols} > {MAX_HIDDEN} is more than the Triton kernel holds in "
            f"registers; use the reference backend (set_backend('reference'))"
        )
    return triton.next_power_of_2(n_cols)


def _forward(ctx, x, addend, weight, bias, eps, rms):
    """The norm of x (or of x + addend) through the kernel; saves what the backward needs on `ctx`.
    Returns the normalised rows (and the sum), shaped like x."""
    rows = _rows(x)
    n_rows, n_cols = rows.shape
    block = _block(n_cols, "rms_norm" if rms else "layer_norm")
    config = ROWWISE[current_arch(x.device)]
    y = torch.empty_like(rows)
    has_addend = addend is not None
    addend_rows = _rows(addend) if has_addend else rows
    total = torch.empty_like(rows) if has_addend else rows
    # one allocation for both statistics: the host's per-call work is a visible share of a norm's
    # time
    statistics = torch.empty((1 if rms else 2, n_rows), device=x.device, dtype=torch.float32)
    rstd, mean = statistics[0], statistics[-1]  # RMSNorm never touches mean
    _norm_forward[(n_rows,)](
        rows,
        addend_rows,
        total,
        weight,
        bias if bias is not None else weight,
        y,
        mean,
        rstd,
        rows.stride(0),
        addend_rows.stride(0),
        total.stride(0),
        y.stride(0),
        n_cols,
        eps,
        BLOCK=block,
        RMS=rms,
        HAS_BIAS=bias is not None,
        HAS_ADDEND=has_addend,
        num_warps=config.num_warps,
    )
    ctx.save_for_backward(total, weight, mean, rstd)  # the normalised rows: x, or the sum
    ctx.settings = (rms, bias is not None, x.shape)
    return (total.view(x.shape), y.view(x.shape)) if has_addend else y.view(x.shape)


def _backward(ctx, dy, dtotal=None):
    """dx (the gradient of both summands when there is an addend: `dtotal` added in), dweight,
    dbias."""
    rows, weight, mean, rstd = ctx.saved_tensors
    rms, has_bias, shape = ctx.settings
    n_rows, n_cols = rows.shape
    dy = _rows(dy)
    has_addend = dtotal is not None
    dtotal = _rows(dtotal) if has_addend else dy
    block = _block(n_cols, "rms_norm" if rms else "layer_norm")
    config = NORM_BACKWARD[current_arch(rows.device)]
    processors = _multiprocessors(rows.device)
    rows_per_program = triton.cdiv(n_rows, max(1, min(n_rows, config.programs_per_sm * processors)))
    programs = triton.cdiv(n_rows, rows_per_program)
    dx = torch.empty_like(rows)
    # the weight's and the bias' partial sums in one buffer: one reduction and one cast for both
    partials = torch.empty(
        (2 if has_bias else 1, programs, n_cols), device=rows.device, dtype=torch.float32
    )
    _norm_backward[(programs,)](
        rows,
        weight,
        dy,
        dtotal,
        dx,
        mean,
        rstd,
        partials[0],
        partials[-1],
        rows.stride(0),
        dy.stride(0),
        dtotal.stride(0),
        dx.stride(0),
        n_rows,
        n_cols,
        rows_per_program,
        BLOCK=block,
        RMS=rms,
        HAS_BIAS=has_bias,
        HAS_ADDEND=has_addend,
        num_warps=config.num_warps(block),
    )
    sums = partials.sum(1).to(weight.dtype)
    return dx.view(shape), sums[0], sums[1] if has_bias else None


class _Norm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps, rms):
        return _forward(ctx, x, None, weight, bias, eps, rms)

    @staticmethod
    def backward(ctx, dy):
        dx, grad_weight, grad_bias = _backward(ctx, dy)
        return dx, grad_weight, grad_bias, None, None


class _AddNorm(torch.autograd.Function):
    """(x + addend, norm(x + addend)): the sum is an output too, as the residual stream goes on from
    it."""

    @staticmethod
    def forward(ctx, x, addend, weight, bias, eps, rms):
        return _forward(ctx, x, addend, weight, bias, eps, rms)

    @staticmethod
    def backward(ctx, dtotal, dy):
        dx, grad_weight, grad_bias = _backward(ctx, dy, dtotal)
        return dx, dx, grad_weight, grad_bias, None, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _Norm.apply(x, weight, None, eps, True)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
) -> torch.Tensor:
    return _Norm.apply(x, weight, bias, eps, False)


def add_rms_norm(
    x: torch.Tensor, addend: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    return _AddNorm.apply(x, addend, weight, None, eps, True)


def add_layer_norm(
    x: torch.Tensor,
    addend: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    return _AddNorm.apply(x, addend, weight, bias, eps, False)
