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
from typing import NamedTuple, Optional

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
def _store_rows(ptrs, values, rows, n_rows, CHECK_ROWS: tl.constexpr):
    """Stores a per-row float32 vector (LSE, delta), nothing past the sequence end."""
    if CHECK_ROWS:
        tl.store(ptrs, values, mask=rows < n_rows)
    else:
        tl.store(ptrs, values)


# The kernels take one argument per pointer and stride, as the launches pass them, and hand their
# helpers tuples instead (Triton unpacks them at compile time; inlined, they cost nothing):
# - a tensor: (pointer, batch stride, head stride, seq stride) of a (batch, heads, seq, head_dim)
#   tensor with a contiguous head_dim;
# - a tile: (batch, head, rows, cols, n_rows, n_cols), a program's own rows of one head;
# - `docs`: (segment-id row pointer, block ranges pointer, block, batch), a program's document-mask
#   inputs (`_segment_range`);
# - `frame`: (anchor, qk_scale, softcap2, window, seq_len), a program's scoring frame;
# - FLAGS: a kernel's specialisation (CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ,
#   CHECK_D), and MASKS: one loop's (HAS_ALIBI, CAUSAL_MASK, CHECK_B, SEGMENT_MASK, WINDOW_MASK,
#   SOFTCAP) (`_masked_scores`), both tuples of constexprs.


@triton.jit
def _tile_ptrs(tensor, batch, head, rows, cols):
    """Pointers to the rows x cols of `tensor`'s (batch, head)."""
    ptr, stride_b, stride_h, stride_s = tensor
    return ptr + batch * stride_b + head * stride_h + rows[:, None] * stride_s + cols[None, :]


