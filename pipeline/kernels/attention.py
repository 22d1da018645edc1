"""FlashAttention-2 in Triton with ALiBi, causal and document masks, sliding windows, Gemma 2's soft
cap, GQA: forward and backward.

Imported only when a call runs the Triton backend (pipeline.kernels dispatches), so the package
works with torch alone. Shapes (batch, heads, seq, head_dim) like SDPA, any strides with a
contiguous head_dim; the output and the gradients keep their input's memory layout; k and v may have
fewer heads.

Forward: one program per (query block, batch x head) streams key blocks with an online softmax in
float32 and stores the log-sum-exp (LSE) per row. Backward recomputes the probabilities from the
LSE, never storing attention: one program per query block accumulates dQ and first stores the
softmax backward's per-row term delta = rowsum(dO * O); then one program per key block and kv head
accumulates dK and dV over the query blocks of every query head of its group (GQA sums in registers,
no atomics: deterministic). That is 7 matrix products per tile pair against the 5 of a
FlashAttention-2 backward that adds dQ with float32 atomics inside the dK/dV loop; such a variant
was built and timed on an H100 (Triton 3.6) and was slower at every tiling that compiles without
register spills: docs/benchmark-log.md, "Attention", has the figures.

Scores live in the log2 domain (exp2 is the native instruction): log2(e) is folded, on the host,
into the softmax scale and into the ALiBi slopes. ALiBi adds slope * (j - i); a kernel adds slope *
(j - anchor) with `anchor` the first position of its own block instead, which differs by a constant
per row (softmax ignores it) and costs one fused multiply-add per score, like no bias at all. The
LSE is stored in the true (j - i) frame, so each kernel can pick its own anchor.

Which tile pairs run: causal loops run the blocks wholly on the visible side of the diagonal without
a causal mask and only the diagonal blocks with one. Document masks (segment ids) are resolved per
block before the attention kernels run (`_segment_block_ranges`, one small launch per tiling): each
block gets the range of the other side's blocks that share a segment with it, and inside it the run
of "full" blocks where every pair does; the kernels loop over that range only. The ranges are
resolved once per batch: every layer that gets the same `segment_ids` tensor (unchanged: its version
counter) reuses the int32 ids and the ranges of the first (`_document_blocks`). The forward and dQ
kernels apply the document mask to the partial blocks at the range's ends and nothing to the full
ones; the dK/dV kernel runs its range and diagonal as one masked loop, which leaves it the registers
for one more pipeline stage. The loops have no data-dependent branch, so Triton's software pipeliner
streams their K/V (Q/dO) tiles as in the dense case; a per-block `if` around the tile's work, as
this kernel had before, keeps the loads out of the pipeline (docs/benchmark-log.md, packed rows).

A sliding window of W keys (causal only: query i sees key j when 0 <= i - j < W, as Mistral and
Gemma define it) narrows each program's region the same way: the query-block kernels start at the
first key block that some query of the block sees (`_window_keys`), the dK/dV kernel ends at the
last query block that sees a key of its block (`_window_queries`); tiles wholly outside the window
are never loaded, so the cost grows with W, not with the sequence. The window's edge blocks, where
some pairs lie outside it, run masked with the documents' partial blocks (one loop: a separate one
spilled scalar registers on gfx90a), and the diagonal block gets the window mask with the causal
one. A window of the sequence's length or more is no window.

The soft cap (Gemma 2's attention logit soft-capping) replaces a scaled score s by c * tanh(s / c)
before the masks; the backward multiplies the softmax gradient by its derivative 1 - tanh^2,
recovered from the capped score itself (`_through_cap`). ALiBi with the soft cap is refused: the
per-block ALiBi frame above needs scores that are linear up to a per-row constant.
"""

from __future__ import annotations

import math
import weakref
from typing import Optional

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import AttentionConfigs, attention_configs, current_arch
from pipeline.kernels.reference import check_attention_options, unstack_qkv

LOG2E = 1.4426950408889634  # exp(x) = exp2(x * LOG2E): the kernels work in the log2 domain
# Masked scores: finite, so that a forward row whose first key blocks are all masked gives exp2(0) =
# 1 garbage that the next real maximum rescales to exactly 0 (no inf - inf = NaN); the backward
# subtracts a finite LSE from it and gets exp2(-1e30) = 0.
MASKED = tl.constexpr(-1.0e30)
INT32_MAX = tl.constexpr(2147483647)
INT32_MIN = tl.constexpr(-2147483648)


@triton.jit
def _load_tile(
    ptrs, rows, cols, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr
):
    if CHECK_ROWS:
        if CHECK_COLS:
            tile = tl.load(
                ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0
            )
        else:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if CHECK_COLS:
            tile = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(
    ptrs, tile, rows, cols, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr
):
    if CHECK_ROWS:
        if CHECK_COLS:
            tl.store(ptrs, tile, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols))
        else:
            tl.store(ptrs, tile, mask=rows[:, None] < n_rows)
    else:
        if CHECK_COLS:
            tl.store(ptrs, tile, mask=cols[None, :] < n_cols)
        else:
            tl.store(ptrs, tile)


@triton.jit
def _load_rows(ptrs, rows, n_rows, CHECK_ROWS: tl.constexpr):
    """A per-row float32 vector (LSE, delta), 0 past the sequence end."""
    if CHECK_ROWS:
        values = tl.load(ptrs, mask=rows < n_rows, other=0.0)
    else:
        values = tl.load(ptrs)
    return values