@triton.jit
def _load_head_tile(tensor, tile, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """`tensor`'s values at `tile`, 0 past its ends."""
    batch, head, rows, cols, n_rows, n_cols = tile
    ptrs = _tile_ptrs(tensor, batch, head, rows, cols)
    return _load_tile(ptrs, rows, cols, n_rows, n_cols, CHECK_ROWS, CHECK_COLS)


@triton.jit
def _store_head_tile(tensor, values, tile, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    """Stores float32 `values` at `tile` of `tensor`, in its element type."""
    batch, head, rows, cols, n_rows, n_cols = tile
    ptrs = _tile_ptrs(tensor, batch, head, rows, cols)
    values = values.to(tensor[0].dtype.element_ty)
    _store_tile(ptrs, values, rows, cols, n_rows, n_cols, CHECK_ROWS, CHECK_COLS)


@triton.jit
def _masked_scores(
    a,
    b,
    a_pos,
    b_pos,
    a_seg,
    b_seg,
    alibi_slope2,
    frame,
    QUERIES_FIRST: tl.constexpr,
    MASKS: tl.constexpr,
):
    """Log2-domain scores of one tile pair, rows of `a` against rows of `b`: queries x keys when
    QUERIES_FIRST, else keys x queries (the dK/dV kernel's transposed view). ALiBi is taken relative
    to the frame's `anchor`; masked entries are MASKED. CHECK_B masks rows of `b` past the sequence
    end (a's are never stored); WINDOW_MASK the pairs with query - key >= window. With SOFTCAP the
    scores are softcap2 * tanh(a . b * qk_scale / 2) (see `_score_scales`)."""
    anchor, qk_scale, softcap2, window, seq_len = frame
    HAS_ALIBI, CAUSAL_MASK, CHECK_B, SEGMENT_MASK, WINDOW_MASK, SOFTCAP = MASKS
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
def _query_program(heads, CAUSAL: tl.constexpr):
    """(query block, batch x head, batch, head) of a forward or dQ program. Causal programs take the
    query blocks last to first: the last ones have the most keys, and started first they leave no SM
    idle at the end."""
    block = tl.program_id(0)
    if CAUSAL:
        block = tl.num_programs(0) - 1 - block
    batch_head = tl.program_id(1)
    return block, batch_head, batch_head // heads, batch_head % heads


@triton.jit
def _key_tiles(k, v, batch, kv_head, offs_n, offs_d, head_dim):
    """What a query block's loops stream, from the tensors k and v: (K and V pointers at key 0 of
    the (batch, kv head), their seq strides, the key offsets of a block, offs_d, head_dim)."""
    k_ptrs = _tile_ptrs(k, batch, kv_head, offs_n, offs_d)
    v_ptrs = _tile_ptrs(v, batch, kv_head, offs_n, offs_d)
    return k_ptrs, v_ptrs, k[3], v[3], offs_n, offs_d, head_dim


@triton.jit
def _key_spans(
    docs, offs_m, frame, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLAGS: tl.constexpr
):
    """The key blocks of the query block at `offs_m` (forward and dQ) before its diagonal, as the
    positions (lo, full_lo, full_hi, hi, window_full) that `_visit_key_blocks` takes, and its
    queries' segment ids. Keys before the block's first query are visible to all its queries
    (causal); the diagonal comes last. A sliding window (causal only) starts the region at its first
    key block, and its keys lie inside every query's window from `window_full` on."""
    CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D = FLAGS
    anchor, qk_scale, softcap2, window, seq_len = frame
    seg_row_ptr, ranges_ptr, block, batch = docs
    region_lo = 0
    region_hi = anchor if CAUSAL else seq_len
    window_full = region_lo
    if WINDOW:
        region_lo, window_full = _window_keys(anchor, window, region_hi, BLOCK_M, BLOCK_N)
    lo, full_lo, full_hi, hi, seg_q = _segment_range(
        seg_row_ptr, ranges_ptr, block, batch, offs_m, seq_len, region_lo, region_hi, HAS_SEGMENTS
    )
    return (lo, full_lo, full_hi, hi, window_full), seg_q


@triton.jit
def _visit_key_blocks(
    STEP: tl.constexpr,
    state,
    queries,
    kv_tiles,
    frame,
    spans,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    FLAGS: tl.constexpr,
):
    """`state` through STEP (`_forward_key_blocks` or `_backward_q_key_blocks`) of one query block
    over the key blocks in `spans` (`_key_spans`), each run with the masks it needs: the masked
    blocks before the unmasked run (the document range's start, the window's edge), the run, the
    document range's masked end, the diagonal last. `queries` holds STEP's operands, the queries'
    positions, segment ids and ALiBi slope and the row's segment ids; `kv_tiles` the keys'
    (`_key_tiles`)."""
    CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D = FLAGS
    lo, full_lo, full_hi, hi, window_full = spans
    anchor, qk_scale, softcap2, window, seq_len = frame
    if WINDOW:
        # The window's edge joins the masked blocks before the unmasked run (one loop: another
        # would spill scalar registers on gfx90a).
        full_lo = tl.maximum(full_lo, window_full)
        full_hi = tl.maximum(full_hi, window_full)
    if HAS_SEGMENTS or WINDOW:
        masks = (HAS_ALIBI, False, CHECK_SEQ and not CAUSAL, HAS_SEGMENTS, WINDOW, SOFTCAP)
        state = STEP(
            state, queries, kv_tiles, frame, lo, tl.minimum(full_lo, hi), BLOCK_N, masks, CHECK_D
        )
    masks = (HAS_ALIBI, False, CHECK_SEQ and not (CAUSAL or HAS_SEGMENTS), False, False, SOFTCAP)
    state = STEP(state, queries, kv_tiles, frame, full_lo, full_hi, BLOCK_N, masks, CHECK_D)
    if HAS_SEGMENTS:
        masks = (HAS_ALIBI, False, CHECK_SEQ and not CAUSAL, True, False, SOFTCAP)
        state = STEP(state, queries, kv_tiles, frame, full_hi, hi, BLOCK_N, masks, CHECK_D)
    if CAUSAL:  # with the window's mask too, for a window narrower than the block
        masks = (HAS_ALIBI, True, CHECK_SEQ, HAS_SEGMENTS, WINDOW, SOFTCAP)
        diagonal_end = tl.minimum(anchor + BLOCK_M, seq_len)
        state = STEP(state, queries, kv_tiles, frame, anchor, diagonal_end, BLOCK_N, masks, CHECK_D)
    return state


@triton.jit
def _forward_key_blocks(
    state,
    queries,
    kv_tiles,
    frame,
    lo,
    hi,
    BLOCK_N: tl.constexpr,
    MASKS: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """Online softmax over the key blocks [lo, hi) for one query block: `state` is (acc, row_sum,
    row_max), `queries` (Q, positions, segment ids, ALiBi slope, the row's segment ids)."""
    acc, row_sum, row_max = state
    q, offs_m, seg_q, alibi_slope2, seg_row_ptr = queries
    k_ptrs, v_ptrs, stride_ks, stride_vs, offs_n, offs_d, head_dim = kv_tiles
    HAS_ALIBI, CAUSAL_MASK, CHECK_KEYS, SEGMENT_MASK, WINDOW_MASK, SOFTCAP = MASKS
    seq_len = frame[4]
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        seg_k = keys
        if SEGMENT_MASK:
            seg_k = tl.load(seg_row_ptr + keys, mask=keys < seq_len, other=-1)
        k = _load_tile(
            k_ptrs + start_n * stride_ks, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        scores = _masked_scores(q, k, offs_m, keys, seg_q, seg_k, alibi_slope2, frame, True, MASKS)
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
    """One query block of one head: its output rows and their log-sum-exp."""
    flags = (CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D)
    block, batch_head, batch, head = _query_program(heads, CAUSAL)
    kv_head = head // group
    anchor = block * BLOCK_M
    offs_m = anchor + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    own = (batch, head, offs_m, offs_d, seq_len, head_dim)
    q = _load_head_tile((q_ptr, stride_qb, stride_qh, stride_qs), own, CHECK_SEQ, CHECK_D)
    k = (k_ptr, stride_kb, stride_kh, stride_ks)
    v = (v_ptr, stride_vb, stride_vh, stride_vs)
    kv_tiles = _key_tiles(k, v, batch, kv_head, offs_n, offs_d, head_dim)
    alibi_slope2 = 0.0
    if HAS_ALIBI:
        alibi_slope2 = tl.load(slopes_ptr + head)
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    frame = (anchor, qk_scale, softcap2, window, seq_len)
    docs = (seg_row_ptr, ranges_ptr, block, batch)
    spans, seg_q = _key_spans(docs, offs_m, frame, BLOCK_M, BLOCK_N, flags)

    row_max = tl.full([BLOCK_M], MASKED, dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    state = (acc, row_sum, row_max)
    queries = (q, offs_m, seg_q, alibi_slope2, seg_row_ptr)
    acc, row_sum, row_max = _visit_key_blocks(
        _forward_key_blocks, state, queries, kv_tiles, frame, spans, BLOCK_M, BLOCK_N, flags
    )

    acc = acc / row_sum[:, None]
    # LSE (log2 domain) in the true (j - i) frame: the scores above carried + slope * (i - anchor).
    lse = row_max + tl.math.log2(row_sum)
    if HAS_ALIBI:
        lse = lse - alibi_slope2 * (offs_m - anchor).to(tl.float32)
    _store_rows(lse_ptr + batch_head * seq_len + offs_m, lse, offs_m, seq_len, CHECK_SEQ)
    _store_head_tile((o_ptr, stride_ob, stride_oh, stride_os), acc, own, CHECK_SEQ, CHECK_D)


@triton.jit
def _query_spans(
    docs, offs_n, frame, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FLAGS: tl.constexpr
):
    """The query blocks of the key block at `offs_n` (dK/dV), as the positions (lo, window_full,
    hi, diagonal_end) that `_visit_query_blocks` takes, and its keys' segment ids. Queries after
    the key block see all of it (causal); the diagonal queries [anchor, diagonal_end) need the
    causal mask. A sliding window (causal only) ends the region at the last query block that sees a
    key of the block, and needs its mask from `window_full` on."""
    CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D = FLAGS
    anchor, qk_scale, softcap2, window, seq_len = frame
    seg_row_ptr, ranges_ptr, block, batch = docs
    diagonal_end = tl.minimum(anchor + BLOCK_N, seq_len)
    region_lo = diagonal_end if CAUSAL else 0
    region_hi = seq_len
    window_full = region_hi
    if WINDOW:
        window_full, region_hi = _window_queries(
            anchor, window, region_lo, seq_len, BLOCK_M, BLOCK_N
        )
    lo, _, _, hi, seg_k = _segment_range(
        seg_row_ptr, ranges_ptr, block, batch, offs_n, seq_len, region_lo, region_hi, HAS_SEGMENTS
    )
    return (lo, window_full, hi, diagonal_end), seg_k


@triton.jit
def _query_tiles(q, do, batch, first_head, offs_m, offs_d, head_dim):
    """What a key block's loop streams, from the tensors q and dO: (Q and dO pointers at query 0 of
    the group's first head, their head and seq strides, the query offsets of a block, offs_d,
    head_dim)."""
    q_ptrs = _tile_ptrs(q, batch, first_head, offs_m, offs_d)
    do_ptrs = _tile_ptrs(do, batch, first_head, offs_m, offs_d)
    return q_ptrs, do_ptrs, q[2], q[3], do[2], do[3], offs_m, offs_d, head_dim


@triton.jit
def _visit_query_blocks(
    keys, q_tiles, q_rows, frame, spans, group, BLOCK_M: tl.constexpr, FLAGS: tl.constexpr
):
    """dK, dV of one key block, `keys` = (K, V, positions, segment ids), through
    `_backward_kv_query_blocks` over the query blocks in `spans` (`_query_spans`) of the `group`
    query heads that share it, each run with the masks it needs. `q_tiles` is what the loop streams
    (`_query_tiles`), `q_rows` the LSE and delta pointers at the group's first head, the ALiBi slopes
    and that head, and the row's segment ids."""
    CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D = FLAGS
    lo, window_full, hi, diagonal_end = spans
    anchor = frame[0]
    k = keys[0]
    state = (tl.zeros(k.shape, dtype=tl.float32), tl.zeros(k.shape, dtype=tl.float32))
    args = (keys, q_tiles, q_rows, frame, group)
    if HAS_SEGMENTS:
        # The diagonal and the document range in one loop, every block masked. Split into the masked
        # ends and the unmasked run (as the forward and dQ kernels run theirs), the kernel needed 2
        # pipeline stages to compile without spills; as one loop it runs 3, which measured 1.06x
        # forward+backward on packed rows (docs/benchmark-log.md).
        start = anchor if CAUSAL else lo
        masks = (HAS_ALIBI, CAUSAL, CHECK_SEQ, True, WINDOW, SOFTCAP)
        state = _backward_kv_query_blocks(state, args, start, hi, BLOCK_M, masks, CHECK_D)
    else:
        if CAUSAL:
            masks = (HAS_ALIBI, True, CHECK_SEQ, False, WINDOW, SOFTCAP)
            state = _backward_kv_query_blocks(
                state, args, anchor, diagonal_end, BLOCK_M, masks, CHECK_D
            )
        masks = (HAS_ALIBI, False, CHECK_SEQ, False, False, SOFTCAP)
        state = _backward_kv_query_blocks(state, args, lo, window_full, BLOCK_M, masks, CHECK_D)
        if WINDOW:
            masks = (HAS_ALIBI, False, CHECK_SEQ, False, True, SOFTCAP)
            state = _backward_kv_query_blocks(state, args, window_full, hi, BLOCK_M, masks, CHECK_D)
    return state


@triton.jit
def _backward_kv_query_blocks(
    state, args, lo, hi, BLOCK_M: tl.constexpr, MASKS: tl.constexpr, CHECK_D: tl.constexpr
):
    """dK, dV (`state`) of one key block from the query blocks [lo, hi) of every query head of its
    group (keys x queries); `args` as `_visit_query_blocks` takes them. One flat loop over (head,
    query block) pairs rather than a loop over heads around a loop over blocks: in the nest, the
    compiler kept per-head values live across the inner loop and the GQA kernels spilled (sm90,
    D=128, 32 x 64 tiles: 504 bytes with two or more heads per group, none with one); flat, they
    compile as one head does."""
    dk, dv = state
    keys, q_tiles, q_rows, frame, group = args
    k, v, offs_n, seg_k = keys
    q_ptrs, do_ptrs, stride_qh, stride_qs, stride_doh, stride_dos, offs_m, offs_d, head_dim = (
        q_tiles
    )
    lse_ptr, delta_ptr, slopes_ptr, first_head, seg_row_ptr = q_rows
    HAS_ALIBI, CAUSAL_MASK, CHECK_QUERIES, SEGMENT_MASK, WINDOW_MASK, SOFTCAP = MASKS
    anchor, qk_scale, softcap2, window, seq_len = frame
    member = 0
    start_m = lo
    for _ in tl.range(0, group * tl.cdiv(hi - lo, BLOCK_M)):
        queries = start_m + offs_m
        seg_q = queries
        if SEGMENT_MASK:
            seg_q = tl.load(seg_row_ptr + queries, mask=queries < seq_len, other=-1)
        q_block = q_ptrs + member * stride_qh + start_m * stride_qs
        q = _load_tile(q_block, queries, offs_d, seq_len, head_dim, CHECK_QUERIES, CHECK_D)
        rows = member * seq_len + queries
        lse = _load_rows(lse_ptr + rows, queries, seq_len, CHECK_QUERIES)
        delta = _load_rows(delta_ptr + rows, queries, seq_len, CHECK_QUERIES)
        alibi_slope2 = 0.0
        if HAS_ALIBI:  # into this kernel's frame, anchored at the key block
            # float32 also where the pointer is a placeholder of q's dtype: a flag unpacked from
            # a tuple makes this `if` a runtime one, whose branches must agree in type
            alibi_slope2 = tl.load(slopes_ptr + first_head + member).to(tl.float32)
            lse = lse + alibi_slope2 * (queries - anchor).to(tl.float32)
        scores_t = _masked_scores(
            k, q, offs_n, queries, seg_k, seg_q, alibi_slope2, frame, False, MASKS
        )
        p_t = tl.math.exp2(scores_t - lse[None, :])
        dp_factor_t = p_t
        if SOFTCAP:  # at once, so that the scores need not stay live
            dp_factor_t = _through_cap(p_t, scores_t, softcap2)
        do_block = do_ptrs + member * stride_doh + start_m * stride_dos
        do = _load_tile(do_block, queries, offs_d, seq_len, head_dim, CHECK_QUERIES, CHECK_D)
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
    flags = (CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D)
    block = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    anchor = block * BLOCK_N
    offs_n = anchor + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    own = (batch, kv_head, offs_n, offs_d, seq_len, head_dim)
    k = _load_head_tile((k_ptr, stride_kb, stride_kh, stride_ks), own, CHECK_SEQ, CHECK_D)
    v = _load_head_tile((v_ptr, stride_vb, stride_vh, stride_vs), own, CHECK_SEQ, CHECK_D)
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    frame = (anchor, qk_scale, softcap2, window, seq_len)
    docs = (seg_row_ptr, ranges_ptr, block, batch)
    spans, seg_k = _query_spans(docs, offs_n, frame, BLOCK_M, BLOCK_N, flags)

    first_head = kv_head * group
    q = (q_ptr, stride_qb, stride_qh, stride_qs)
    do = (do_ptr, stride_dob, stride_doh, stride_dos)
    q_tiles = _query_tiles(q, do, batch, first_head, offs_m, offs_d, head_dim)
    row_offset = (batch * heads + first_head) * seq_len  # lse, delta: a group's heads adjacent
    q_rows = (lse_ptr + row_offset, delta_ptr + row_offset, slopes_ptr, first_head, seg_row_ptr)
    keys = (k, v, offs_n, seg_k)
    dk, dv = _visit_query_blocks(keys, q_tiles, q_rows, frame, spans, group, BLOCK_M, flags)
    dk = dk * sm_scale
    _store_head_tile((dk_ptr, stride_dkb, stride_dkh, stride_dks), dk, own, CHECK_SEQ, CHECK_D)
    _store_head_tile((dv_ptr, stride_dvb, stride_dvh, stride_dvs), dv, own, CHECK_SEQ, CHECK_D)


@triton.jit
def _backward_q_key_blocks(
    dq,
    queries,
    kv_tiles,
    frame,
    lo,
    hi,
    BLOCK_N: tl.constexpr,
    MASKS: tl.constexpr,
    CHECK_D: tl.constexpr,
):
    """dQ of one query block from the key blocks [lo, hi); `queries` is ((Q, dO, LSE, delta),
    positions, segment ids, ALiBi slope, the row's segment ids), the LSE already carrying the
    block's ALiBi row term."""
    operands, offs_m, seg_q, alibi_slope2, seg_row_ptr = queries
    q, do, lse, delta = operands
    k_ptrs, v_ptrs, stride_ks, stride_vs, offs_n, offs_d, head_dim = kv_tiles
    HAS_ALIBI, CAUSAL_MASK, CHECK_KEYS, SEGMENT_MASK, WINDOW_MASK, SOFTCAP = MASKS
    softcap2 = frame[2]
    seq_len = frame[4]
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        seg_k = keys
        if SEGMENT_MASK:
            seg_k = tl.load(seg_row_ptr + keys, mask=keys < seq_len, other=-1)
        k = _load_tile(
            k_ptrs + start_n * stride_ks, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D
        )
        scores = _masked_scores(q, k, offs_m, keys, seg_q, seg_k, alibi_slope2, frame, True, MASKS)
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
def _delta_and_lse(
    o, do, lse_ptr, delta_ptr, slopes_ptr, batch_head, head, offs_m, frame, FLAGS: tl.constexpr
):
    """The dQ program's row terms: stores delta = rowsum(dO * O) of its block for the dK/dV kernel
    that runs after it, since it holds dO anyway (one pass over dO and one launch fewer), and
    returns it with the block's LSE in its own ALiBi frame and the ALiBi slope."""
    CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D = FLAGS
    anchor, qk_scale, softcap2, window, seq_len = frame
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    # Stored inline rather than by `_store_rows`, which would compute the mask after the pointers
    # and reorder the compiled code.
    if CHECK_SEQ:
        tl.store(delta_ptr + batch_head * seq_len + offs_m, delta, mask=offs_m < seq_len)
    else:
        tl.store(delta_ptr + batch_head * seq_len + offs_m, delta)
    lse = _load_rows(lse_ptr + batch_head * seq_len + offs_m, offs_m, seq_len, CHECK_SEQ)
    alibi_slope2 = 0.0
    if HAS_ALIBI:  # a runtime `if` (the flag comes from a tuple): both branches float32
        alibi_slope2 = tl.load(slopes_ptr + head).to(tl.float32)
        lse = lse + alibi_slope2 * (offs_m - anchor).to(tl.float32)
    return delta, lse, alibi_slope2


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
    """dQ of one query block, and its delta for the dK/dV kernel (`_delta_and_lse`)."""
    flags = (CAUSAL, HAS_ALIBI, HAS_SEGMENTS, WINDOW, SOFTCAP, CHECK_SEQ, CHECK_D)
    block, batch_head, batch, head = _query_program(heads, CAUSAL)  # as in the forward
    kv_head = head // group
    anchor = block * BLOCK_M
    offs_m = anchor + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    own = (batch, head, offs_m, offs_d, seq_len, head_dim)
    q = _load_head_tile((q_ptr, stride_qb, stride_qh, stride_qs), own, CHECK_SEQ, CHECK_D)
    do = _load_head_tile((do_ptr, stride_dob, stride_doh, stride_dos), own, CHECK_SEQ, CHECK_D)
    o = _load_head_tile((o_ptr, stride_ob, stride_oh, stride_os), own, CHECK_SEQ, CHECK_D)
    frame = (anchor, qk_scale, softcap2, window, seq_len)
    delta, lse, alibi_slope2 = _delta_and_lse(
        o, do, lse_ptr, delta_ptr, slopes_ptr, batch_head, head, offs_m, frame, flags
    )
    seg_row_ptr = seg_ptr + batch * stride_seg_b
    docs = (seg_row_ptr, ranges_ptr, block, batch)
    spans, seg_q = _key_spans(docs, offs_m, frame, BLOCK_M, BLOCK_N, flags)  # as in the forward
    k = (k_ptr, stride_kb, stride_kh, stride_ks)
    v = (v_ptr, stride_vb, stride_vh, stride_vs)
    kv_tiles = _key_tiles(k, v, batch, kv_head, offs_n, offs_d, head_dim)
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    queries = ((q, do, lse, delta), offs_m, seg_q, alibi_slope2, seg_row_ptr)
    dq = _visit_key_blocks(
        _backward_q_key_blocks, dq, queries, kv_tiles, frame, spans, BLOCK_M, BLOCK_N, flags
    )
    dq = dq * sm_scale
    _store_head_tile((dq_ptr, stride_dqb, stride_dqh, stride_dqs), dq, own, CHECK_SEQ, CHECK_D)


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


def _strides(*tensors: torch.Tensor) -> list[int]:
    """The (batch, head, seq) strides of each (batch, heads, seq, head_dim) tensor, in order: the
    kernels' stride arguments."""
    return [stride for tensor in tensors for stride in tensor.stride()[:3]]


class _Options(NamedTuple):
    """What an attention call asks for besides q, k and v, checked, with its launch configurations
    (`_options`); the autograd functions pass it on as one argument."""

    causal: bool
    alibi_slopes: Optional[torch.Tensor]
    segment_ids: Optional[torch.Tensor]
    softmax_scale: Optional[float]
    sliding_window: Optional[int]
    softcap: Optional[float]
    configs: AttentionConfigs


def _launch_forward(
    ctx, q, k, v, options: _Options
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The forward kernel; keeps the settings and document blocks on `ctx`. Returns the output (laid
    out like q), the log-sum-exp and the scaled slopes: tensors the caller saves for the backward
    with `save_for_backward` (an output kept on `ctx` would hold its own graph alive)."""
    causal, alibi_slopes, segment_ids, softmax_scale, sliding_window, softcap, configs = options
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
        *_strides(q, k, v, out),
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
    scalars = (seq_len, head_dim, qk_scale, sm_scale, softcap2, window)  # both kernels' last ones
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
        *_strides(q, k, v, out, grad_out, dq),
        segments.stride(0),
        heads,
        heads // kv_heads,
        *scalars,
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
        *_strides(q, k, v, grad_out, dk, dv),
        segments.stride(0),
        heads,
        kv_heads,
        heads // kv_heads,
        *scalars,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        **flags,
        **cfg.launch_options(arch),
    )


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, options):
        out, lse, slopes2 = _launch_forward(ctx, q, k, v, options)
        ctx.save_for_backward(q, k, v, out, lse, slopes2)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, *attention = ctx.saved_tensors
        # Laid out like q, k, v (see the forward's output): their projections' gradients then need
        # no copy either.
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        _launch_backward(ctx, q, k, v, *attention, grad_out, dq, dk, dv)
        return dq, dk, dv, None


class _StackedFlashAttention(torch.autograd.Function):
    """Attention over q, k, v held side by side in one tensor (one projection made them): the
    backward writes their gradients side by side into one tensor too, where three separate gradients
    would be copied into one by autograd to reach the projection."""

    @staticmethod
    def forward(ctx, qkv, heads, head_dim, options):
        out, lse, slopes2 = _launch_forward(ctx, *unstack_qkv(qkv, heads, head_dim), options)
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
        return grad_qkv, None, None, None


def _options(
    q, k, v, causal, alibi_slopes, segment_ids, softmax_scale, sliding_window, softcap, configs
) -> _Options:
    """The call's options, checked, with the launch configurations for q's device and head size
    (`configs` overrides the table) specialised to them."""
    _check_inputs(q, k, v, causal, alibi_slopes, segment_ids, sliding_window, softcap)
    configs = (configs or attention_configs(current_arch(q.device), q.shape[-1])).specialised(
        segment_ids is not None, _window(sliding_window, q.shape[2]) > 0, softcap is not None
    )
    return _Options(
        causal, alibi_slopes, segment_ids, softmax_scale, sliding_window, softcap, configs
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
    options = _options(
        q, k, v, causal, alibi_slopes, segment_ids, softmax_scale, sliding_window, softcap, configs
    )
    return _FlashAttention.apply(q, k, v, options)


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
    options = _options(
        q, k, v, causal, alibi_slopes, segment_ids, softmax_scale, sliding_window, softcap, configs
    )
    return _StackedFlashAttention.apply(qkv, heads, head_dim, options)