@triton.jit
def _masked_scores(
    a,
    b,
    a_pos,
    b_pos,
    a_seg,
    b_seg,
    alibi_slope2,
    anchor,
    qk_scale,
    softcap2,
    window,
    seq_len,
    QUERIES_FIRST: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    CHECK_B: tl.constexpr,
    SEGMENT_MASK: tl.constexpr,
    WINDOW_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    """Log2-domain scores of one tile pair, rows of `a` against rows of `b`: queries x keys when
    QUERIES_FIRST, else keys x queries (the dK/dV kernel's transposed view). ALiBi is taken relative
    to `anchor`; masked entries are MASKED. CHECK_B masks rows of `b` past the sequence end (a's are
    never stored); WINDOW_MASK the pairs with query - key >= window. With SOFTCAP the scores are
    softcap2 * tanh(a . b * qk_scale / 2) (see `_score_scales`)."""
    scores = tl.dot(a, tl.trans(b))
    if SOFTCAP:  # never with ALiBi (refused on the host)
        # tanh(x) = 1 - 2 / (exp2(2 x log2 e) + 1), which saturates to +-1 (exp2 -> inf or 0):
        # exp2 is the native instruction, and libdevice's tanh does not run in the interpreter.
        scores = (1.0 - 2.0 / (tl.math.exp2(scores * qk_scale) + 1.0)) * softcap2
    elif HAS_ALIBI:
        if QUERIES_FIRST:
            scores = scores * qk_scale + (alibi_slope2 * (b_pos - anchor).to(tl.float32))[None, :]
        else:
            scores = scores * qk_scale + (alibi_slope2 * (a_pos - anchor).to(tl.float32))[:, None]
    else:
        scores = scores * qk_scale
    if WINDOW_MASK:
        if QUERIES_FIRST:
            behind = a_pos[:, None] - b_pos[None, :]  # query - key
        else:
            behind = b_pos[None, :] - a_pos[:, None]
        if CAUSAL_MASK:  # 0 <= behind < window in one unsigned compare
            inside = behind.to(tl.uint32, bitcast=True) < window.to(tl.uint32, bitcast=True)
        else:
            inside = behind < window
        scores = tl.where(inside, scores, MASKED)
    elif CAUSAL_MASK:
        if QUERIES_FIRST:
            scores = tl.where(a_pos[:, None] >= b_pos[None, :], scores, MASKED)
        else:
            scores = tl.where(b_pos[None, :] >= a_pos[:, None], scores, MASKED)
    if CHECK_B:
        scores = tl.where(b_pos[None, :] < seq_len, scores, MASKED)
    if SEGMENT_MASK:
        scores = tl.where(a_seg[:, None] == b_seg[None, :], scores, MASKED)
    return scores


@triton.jit
def _through_cap(p, scores, softcap2):
    """p * d/dx [c tanh(x / c)] = p * (1 - tanh^2), the tanh read back from the capped log2-domain
    scores (softcap2 * tanh): keeping the tanh itself beside the scores would hold one more tile of
    registers (it spilled on sm90). Masked scores clamp to -softcap2, so that p = 0 meets a
    finite factor (their square would overflow to inf, and 0 * inf is NaN)."""
    tanh = tl.maximum(scores, -softcap2) * (1.0 / softcap2)
    return p * (1.0 - tanh * tanh)


@triton.jit
def _segment_range(
    seg_row_ptr,
    ranges_ptr,
    block,
    batch,
    positions,
    seq_len,
    region_lo,
    region_hi,
    HAS_SEGMENTS: tl.constexpr,
):
    """For the block at `positions` (its program's own queries or keys): the other side's range [lo,
    hi) that it can see, the run [full_lo, full_hi) inside it where no document mask is needed, all
    clipped to the region [region_lo, region_hi), and the block's segment ids. Without documents:
    the whole region, full."""
    if HAS_SEGMENTS:
        bounds = ranges_ptr + (batch * tl.num_programs(0) + block) * 4
        lo = tl.minimum(tl.maximum(tl.load(bounds), region_lo), region_hi)
        full_lo = tl.minimum(tl.maximum(tl.load(bounds + 1), region_lo), region_hi)
        full_hi = tl.minimum(tl.maximum(tl.load(bounds + 2), region_lo), region_hi)
        hi = tl.minimum(tl.maximum(tl.load(bounds + 3), region_lo), region_hi)
        segments = tl.load(seg_row_ptr + positions, mask=positions < seq_len, other=-1)
    else:
        lo = region_lo
        full_lo = region_lo
        full_hi = region_hi
        hi = region_hi
        segments = positions  # unused
    return lo, full_lo, full_hi, hi, segments


@triton.jit
def _window_keys(anchor, window, region_hi, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """A causal sliding window, seen from the query block at `anchor`: the key blocks (multiples of
    BLOCK_N) in [lo, full) hold keys outside the window of some of its queries (masked), those in
    [full, region_hi) lie inside every one's; blocks before lo hold no key that any of its queries
    sees (lo's block holds key anchor - window + 1, the first one its first query sees) and are
    skipped."""
    lo = tl.maximum(anchor - window + 1, 0) // BLOCK_N * BLOCK_N
    full = tl.cdiv(tl.maximum(anchor + BLOCK_M - window, 0), BLOCK_N) * BLOCK_N
    return lo, tl.minimum(full, region_hi)


@triton.jit
def _window_queries(
    anchor, window, region_lo, seq_len, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr
):
    """A causal sliding window, seen from the key block at `anchor` (the dK/dV kernel): the query
    blocks (multiples of BLOCK_M) in [region_lo, full) see all its keys, those in [full, hi) some
    of them; query blocks from hi on see none and are skipped."""
    hi = tl.minimum(tl.cdiv(anchor + BLOCK_N - 1 + window, BLOCK_M) * BLOCK_M, seq_len)
    full = tl.maximum(tl.minimum((anchor + window) // BLOCK_M * BLOCK_M, hi), region_lo)
    return full, hi


@triton.jit
def _segment_block_ranges(
    seg_ptr,
    ranges_ptr,
    stride_seg_b,
    seq_len,
    OUTER: tl.constexpr,
    INNER: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """For each OUTER-wide block of a row (program_id 0) and batch row (program_id 1): the range of
    INNER-wide blocks that share a segment with it, and the run of those where every position does
    ("full" blocks).

    A block is seen when the [min, max] intervals of the two blocks' segment ids overlap: exact (no
    block that no position can see) when ids are monotone along the row, as packers number
    documents, and a superset otherwise, which the kernels' element-wise document mask keeps
    correct. A block is full when both blocks hold one and the same id and the inner one lies wholly
    inside the sequence. The full run is kept only if it is one unbroken run; otherwise every block
    of the range is masked. Writes [lo, full_lo, full_hi, hi] as positions (multiples of INNER);
    full_lo == full_hi == lo when no full run exists."""
    block = tl.program_id(0)
    batch = tl.program_id(1)
    seg_row = seg_ptr + batch * stride_seg_b
    outer = block * OUTER + tl.arange(0, OUTER)
    outer_seg = tl.load(seg_row + outer, mask=outer < seq_len, other=0)
    outer_min = tl.min(tl.where(outer < seq_len, outer_seg, INT32_MAX), 0)
    outer_max = tl.max(tl.where(outer < seq_len, outer_seg, INT32_MIN), 0)

    blocks_per_chunk: tl.constexpr = CHUNK // INNER
    first_seen = INT32_MAX
    last_seen = -1
    first_full = INT32_MAX
    last_full = -1
    full_count = 0
    for start in range(0, seq_len, CHUNK):
        inner_block = start // INNER + tl.arange(0, blocks_per_chunk)
        inner = inner_block[:, None] * INNER + tl.arange(0, INNER)[None, :]
        valid = inner < seq_len
        inner_seg = tl.load(seg_row + inner, mask=valid, other=0)
        inner_min = tl.min(tl.where(valid, inner_seg, INT32_MAX), 1)
        inner_max = tl.max(tl.where(valid, inner_seg, INT32_MIN), 1)
        whole = tl.min(valid.to(tl.int32), 1) == 1
        seen = (inner_max >= outer_min) & (inner_min <= outer_max)
        full = (
            seen
            & whole
            & (inner_min == inner_max)
            & (inner_min == outer_min)
            & (outer_min == outer_max)
        )
        first_seen = tl.minimum(first_seen, tl.min(tl.where(seen, inner_block, INT32_MAX), 0))
        last_seen = tl.maximum(last_seen, tl.max(tl.where(seen, inner_block, -1), 0))
        first_full = tl.minimum(first_full, tl.min(tl.where(full, inner_block, INT32_MAX), 0))
        last_full = tl.maximum(last_full, tl.max(tl.where(full, inner_block, -1), 0))
        full_count += tl.sum(full.to(tl.int32), 0)

    one_run = (full_count > 0) & (full_count == last_full - first_full + 1)
    full_lo = tl.where(one_run, first_full, first_seen)
    full_hi = tl.where(one_run, last_full + 1, first_seen)
    bounds = ranges_ptr + (batch * tl.num_programs(0) + block) * 4
    tl.store(bounds, first_seen * INNER)
    tl.store(bounds + 1, full_lo * INNER)
    tl.store(bounds + 2, full_hi * INNER)
    tl.store(bounds + 3, (last_seen + 1) * INNER)


@triton.jit
def _forward_key_blocks(
    acc,
    row_sum,
    row_max,
    q,
    k_ptrs,
    v_ptrs,
    stride_ks,
    stride_vs,
    seg_row_ptr,
    seg_q,
    offs_m,
    offs_n,
    offs_d,
    alibi_slope2,
    anchor,
    qk_scale,
    softcap2,
    window,
    seq_len,
    head_dim,
    lo,
    hi,
    BLOCK_N: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    CHECK_KEYS: tl.constexpr,
    SEGMENT_MASK: tl.constexpr,
    WINDOW_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """Online softmax over the key blocks [lo, hi) for one query block."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        seg_k = keys
        if SEGMENT_MASK:
            seg_k = tl.load(seg_row_ptr + keys, mask=keys < seq_len, other=-1)
        k = _load_tile(
            k_ptrs + start_n * stride_ks, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        scores = _masked_scores(
            q,
            k,
            offs_m,
            keys,
            seg_q,
            seg_k,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            QUERIES_FIRST=True,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=CAUSAL_MASK,
            CHECK_B=CHECK_KEYS,
            SEGMENT_MASK=SEGMENT_MASK,
            WINDOW_MASK=WINDOW_MASK,
            SOFTCAP=SOFTCAP,
        )
        new_max = tl.maximum(row_max, tl.max(scores, 1))
        p = tl.math.exp2(scores - new_max[:, None])
        rescale = tl.math.exp2(row_max - new_max)
        row_sum = row_sum * rescale + tl.sum(p, 1)
        v = _load_tile(
            v_ptrs + start_n * stride_vs, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])
        row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _attention_forward(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    lse_ptr,
    slopes_ptr,
    seg_ptr,
    ranges_ptr,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_os,
    stride_seg_b,
    heads,
    group,
    seq_len,
    head_dim,
    qk_scale,
    softcap2,
    window,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SEGMENTS: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_SEQ: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    block = tl.program_id(0)
    if (
        CAUSAL
    ):  # the last query blocks have the most keys: start them first so that no SM idles at the end
        block = tl.num_programs(0) - 1 - block
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = head // group
    anchor = block * BLOCK_M
    offs_m = anchor + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = (
        q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    )
    q = _load_tile(q_ptrs, offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    k_ptrs = (
        k_ptr
        + batch * stride_kb
        + kv_head * stride_kh
        + offs_n[:, None] * stride_ks
        + offs_d[None, :]
    )
    v_ptrs = (
        v_ptr
        + batch * stride_vb
        + kv_head * stride_vh
        + offs_n[:, None] * stride_vs
        + offs_d[None, :]
    )
    alibi_slope2 = 0.0
    if HAS_ALIBI:
        alibi_slope2 = tl.load(slopes_ptr + head)
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    # Keys before the block's first query are visible to all its queries (causal); the diagonal
    # comes last. A sliding window (causal only) starts the region at its first key block.
    region_lo = 0
    region_hi = anchor if CAUSAL else seq_len
    window_full = region_lo
    if WINDOW:
        region_lo, window_full = _window_keys(anchor, window, region_hi, BLOCK_M, BLOCK_N)
    lo, full_lo, full_hi, hi, seg_q = _segment_range(
        seg_row_ptr,
        ranges_ptr,
        block,
        batch,
        offs_m,
        seq_len,
        region_lo,
        region_hi,
        HAS_SEGMENTS=HAS_SEGMENTS,
    )

    row_max = tl.full([BLOCK_M], MASKED, dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if WINDOW:
        # The window's edge joins the masked blocks before the unmasked run (one loop: another
        # would spill scalar registers on gfx90a).
        full_lo = tl.maximum(full_lo, window_full)
        full_hi = tl.maximum(full_hi, window_full)
    if HAS_SEGMENTS or WINDOW:
        acc, row_sum, row_max = _forward_key_blocks(
            acc,
            row_sum,
            row_max,
            q,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            lo,
            tl.minimum(full_lo, hi),
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=False,
            CHECK_KEYS=CHECK_SEQ and not CAUSAL,
            SEGMENT_MASK=HAS_SEGMENTS,
            WINDOW_MASK=WINDOW,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    acc, row_sum, row_max = _forward_key_blocks(
        acc,
        row_sum,
        row_max,
        q,
        k_ptrs,
        v_ptrs,
        stride_ks,
        stride_vs,
        seg_row_ptr,
        seg_q,
        offs_m,
        offs_n,
        offs_d,
        alibi_slope2,
        anchor,
        qk_scale,
        softcap2,
        window,
        seq_len,
        head_dim,
        full_lo,
        full_hi,
        BLOCK_N=BLOCK_N,
        HAS_ALIBI=HAS_ALIBI,
        CAUSAL_MASK=False,
        CHECK_KEYS=CHECK_SEQ and not (CAUSAL or HAS_SEGMENTS),
        SEGMENT_MASK=False,
        WINDOW_MASK=False,
        SOFTCAP=SOFTCAP,
        CHECK_D=CHECK_D,
    )
    if HAS_SEGMENTS:
        acc, row_sum, row_max = _forward_key_blocks(
            acc,
            row_sum,
            row_max,
            q,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            full_hi,
            hi,
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=False,
            CHECK_KEYS=CHECK_SEQ and not CAUSAL,
            SEGMENT_MASK=True,
            WINDOW_MASK=False,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    if CAUSAL:
        acc, row_sum, row_max = _forward_key_blocks(
            acc,
            row_sum,
            row_max,
            q,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            anchor,
            tl.minimum(anchor + BLOCK_M, seq_len),
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=True,
            CHECK_KEYS=CHECK_SEQ,
            SEGMENT_MASK=HAS_SEGMENTS,
            WINDOW_MASK=WINDOW,  # a window narrower than the block
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )

    acc = acc / row_sum[:, None]
    # LSE (log2 domain) in the true (j - i) frame: the scores above carried + slope * (i - anchor).
    lse = row_max + tl.math.log2(row_sum)
    if HAS_ALIBI:
        lse = lse - alibi_slope2 * (offs_m - anchor).to(tl.float32)
    lse_ptrs = lse_ptr + batch_head * seq_len + offs_m
    if CHECK_SEQ:
        tl.store(lse_ptrs, lse, mask=offs_m < seq_len)
    else:
        tl.store(lse_ptrs, lse)
    o_ptrs = (
        o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    )
    _store_tile(
        o_ptrs,
        acc.to(o_ptr.dtype.element_ty),
        offs_m,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )


@triton.jit
def _backward_kv_query_blocks(
    dk,
    dv,
    k,
    v,
    q_ptrs,
    do_ptrs,
    stride_qh,
    stride_qs,
    stride_doh,
    stride_dos,
    lse_ptr,
    delta_ptr,
    slopes_ptr,
    seg_row_ptr,
    seg_k,
    offs_n,
    offs_m,
    offs_d,
    first_head,
    anchor,
    qk_scale,
    softcap2,
    window,
    seq_len,
    head_dim,
    group,
    lo,
    hi,
    BLOCK_M: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    CHECK_QUERIES: tl.constexpr,
    SEGMENT_MASK: tl.constexpr,
    WINDOW_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """dK, dV of one key block from the query blocks [lo, hi) of every query head of its group (keys
    x queries). One flat loop over (head, query block) pairs rather than a loop over heads around a
    loop over blocks: in the nest, the compiler kept per-head values live across the inner loop and
    the GQA kernels spilled (sm90, D=128, 32 x 64 tiles: 504 bytes with two or more heads per group,
    none with one); flat, they compile as one head does."""
    member = 0
    start_m = lo
    for _ in tl.range(0, group * tl.cdiv(hi - lo, BLOCK_M)):
        queries = start_m + offs_m
        seg_q = queries
        if SEGMENT_MASK:
            seg_q = tl.load(seg_row_ptr + queries, mask=queries < seq_len, other=-1)
        q = _load_tile(
            q_ptrs + member * stride_qh + start_m * stride_qs,
            queries,
            offs_d,
            seq_len,
            head_dim,
            CHECK_QUERIES,
            CHECK_D,
        )
        rows = member * seq_len + queries
        lse = _load_rows(lse_ptr + rows, queries, seq_len, CHECK_QUERIES)
        delta = _load_rows(delta_ptr + rows, queries, seq_len, CHECK_QUERIES)
        alibi_slope2 = 0.0
        if HAS_ALIBI:  # into this kernel's frame, anchored at the key block
            alibi_slope2 = tl.load(slopes_ptr + first_head + member)
            lse = lse + alibi_slope2 * (queries - anchor).to(tl.float32)
        scores_t = _masked_scores(
            k,
            q,
            offs_n,
            queries,
            seg_k,
            seg_q,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            QUERIES_FIRST=False,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=CAUSAL_MASK,
            CHECK_B=CHECK_QUERIES,
            SEGMENT_MASK=SEGMENT_MASK,
            WINDOW_MASK=WINDOW_MASK,
            SOFTCAP=SOFTCAP,
        )
        p_t = tl.math.exp2(scores_t - lse[None, :])
        dp_factor_t = p_t
        if SOFTCAP:  # at once, so that the scores need not stay live
            dp_factor_t = _through_cap(p_t, scores_t, softcap2)
        do = _load_tile(
            do_ptrs + member * stride_doh + start_m * stride_dos,
            queries,
            offs_d,
            seq_len,
            head_dim,
            CHECK_QUERIES,
            CHECK_D,
        )
        dv = tl.dot(p_t.to(do.dtype), do, dv)
        dp_t = tl.dot(v, tl.trans(do))
        ds_t = dp_factor_t * (dp_t - delta[None, :])
        dk = tl.dot(ds_t.to(q.dtype), q, dk)
        start_m += BLOCK_M  # the next query block, or the first one of the next head
        member = tl.where(start_m >= hi, member + 1, member)
        start_m = tl.where(start_m >= hi, lo, start_m)
    return dk, dv


@triton.jit
def _attention_backward_kv(
    q_ptr,
    k_ptr,
    v_ptr,
    do_ptr,
    dk_ptr,
    dv_ptr,
    lse_ptr,
    delta_ptr,
    slopes_ptr,
    seg_ptr,
    ranges_ptr,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dkb,
    stride_dkh,
    stride_dks,
    stride_dvb,
    stride_dvh,
    stride_dvs,
    stride_seg_b,
    heads,
    kv_heads,
    group,
    seq_len,
    head_dim,
    qk_scale,
    sm_scale,
    softcap2,
    window,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SEGMENTS: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_SEQ: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    block = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    anchor = block * BLOCK_N
    offs_n = anchor + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_tile(
        k_ptr
        + batch * stride_kb
        + kv_head * stride_kh
        + offs_n[:, None] * stride_ks
        + offs_d[None, :],
        offs_n,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    v = _load_tile(
        v_ptr
        + batch * stride_vb
        + kv_head * stride_vh
        + offs_n[:, None] * stride_vs
        + offs_d[None, :],
        offs_n,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    # Queries after the key block see all of it (causal); the diagonal queries need the causal mask.
    # A sliding window (causal only) ends the region at the last query block that sees a key of
    # the block, and needs its mask from `window_full` on.
    diagonal_end = tl.minimum(anchor + BLOCK_N, seq_len)
    region_lo = diagonal_end if CAUSAL else 0
    region_hi = seq_len
    window_full = region_hi
    if WINDOW:
        window_full, region_hi = _window_queries(
            anchor, window, region_lo, seq_len, BLOCK_M, BLOCK_N
        )
    lo, _, _, hi, seg_k = _segment_range(
        seg_row_ptr,
        ranges_ptr,
        block,
        batch,
        offs_n,
        seq_len,
        region_lo,
        region_hi,
        HAS_SEGMENTS=HAS_SEGMENTS,
    )

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    first_head = kv_head * group
    q_ptrs = (
        q_ptr
        + batch * stride_qb
        + first_head * stride_qh
        + offs_m[:, None] * stride_qs
        + offs_d[None, :]
    )
    do_ptrs = (
        do_ptr
        + batch * stride_dob
        + first_head * stride_doh
        + offs_m[:, None] * stride_dos
        + offs_d[None, :]
    )
    row_offset = (
        batch * heads + first_head
    ) * seq_len  # lse, delta: (batch, heads, seq), a group's heads adjacent
    if HAS_SEGMENTS:
        # The diagonal and the document range in one loop, every block masked. Split into the masked
        # ends and the unmasked run (as the forward and dQ kernels run theirs), the kernel needed 2
        # pipeline stages to compile without spills; as one loop it runs 3, which measured 1.06x
        # forward+backward on packed rows (docs/benchmark-log.md).
        start = anchor if CAUSAL else lo
        dk, dv = _backward_kv_query_blocks(
            dk,
            dv,
            k,
            v,
            q_ptrs,
            do_ptrs,
            stride_qh,
            stride_qs,
            stride_doh,
            stride_dos,
            lse_ptr + row_offset,
            delta_ptr + row_offset,
            slopes_ptr,
            seg_row_ptr,
            seg_k,
            offs_n,
            offs_m,
            offs_d,
            first_head,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            group,
            start,
            hi,
            BLOCK_M=BLOCK_M,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=CAUSAL,
            CHECK_QUERIES=CHECK_SEQ,
            SEGMENT_MASK=True,
            WINDOW_MASK=WINDOW,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    else:
        if CAUSAL:
            dk, dv = _backward_kv_query_blocks(
                dk,
                dv,
                k,
                v,
                q_ptrs,
                do_ptrs,
                stride_qh,
                stride_qs,
                stride_doh,
                stride_dos,
                lse_ptr + row_offset,
                delta_ptr + row_offset,
                slopes_ptr,
                seg_row_ptr,
                seg_k,
                offs_n,
                offs_m,
                offs_d,
                first_head,
                anchor,
                qk_scale,
                softcap2,
                window,
                seq_len,
                head_dim,
                group,
                anchor,
                diagonal_end,
                BLOCK_M=BLOCK_M,
                HAS_ALIBI=HAS_ALIBI,
                CAUSAL_MASK=True,
                CHECK_QUERIES=CHECK_SEQ,
                SEGMENT_MASK=False,
                WINDOW_MASK=WINDOW,
                SOFTCAP=SOFTCAP,
                CHECK_D=CHECK_D,
            )
        dk, dv = _backward_kv_query_blocks(
            dk,
            dv,
            k,
            v,
            q_ptrs,
            do_ptrs,
            stride_qh,
            stride_qs,
            stride_doh,
            stride_dos,
            lse_ptr + row_offset,
            delta_ptr + row_offset,
            slopes_ptr,
            seg_row_ptr,
            seg_k,
            offs_n,
            offs_m,
            offs_d,
            first_head,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            group,
            lo,
            window_full,
            BLOCK_M=BLOCK_M,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=False,
            CHECK_QUERIES=CHECK_SEQ,
            SEGMENT_MASK=False,
            WINDOW_MASK=False,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
        if WINDOW:
            dk, dv = _backward_kv_query_blocks(
                dk,
                dv,
                k,
                v,
                q_ptrs,
                do_ptrs,
                stride_qh,
                stride_qs,
                stride_doh,
                stride_dos,
                lse_ptr + row_offset,
                delta_ptr + row_offset,
                slopes_ptr,
                seg_row_ptr,
                seg_k,
                offs_n,
                offs_m,
                offs_d,
                first_head,
                anchor,
                qk_scale,
                softcap2,
                window,
                seq_len,
                head_dim,
                group,
                window_full,
                hi,
                BLOCK_M=BLOCK_M,
                HAS_ALIBI=HAS_ALIBI,
                CAUSAL_MASK=False,
                CHECK_QUERIES=CHECK_SEQ,
                SEGMENT_MASK=False,
                WINDOW_MASK=True,
                SOFTCAP=SOFTCAP,
                CHECK_D=CHECK_D,
            )

    dk = dk * sm_scale
    _store_tile(
        dk_ptr
        + batch * stride_dkb
        + kv_head * stride_dkh
        + offs_n[:, None] * stride_dks
        + offs_d[None, :],
        dk.to(dk_ptr.dtype.element_ty),
        offs_n,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    _store_tile(
        dv_ptr
        + batch * stride_dvb
        + kv_head * stride_dvh
        + offs_n[:, None] * stride_dvs
        + offs_d[None, :],
        dv.to(dv_ptr.dtype.element_ty),
        offs_n,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )


@triton.jit
def _backward_q_key_blocks(
    dq,
    q,
    do,
    lse,
    delta,
    k_ptrs,
    v_ptrs,
    stride_ks,
    stride_vs,
    seg_row_ptr,
    seg_q,
    offs_m,
    offs_n,
    offs_d,
    alibi_slope2,
    anchor,
    qk_scale,
    softcap2,
    window,
    seq_len,
    head_dim,
    lo,
    hi,
    BLOCK_N: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    CAUSAL_MASK: tl.constexpr,
    CHECK_KEYS: tl.constexpr,
    SEGMENT_MASK: tl.constexpr,
    WINDOW_MASK: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """dQ of one query block from the key blocks [lo, hi); `lse` already carries the block's ALiBi
    row term."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        seg_k = keys
        if SEGMENT_MASK:
            seg_k = tl.load(seg_row_ptr + keys, mask=keys < seq_len, other=-1)
        k = _load_tile(
            k_ptrs + start_n * stride_ks, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        scores = _masked_scores(
            q,
            k,
            offs_m,
            keys,
            seg_q,
            seg_k,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            QUERIES_FIRST=True,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=CAUSAL_MASK,
            CHECK_B=CHECK_KEYS,
            SEGMENT_MASK=SEGMENT_MASK,
            WINDOW_MASK=WINDOW_MASK,
            SOFTCAP=SOFTCAP,
        )
        p = tl.math.exp2(scores - lse[:, None])
        if SOFTCAP:
            p = _through_cap(p, scores, softcap2)
        v = _load_tile(
            v_ptrs + start_n * stride_vs, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        dp = tl.dot(do, tl.trans(v))
        ds = p * (dp - delta[:, None])
        dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _attention_backward_q(
    q_ptr,
    k_ptr,
    v_ptr,
    o_ptr,
    do_ptr,
    dq_ptr,
    lse_ptr,
    delta_ptr,
    slopes_ptr,
    seg_ptr,
    ranges_ptr,
    stride_qb,
    stride_qh,
    stride_qs,
    stride_kb,
    stride_kh,
    stride_ks,
    stride_vb,
    stride_vh,
    stride_vs,
    stride_ob,
    stride_oh,
    stride_os,
    stride_dob,
    stride_doh,
    stride_dos,
    stride_dqb,
    stride_dqh,
    stride_dqs,
    stride_seg_b,
    heads,
    group,
    seq_len,
    head_dim,
    qk_scale,
    sm_scale,
    softcap2,
    window,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr,
    HAS_ALIBI: tl.constexpr,
    HAS_SEGMENTS: tl.constexpr,
    WINDOW: tl.constexpr,
    SOFTCAP: tl.constexpr,
    CHECK_SEQ: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """dQ of one query block; it also computes and stores the block's delta = rowsum(dO * O) for the
    dK/dV kernel that runs after it, since it holds dO anyway (one pass over dO and one launch
    fewer)."""
    block = tl.program_id(0)
    if CAUSAL:  # heaviest query blocks first, as in the forward
        block = tl.num_programs(0) - 1 - block
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = head // group
    anchor = block * BLOCK_M
    offs_m = anchor + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q = _load_tile(
        q_ptr
        + batch * stride_qb
        + head * stride_qh
        + offs_m[:, None] * stride_qs
        + offs_d[None, :],
        offs_m,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    do = _load_tile(
        do_ptr
        + batch * stride_dob
        + head * stride_doh
        + offs_m[:, None] * stride_dos
        + offs_d[None, :],
        offs_m,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    o = _load_tile(
        o_ptr
        + batch * stride_ob
        + head * stride_oh
        + offs_m[:, None] * stride_os
        + offs_d[None, :],
        offs_m,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    if CHECK_SEQ:
        tl.store(delta_ptr + batch_head * seq_len + offs_m, delta, mask=offs_m < seq_len)
    else:
        tl.store(delta_ptr + batch_head * seq_len + offs_m, delta)
    lse = _load_rows(lse_ptr + batch_head * seq_len + offs_m, offs_m, seq_len, CHECK_SEQ)
    alibi_slope2 = 0.0
    if HAS_ALIBI:
        alibi_slope2 = tl.load(slopes_ptr + head)
        lse = lse + alibi_slope2 * (offs_m - anchor).to(tl.float32)
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    region_lo = 0  # the key blocks as in the forward
    region_hi = anchor if CAUSAL else seq_len
    window_full = region_lo
    if WINDOW:
        region_lo, window_full = _window_keys(anchor, window, region_hi, BLOCK_M, BLOCK_N)
    lo, full_lo, full_hi, hi, seg_q = _segment_range(
        seg_row_ptr,
        ranges_ptr,
        block,
        batch,
        offs_m,
        seq_len,
        region_lo,
        region_hi,
        HAS_SEGMENTS=HAS_SEGMENTS,
    )

    k_ptrs = (
        k_ptr
        + batch * stride_kb
        + kv_head * stride_kh
        + offs_n[:, None] * stride_ks
        + offs_d[None, :]
    )
    v_ptrs = (
        v_ptr
        + batch * stride_vb
        + kv_head * stride_vh
        + offs_n[:, None] * stride_vs
        + offs_d[None, :]
    )
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if WINDOW:
        # as in the forward
        full_lo = tl.maximum(full_lo, window_full)
        full_hi = tl.maximum(full_hi, window_full)
    if HAS_SEGMENTS or WINDOW:
        dq = _backward_q_key_blocks(
            dq,
            q,
            do,
            lse,
            delta,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            lo,
            tl.minimum(full_lo, hi),
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=False,
            CHECK_KEYS=CHECK_SEQ and not CAUSAL,
            SEGMENT_MASK=HAS_SEGMENTS,
            WINDOW_MASK=WINDOW,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    dq = _backward_q_key_blocks(
        dq,
        q,
        do,
        lse,
        delta,
        k_ptrs,
        v_ptrs,
        stride_ks,
        stride_vs,
        seg_row_ptr,
        seg_q,
        offs_m,
        offs_n,
        offs_d,
        alibi_slope2,
        anchor,
        qk_scale,
        softcap2,
        window,
        seq_len,
        head_dim,
        full_lo,
        full_hi,
        BLOCK_N=BLOCK_N,
        HAS_ALIBI=HAS_ALIBI,
        CAUSAL_MASK=False,
        CHECK_KEYS=CHECK_SEQ and not (CAUSAL or HAS_SEGMENTS),
        SEGMENT_MASK=False,
        WINDOW_MASK=False,
        SOFTCAP=SOFTCAP,
        CHECK_D=CHECK_D,
    )
    if HAS_SEGMENTS:
        dq = _backward_q_key_blocks(
            dq,
            q,
            do,
            lse,
            delta,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            full_hi,
            hi,
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=False,
            CHECK_KEYS=CHECK_SEQ and not CAUSAL,
            SEGMENT_MASK=True,
            WINDOW_MASK=False,
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    if CAUSAL:
        dq = _backward_q_key_blocks(
            dq,
            q,
            do,
            lse,
            delta,
            k_ptrs,
            v_ptrs,
            stride_ks,
            stride_vs,
            seg_row_ptr,
            seg_q,
            offs_m,
            offs_n,
            offs_d,
            alibi_slope2,
            anchor,
            qk_scale,
            softcap2,
            window,
            seq_len,
            head_dim,
            anchor,
            tl.minimum(anchor + BLOCK_M, seq_len),
            BLOCK_N=BLOCK_N,
            HAS_ALIBI=HAS_ALIBI,
            CAUSAL_MASK=True,
            CHECK_KEYS=CHECK_SEQ,
            SEGMENT_MASK=HAS_SEGMENTS,
            WINDOW_MASK=WINDOW,  # a window narrower than the block
            SOFTCAP=SOFTCAP,
            CHECK_D=CHECK_D,
        )
    dq = dq * sm_scale
    _store_tile(
        dq_ptr
        + batch * stride_dqb
        + head * stride_dqh
        + offs_m[:, None] * stride_dqs
        + offs_d[None, :],
        dq.to(dq_ptr.dtype.element_ty),
        offs_m,
        offs_d,
        seq_len,
        head_dim,
        CHECK_SEQ,
        CHECK_D,
    )


def _flags(seq_len: int, head_dim: int, configs: AttentionConfigs) -> tuple[int, bool, bool]:
    """(padded head dim, whether any tile crosses the sequence end, whether the head dim is padded)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    tiles = (
        configs.forward.block_m,
        configs.forward.block_n,
        configs.backward_kv.block_m,
        configs.backward_kv.block_n,
        configs.backward_q.block_m,
        configs.backward_q.block_n,
    )
    return block_d, any(seq_len % tile for tile in tiles), block_d != head_dim


def _segment_ranges(segments: torch.Tensor, outer: int, inner: int) -> torch.Tensor:
    """(batch, outer blocks, 4) int32 [lo, full_lo, full_hi, hi] of `_segment_block_ranges` for one
    tiling."""
    batch, seq_len = segments.shape
    outer_blocks = triton.cdiv(seq_len, outer)
    ranges = torch.empty((batch, outer_blocks, 4), device=segments.device, dtype=torch.int32)
    chunk = max(inner, min(1024, triton.next_power_of_2(seq_len)))
    _segment_block_ranges[(outer_blocks, batch)](
        segments,
        ranges,
        segments.stride(0),
        seq_len,
        OUTER=outer,
        INNER=inner,
        CHUNK=chunk,
        num_warps=4,
    )
    return ranges


class _DocumentBlocks:
    """One batch's segment ids as the kernels read them (int32, contiguous) and their block ranges
    per tiling, each resolved on first use and then kept: a model hands the same `segment_ids`
    tensor to every layer, and every layer's forward and backward reuse what the first one resolved
    (one small launch per tiling and batch instead of per layer; `_document_blocks` finds the entry
    again)."""

    def __init__(self, segment_ids: torch.Tensor, keep: bool) -> None:
        # Always a copy: were it the caller's tensor (already int32), the kept entry would keep that
        # tensor alive.
        self.segments = segment_ids.to(torch.int32, copy=True).contiguous()
        # False while a CUDA graph is being captured: what it computes exists only in replays
        self.keep = keep
        self._ranges: dict[tuple[int, int], torch.Tensor] = {}

    def ranges(self, outer: int, inner: int) -> torch.Tensor:
        ranges = self._ranges.get((outer, inner))
        if ranges is None:
            ranges = _segment_ranges(self.segments, outer, inner)
            if self.keep and not _capturing(self.segments):
                self._ranges[outer, inner] = ranges
        return ranges


def _capturing(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda and torch.cuda.is_current_stream_capturing()


# id(segment_ids) -> (weak reference to it, its version counter then, its blocks); entries leave
# with their tensor.
_DOCUMENT_BLOCKS: dict[int, tuple[weakref.ref, int, _DocumentBlocks]] = {}


def _document_blocks(segment_ids: torch.Tensor) -> _DocumentBlocks:
    """The blocks of `segment_ids`, shared by every call that passes this very tensor unchanged: its
    version counter, which every in-place torch op on it bumps, must not have moved (ids changed
    behind torch's back, through a numpy view or `.data`, are not seen: pass a new tensor instead).
    Inference tensors have no version counter and nothing is kept while a CUDA graph is captured;
    both are resolved per call."""
    if segment_ids.is_inference() or _capturing(segment_ids):
        return _DocumentBlocks(segment_ids, keep=False)
    key, version = id(segment_ids), segment_ids._version
    entry = _DOCUMENT_BLOCKS.get(key)
    if entry is not None and entry[0]() is segment_ids and entry[1] == version:
        return entry[2]
    blocks = _DocumentBlocks(segment_ids, keep=True)

    def forget(_, key=key):
        current = _DOCUMENT_BLOCKS.get(key)
        if current is not None and current[0]() is None:
            del _DOCUMENT_BLOCKS[key]

    _DOCUMENT_BLOCKS[key] = (weakref.ref(segment_ids, forget), version, blocks)
    return blocks


def _check_inputs(q, k, v, causal, alibi_slopes, segment_ids, sliding_window, softcap) -> None:
    check_attention_options(causal, alibi_slopes, sliding_window, softcap)
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(
            "flash_attention: q, k, v must be (batch, heads, seq, head_dim); got "
            f"{tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    batch, heads, seq_len, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[2] != seq_len or k.shape[3] != head_dim:
        raise ValueError(
            f"flash_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch, kv_heads, "
            "seq, "
            f"head_dim) with q's batch, seq and head_dim {tuple(q.shape)}"
        )
    if heads % k.shape[1]:
        raise ValueError(
            f"flash_attention: {heads} query heads are not a multiple of {k.shape[1]} key/value "
            "heads"
        )
    if head_dim > 128:
        raise ValueError(
            f"flash_attention: head_dim {head_dim} > 128 is not supported by the Triton kernel; "
            "use "
            f"the reference backend (set_backend('reference') or PIPELINE_KERNELS=reference)"
        )
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError(
            "flash_attention: the head_dim axis of q, k and v must be contiguous (stride 1)"
        )
    if alibi_slopes is not None and alibi_slopes.shape != (heads,):
        raise ValueError(
            f"flash_attention: alibi_slopes must have one slope per query head ({heads},); got "
            f"{tuple(alibi_slopes.shape)}"
        )
    if segment_ids is not None and segment_ids.shape != (batch, seq_len):
        raise ValueError(
            f"flash_attention: segment_ids must be (batch, seq) = ({batch}, {seq_len}); got "
            f"{tuple(segment_ids.shape)}"
        )


def _score_scales(sm_scale: float, softcap: Optional[float]) -> tuple[float, float]:
    """The kernels' (qk_scale, softcap2): log2-domain scores are q . k * qk_scale; with a soft cap
    c they are c log2(e) tanh(q . k * sm_scale / c), the tanh computed from exp2(q . k * qk_scale)
    with qk_scale = 2 log2(e) sm_scale / c, and softcap2 = c log2(e)."""
    if softcap is None:
        return sm_scale * LOG2E, 0.0
    return 2.0 * LOG2E * sm_scale / float(softcap), float(softcap) * LOG2E


def _window(sliding_window: Optional[int], seq_len: int) -> int:
    """The window the kernels apply, 0 for none: a causal window of seq_len keys or more hides
    nothing."""
    return int(sliding_window) if sliding_window is not None and sliding_window < seq_len else 0


def _launch_forward(
    ctx,
    q,
    k,
    v,
    causal,
    alibi_slopes,
    segment_ids,
    softmax_scale,
    sliding_window,
    softcap,
    configs,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel; keeps the settings and document blocks on `ctx`. Returns the output (laid
    out like q), the log-sum-exp and the scaled slopes: tensors the caller saves for the backward
    with `save_for_backward` (an output kept on `ctx` would hold its own graph alive)."""
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    arch = current_arch(q.device)
    block_d, check_seq, check_d = _flags(seq_len, head_dim, configs)
    sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    qk_scale, softcap2 = _score_scales(sm_scale, softcap)
    window = _window(sliding_window, seq_len)
    has_alibi, has_segments = alibi_slopes is not None, segment_ids is not None
    slopes2 = alibi_slopes.to(torch.float32) * LOG2E if has_alibi else q  # q: an unused pointer
    blocks = _document_blocks(segment_ids) if has_segments else None
    segments = blocks.segments if has_segments else q.new_empty((1, 1), dtype=torch.int32)
    cfg = configs.forward
    ranges = blocks.ranges(cfg.block_m, cfg.block_n) if has_segments else segments
    # In q's memory layout: a model's q is a (batch, seq, heads, head_dim) projection viewed as
    # (batch, heads, seq, head_dim), and an output laid out like it is read back as (batch, seq,
    # hidden) without a copy.
    out = torch.empty_like(q)
    lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32)
    _attention_forward[(triton.cdiv(seq_len, cfg.block_m), batch * heads)](
        q,
        k,
        v,
        out,
        lse,
        slopes2,
        segments,
        ranges,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        segments.stride(0),
        heads,
        heads // kv_heads,
        seq_len,
        head_dim,
        qk_scale,
        softcap2,
        window,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_ALIBI=has_alibi,
        HAS_SEGMENTS=has_segments,
        WINDOW=window > 0,
        SOFTCAP=softcap is not None,
        CHECK_SEQ=check_seq,
        CHECK_D=check_d,
        **cfg.launch_options(arch),
    )
    ctx.settings = (causal, has_alibi, has_segments, sm_scale, window, softcap, configs)
    ctx.blocks = blocks  # integer tensors, shared by the layers of a batch: not saved per layer
    return out, lse, slopes2


def _launch_backward(ctx, q, k, v, out, lse, slopes2, grad_out, dq, dk, dv) -> None:
    """The backward kernels, writing into dq, dk, dv (any strides with a contiguous head_dim)."""
    causal, has_alibi, has_segments, sm_scale, window, softcap, configs = ctx.settings
    qk_scale, softcap2 = _score_scales(sm_scale, softcap)
    blocks = ctx.blocks
    segments = blocks.segments if has_segments else q.new_empty((1, 1), dtype=torch.int32)
    batch, heads, seq_len, head_dim = q.shape
    kv_heads = k.shape[1]
    arch = current_arch(q.device)
    block_d, check_seq, check_d = _flags(seq_len, head_dim, configs)
    grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()

    def ranges_for(outer: int, inner: int) -> torch.Tensor:
        return blocks.ranges(outer, inner) if has_segments else segments

    delta = torch.empty_like(lse)
    flags = dict(
        BLOCK_D=block_d,
        CAUSAL=causal,
        HAS_ALIBI=has_alibi,
        HAS_SEGMENTS=has_segments,
        WINDOW=window > 0,
        SOFTCAP=softcap is not None,
        CHECK_SEQ=check_seq,
        CHECK_D=check_d,
    )
    cfg = configs.backward_q  # first: it stores delta, which the dK/dV kernel reads
    _attention_backward_q[(triton.cdiv(seq_len, cfg.block_m), batch * heads)](
        q,
        k,
        v,
        out,
        grad_out,
        dq,
        lse,
        delta,
        slopes2,
        segments,
        ranges_for(cfg.block_m, cfg.block_n),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        grad_out.stride(0),
        grad_out.stride(1),
        grad_out.stride(2),
        dq.stride(0),
        dq.stride(1),
        dq.stride(2),
        segments.stride(0),
        heads,
        heads // kv_heads,
        seq_len,
        head_dim,
        qk_scale,
        sm_scale,
        softcap2,
        window,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        **flags,
        **cfg.launch_options(arch),
    )
    cfg = configs.backward_kv
    _attention_backward_kv[(triton.cdiv(seq_len, cfg.block_n), batch * kv_heads)](
        q,
        k,
        v,
        grad_out,
        dk,
        dv,
        lse,
        delta,
        slopes2,
        segments,
        ranges_for(cfg.block_n, cfg.block_m),
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        v.stride(0),
        v.stride(1),
        v.stride(2),
        grad_out.stride(0),
        grad_out.stride(1),
        grad_out.stride(2),
        dk.stride(0),
        dk.stride(1),
        dk.stride(2),
        dv.stride(0),
        dv.stride(1),
        dv.stride(2),
        segments.stride(0),
        heads,
        kv_heads,
        heads // kv_heads,
        seq_len,
        head_dim,
        qk_scale,
        sm_scale,
        softcap2,
        window,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        **flags,
        **cfg.launch_options(arch),
    )


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        q,
        k,
        v,
        causal,
        alibi_slopes,
        segment_ids,
        softmax_scale,
        sliding_window,
        softcap,
        configs,
    ):
        out, lse, slopes2 = _launch_forward(
            ctx,
            q,
            k,
            v,
            causal,
            alibi_slopes,
            segment_ids,
            softmax_scale,
            sliding_window,
            softcap,
            configs,
        )
        ctx.save_for_backward(q, k, v, out, lse, slopes2)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *attention = ctx.saved_tensors
        # Laid out like q, k, v (see the forward's output): their projections' gradients then need
        # no copy either.
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _launch_backward(ctx, q, k, v, *attention, grad_out, dq, dk, dv)
        return dq, dk, dv, None, None, None, None, None, None, None


class _StackedFlashAttention(torch.autograd.Function):
    """Attention over q, k, v held side by side in one tensor (one projection made them): the
    backward writes their gradients side by side into one tensor too, where three separate gradients
    would be copied into one by autograd to reach the projection."""

    @staticmethod
    def forward(
        ctx,
        qkv,
        heads,
        head_dim,
        causal,
        alibi_slopes,
        segment_ids,
        softmax_scale,
        sliding_window,
        softcap,
        configs,
    ):
        out, lse, slopes2 = _launch_forward(
            ctx,
            *unstack_qkv(qkv, heads, head_dim),
            causal,
            alibi_slopes,
            segment_ids,
            softmax_scale,
            sliding_window,
            softcap,
            configs,
        )
        ctx.save_for_backward(qkv, out, lse, slopes2)
        ctx.shape = (heads, head_dim)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        qkv, *attention = ctx.saved_tensors
        grad_qkv = torch.empty_like(qkv)
        _launch_backward(
            ctx,
            *unstack_qkv(qkv, *ctx.shape),
            *attention,
            grad_out,
            *unstack_qkv(grad_qkv, *ctx.shape),
        )
        return grad_qkv, None, None, None, None, None, None, None, None, None


def _configs(
    q: torch.Tensor,
    has_segments: bool,
    sliding_window: Optional[int],
    softcap: Optional[float],
    configs: Optional[AttentionConfigs],
) -> AttentionConfigs:
    return (configs or attention_configs(current_arch(q.device), q.shape[-1])).specialised(
        has_segments, _window(sliding_window, q.shape[2]) > 0, softcap is not None
    )


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    segment_ids: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    configs: Optional[AttentionConfigs] = None,
) -> torch.Tensor:
    """The Triton kernel behind pipeline.kernels.flash_attention; `configs` overrides the table
    (tests)."""
    _check_inputs(q, k, v, causal, alibi_slopes, segment_ids, sliding_window, softcap)
    return _FlashAttention.apply(
        q,
        k,
        v,
        causal,
        alibi_slopes,
        segment_ids,
        softmax_scale,
        sliding_window,
        softcap,
        _configs(q, segment_ids is not None, sliding_window, softcap, configs),
    )


def stacked_flash_attention(
    qkv: torch.Tensor,
    heads: int,
    head_dim: int,
    *,
    causal: bool = True,
    alibi_slopes: Optional[torch.Tensor] = None,
    segment_ids: Optional[torch.Tensor] = None,
    softmax_scale: Optional[float] = None,
    sliding_window: Optional[int] = None,
    softcap: Optional[float] = None,
    configs: Optional[AttentionConfigs] = None,
) -> torch.Tensor:
    """The Triton kernel behind pipeline.kernels.stacked_flash_attention."""
    q, k, v = unstack_qkv(qkv, heads, head_dim)
    _check_inputs(q, k, v, causal, alibi_slopes, segment_ids, sliding_window, softcap)
    return _StackedFlashAttention.apply(
        qkv,
        heads,
        head_dim,
        causal,
        alibi_slopes,
        segment_ids,
        softmax_scale,
        sliding_window,
        softcap,
        _configs(q, segment_ids is not None, sliding_window, softcap, configs),
    )
