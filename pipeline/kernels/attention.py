"""FlashAttention-2 in Triton with ALiBi, causal and document masks, GQA: forward and backward.

Imported only when a call runs the Triton backend (pipeline.kernels dispatches), so the package works
with torch alone. Layout (batch, heads, seq, head_dim) like SDPA; k and v may have fewer heads.

Forward: one program per (query block, batch x head) streams key blocks with an online softmax in
float32 and stores the log-sum-exp (LSE) per row. Backward recomputes the probabilities from the LSE,
never storing attention: a preprocess computes delta = rowsum(dO * O); one program per key block and
kv head accumulates dK and dV over the query blocks of every query head of its group (GQA sums in
registers, no atomics: deterministic); another program per query block accumulates dQ. That is 7 matrix
products per tile pair against the 5 of a FlashAttention-2 backward that adds dQ with float32 atomics inside
the dK/dV loop; such a variant was built and timed on an H100 (Triton 3.6) and was slower at every tiling that
compiles without register spills (it needs 64 queries x 128 keys to win, +5%, and that spills 752 bytes):
BENCHMARKS.md, "Attention", has the figures.

Scores live in the log2 domain (exp2 is the native instruction): log2(e) is folded into the softmax
scale and into the ALiBi slope. ALiBi adds slope * (j - i); a kernel adds slope * (j - anchor) with
`anchor` the first position of its own block instead, which differs by a constant per row (softmax
ignores it) and costs one fused multiply-add per score, like no bias at all. The LSE is stored in the
true (j - i) frame, so each kernel can pick its own anchor. Causal loops run the key blocks wholly below
the diagonal without a mask and only the diagonal blocks with one; document masks (segment ids) skip
key blocks whose segment ids cannot match any query of the block.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import triton
import triton.language as tl

from pipeline.kernels.launch_configs import AttentionConfigs, attention_configs, current_arch

LOG2E = 1.4426950408889634
# Masked scores in the forward: finite, so that a row whose first key blocks are all masked gives
# exp2(0) = 1 garbage that the next real maximum rescales to exactly 0 (no inf - inf = NaN).
MASKED = tl.constexpr(-1.0e30)


@triton.jit
def _load_tile(ptrs, rows, cols, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
    if CHECK_ROWS:
        if CHECK_COLS:
            tile = tl.load(ptrs, mask=(rows[:, None] < n_rows) & (cols[None, :] < n_cols), other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
    else:
        if CHECK_COLS:
            tile = tl.load(ptrs, mask=cols[None, :] < n_cols, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _store_tile(ptrs, tile, rows, cols, n_rows, n_cols, CHECK_ROWS: tl.constexpr, CHECK_COLS: tl.constexpr):
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
def _forward_key_blocks(acc, row_sum, row_max, q, k_ptrs, v_ptrs, stride_k_seq, stride_v_seq, seg_k_ptr,
                        seg_q, seg_q_min, seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale,
                        seq_len, head_dim, lo, hi,
                        BLOCK_N: tl.constexpr, MASK_DIAGONAL: tl.constexpr, CHECK_KEYS: tl.constexpr,
                        CHECK_D: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr):
    """Online softmax over the key blocks [lo, hi) for one query block."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        active = True
        if HAS_SEGMENTS:
            seg_k = tl.load(seg_k_ptr + keys, mask=keys < seq_len, other=-1)
            active = (tl.max(seg_k, 0) >= seg_q_min) & (tl.min(seg_k, 0) <= seg_q_max)
        if active:
            k = _load_tile(k_ptrs + start_n * stride_k_seq, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D)
            scores = tl.dot(q, tl.trans(k))
            if HAS_ALIBI:
                scores = scores * qk_scale + (alibi_slope2 * (keys - anchor).to(tl.float32))[None, :]
            else:
                scores = scores * qk_scale
            if MASK_DIAGONAL:
                scores = tl.where(offs_m[:, None] >= keys[None, :], scores, MASKED)
            if CHECK_KEYS:
                scores = tl.where(keys[None, :] < seq_len, scores, MASKED)
            if HAS_SEGMENTS:
                scores = tl.where(seg_q[:, None] == seg_k[None, :], scores, MASKED)
            new_max = tl.maximum(row_max, tl.max(scores, 1))
            p = tl.math.exp2(scores - new_max[:, None])
            rescale = tl.math.exp2(row_max - new_max)
            row_sum = row_sum * rescale + tl.sum(p, 1)
            v = _load_tile(v_ptrs + start_n * stride_v_seq, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D)
            acc = tl.dot(p.to(v.dtype), v, acc * rescale[:, None])
            row_max = new_max
    return acc, row_sum, row_max


@triton.jit
def _attention_forward(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, slopes_ptr, seg_ptr,
                       stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                       stride_vb, stride_vh, stride_vs, stride_ob, stride_oh, stride_os, stride_seg_b,
                       heads, group, seq_len, head_dim, qk_scale,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, CAUSAL: tl.constexpr,
                       HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr, CHECK_SEQ: tl.constexpr,
                       CHECK_D: tl.constexpr):
    block = tl.program_id(0)
    if CAUSAL:  # the last query blocks have the most keys: start them first so that no SM idles at the end
        block = tl.num_programs(0) - 1 - block
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    kv_head = head // group
    anchor = block * BLOCK_M
    offs_m = anchor + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)

    q_ptrs = q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
    q = _load_tile(q_ptrs, offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    k_ptrs = k_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = v_ptr + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]

    alibi_slope2 = 0.0
    if HAS_ALIBI:
        alibi_slope2 = tl.load(slopes_ptr + head).to(tl.float32) * 1.4426950408889634
    seg_k_ptr = seg_ptr + batch * stride_seg_b
    seg_q = offs_m
    seg_q_min = 0
    seg_q_max = 0
    if HAS_SEGMENTS:
        seg_q = tl.load(seg_k_ptr + offs_m, mask=offs_m < seq_len, other=-2)
        seg_q_min = tl.min(tl.where(offs_m < seq_len, seg_q, 2147483647), 0)
        seg_q_max = tl.max(seg_q, 0)

    row_max = tl.full([BLOCK_M], MASKED, dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        # Keys before the block's first query: visible to every query of the block, no mask, no bounds check.
        acc, row_sum, row_max = _forward_key_blocks(
            acc, row_sum, row_max, q, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q, seg_q_min,
            seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale, seq_len, head_dim, 0, anchor,
            BLOCK_N, False, False, CHECK_D, HAS_ALIBI, HAS_SEGMENTS)
        acc, row_sum, row_max = _forward_key_blocks(
            acc, row_sum, row_max, q, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q, seg_q_min,
            seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale, seq_len, head_dim, anchor,
            tl.minimum(anchor + BLOCK_M, seq_len), BLOCK_N, True, CHECK_SEQ, CHECK_D, HAS_ALIBI, HAS_SEGMENTS)
    else:
        acc, row_sum, row_max = _forward_key_blocks(
            acc, row_sum, row_max, q, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q, seg_q_min,
            seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale, seq_len, head_dim, 0, seq_len,
            BLOCK_N, False, CHECK_SEQ, CHECK_D, HAS_ALIBI, HAS_SEGMENTS)

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
    o_ptrs = o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :]
    _store_tile(o_ptrs, acc.to(o_ptr.dtype.element_ty), offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)


@triton.jit
def _attention_backward_delta(o_ptr, do_ptr, delta_ptr, stride_ob, stride_oh, stride_os, stride_dob, stride_doh,
                              stride_dos, heads, seq_len, head_dim,
                              BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """delta = rowsum(dO * O) in float32, the softmax backward's per-row term."""
    block = tl.program_id(0)
    batch_head = tl.program_id(1)
    batch = batch_head // heads
    head = batch_head % heads
    offs_m = block * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_m[:, None] < seq_len) & (offs_d[None, :] < head_dim)
    o = tl.load(o_ptr + batch * stride_ob + head * stride_oh + offs_m[:, None] * stride_os + offs_d[None, :],
                mask=mask, other=0.0)
    do = tl.load(do_ptr + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                 mask=mask, other=0.0)
    delta = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + batch_head * seq_len + offs_m, delta, mask=offs_m < seq_len)


@triton.jit
def _backward_kv_query_blocks(dk, dv, k, v, q_ptrs, do_ptrs, stride_qs, stride_dos, lse_ptr, delta_ptr, seg_q_ptr,
                              seg_k, seg_k_min, seg_k_max, offs_n, offs_m, offs_d, alibi_slope2, anchor, qk_scale,
                              seq_len, head_dim, lo, hi,
                              BLOCK_M: tl.constexpr, MASK_DIAGONAL: tl.constexpr, CHECK_QUERIES: tl.constexpr,
                              CHECK_D: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr):
    """dK, dV of one key block from the query blocks [lo, hi) of one query head (scores transposed: keys x queries)."""
    key_bias = tl.zeros_like(offs_n).to(tl.float32)
    if HAS_ALIBI:
        key_bias = alibi_slope2 * (offs_n - anchor).to(tl.float32)
    for start_m in tl.range(lo, hi, BLOCK_M):
        queries = start_m + offs_m
        active = True
        if HAS_SEGMENTS:
            seg_q = tl.load(seg_q_ptr + queries, mask=queries < seq_len, other=-1)
            active = (tl.max(seg_q, 0) >= seg_k_min) & (tl.min(seg_q, 0) <= seg_k_max)
        if active:
            q = _load_tile(q_ptrs + start_m * stride_qs, queries, offs_d, seq_len, head_dim, CHECK_QUERIES, CHECK_D)
            if CHECK_QUERIES:
                lse = tl.load(lse_ptr + queries, mask=queries < seq_len, other=0.0)
                delta = tl.load(delta_ptr + queries, mask=queries < seq_len, other=0.0)
            else:
                lse = tl.load(lse_ptr + queries)
                delta = tl.load(delta_ptr + queries)
            if HAS_ALIBI:
                lse = lse + alibi_slope2 * (queries - anchor).to(tl.float32)
            scores_t = tl.dot(k, tl.trans(q)) * qk_scale
            if HAS_ALIBI:
                scores_t = scores_t + key_bias[:, None]
            scores_t = scores_t - lse[None, :]
            if MASK_DIAGONAL:
                scores_t = tl.where(queries[None, :] >= offs_n[:, None], scores_t, float("-inf"))
            if CHECK_QUERIES:
                scores_t = tl.where(queries[None, :] < seq_len, scores_t, float("-inf"))
            if HAS_SEGMENTS:
                scores_t = tl.where(seg_k[:, None] == seg_q[None, :], scores_t, float("-inf"))
            p_t = tl.math.exp2(scores_t)
            do = _load_tile(do_ptrs + start_m * stride_dos, queries, offs_d, seq_len, head_dim, CHECK_QUERIES,
                            CHECK_D)
            dv = tl.dot(p_t.to(do.dtype), do, dv)
            dp_t = tl.dot(v, tl.trans(do))
            ds_t = p_t * (dp_t - delta[None, :])
            dk = tl.dot(ds_t.to(q.dtype), q, dk)
    return dk, dv


@triton.jit
def _attention_backward_kv(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr, slopes_ptr, seg_ptr,
                           stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                           stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
                           stride_dkb, stride_dkh, stride_dks, stride_dvb, stride_dvh, stride_dvs, stride_seg_b,
                           heads, kv_heads, group, seq_len, head_dim, qk_scale, sm_scale,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                           CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                           CHECK_SEQ: tl.constexpr, CHECK_D: tl.constexpr):
    block = tl.program_id(0)
    batch_kv_head = tl.program_id(1)
    batch = batch_kv_head // kv_heads
    kv_head = batch_kv_head % kv_heads
    anchor = block * BLOCK_N
    offs_n = anchor + tl.arange(0, BLOCK_N)
    offs_m = tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)

    k = _load_tile(k_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :],
                   offs_n, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    v = _load_tile(v_ptr + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :],
                   offs_n, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    seg_q_ptr = seg_ptr + batch * stride_seg_b
    seg_k = offs_n
    seg_k_min = 0
    seg_k_max = 0
    if HAS_SEGMENTS:
        seg_k = tl.load(seg_q_ptr + offs_n, mask=offs_n < seq_len, other=-2)
        seg_k_min = tl.min(tl.where(offs_n < seq_len, seg_k, 2147483647), 0)
        seg_k_max = tl.max(seg_k, 0)

    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    for member in range(0, group):
        head = kv_head * group + member
        alibi_slope2 = 0.0
        if HAS_ALIBI:
            alibi_slope2 = tl.load(slopes_ptr + head).to(tl.float32) * 1.4426950408889634
        q_ptrs = q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :]
        do_ptrs = do_ptr + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :]
        row_offset = (batch * heads + head) * seq_len
        if CAUSAL:
            # Queries of the diagonal blocks need the causal mask; every later query sees the whole key block.
            diagonal_end = tl.minimum(anchor + BLOCK_N, seq_len)
            dk, dv = _backward_kv_query_blocks(
                dk, dv, k, v, q_ptrs, do_ptrs, stride_qs, stride_dos, lse_ptr + row_offset, delta_ptr + row_offset,
                seg_q_ptr, seg_k, seg_k_min, seg_k_max, offs_n, offs_m, offs_d, alibi_slope2, anchor, qk_scale,
                seq_len, head_dim, anchor, diagonal_end, BLOCK_M, True, CHECK_SEQ, CHECK_D, HAS_ALIBI,
                HAS_SEGMENTS)
            dk, dv = _backward_kv_query_blocks(
                dk, dv, k, v, q_ptrs, do_ptrs, stride_qs, stride_dos, lse_ptr + row_offset, delta_ptr + row_offset,
                seg_q_ptr, seg_k, seg_k_min, seg_k_max, offs_n, offs_m, offs_d, alibi_slope2, anchor, qk_scale,
                seq_len, head_dim, diagonal_end, seq_len, BLOCK_M, False, CHECK_SEQ, CHECK_D, HAS_ALIBI,
                HAS_SEGMENTS)
        else:
            dk, dv = _backward_kv_query_blocks(
                dk, dv, k, v, q_ptrs, do_ptrs, stride_qs, stride_dos, lse_ptr + row_offset, delta_ptr + row_offset,
                seg_q_ptr, seg_k, seg_k_min, seg_k_max, offs_n, offs_m, offs_d, alibi_slope2, anchor, qk_scale,
                seq_len, head_dim, 0, seq_len, BLOCK_M, False, CHECK_SEQ, CHECK_D, HAS_ALIBI, HAS_SEGMENTS)

    dk = dk * sm_scale
    _store_tile(dk_ptr + batch * stride_dkb + kv_head * stride_dkh + offs_n[:, None] * stride_dks + offs_d[None, :],
                dk.to(dk_ptr.dtype.element_ty), offs_n, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    _store_tile(dv_ptr + batch * stride_dvb + kv_head * stride_dvh + offs_n[:, None] * stride_dvs + offs_d[None, :],
                dv.to(dv_ptr.dtype.element_ty), offs_n, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)


@triton.jit
def _backward_q_key_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q, seg_q_min,
                           seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale, seq_len, head_dim,
                           lo, hi,
                           BLOCK_N: tl.constexpr, MASK_DIAGONAL: tl.constexpr, CHECK_KEYS: tl.constexpr,
                           CHECK_D: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr):
    """dQ of one query block from the key blocks [lo, hi); `lse` already carries the block's ALiBi row term."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        keys = start_n + offs_n
        active = True
        if HAS_SEGMENTS:
            seg_k = tl.load(seg_k_ptr + keys, mask=keys < seq_len, other=-1)
            active = (tl.max(seg_k, 0) >= seg_q_min) & (tl.min(seg_k, 0) <= seg_q_max)
        if active:
            k = _load_tile(k_ptrs + start_n * stride_ks, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D)
            scores = tl.dot(q, tl.trans(k)) * qk_scale
            if HAS_ALIBI:
                scores = scores + (alibi_slope2 * (keys - anchor).to(tl.float32))[None, :]
            scores = scores - lse[:, None]
            if MASK_DIAGONAL:
                scores = tl.where(offs_m[:, None] >= keys[None, :], scores, float("-inf"))
            if CHECK_KEYS:
                scores = tl.where(keys[None, :] < seq_len, scores, float("-inf"))
            if HAS_SEGMENTS:
                scores = tl.where(seg_q[:, None] == seg_k[None, :], scores, float("-inf"))
            p = tl.math.exp2(scores)
            v = _load_tile(v_ptrs + start_n * stride_vs, keys, offs_d, seq_len, head_dim, CHECK_KEYS, CHECK_D)
            dp = tl.dot(do, tl.trans(v))
            ds = p * (dp - delta[:, None])
            dq = tl.dot(ds.to(k.dtype), k, dq)
    return dq


@triton.jit
def _attention_backward_q(q_ptr, k_ptr, v_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr, slopes_ptr, seg_ptr,
                          stride_qb, stride_qh, stride_qs, stride_kb, stride_kh, stride_ks,
                          stride_vb, stride_vh, stride_vs, stride_dob, stride_doh, stride_dos,
                          stride_dqb, stride_dqh, stride_dqs, stride_seg_b,
                          heads, group, seq_len, head_dim, qk_scale, sm_scale,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                          CAUSAL: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEGMENTS: tl.constexpr,
                          CHECK_SEQ: tl.constexpr, CHECK_D: tl.constexpr):
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

    q = _load_tile(q_ptr + batch * stride_qb + head * stride_qh + offs_m[:, None] * stride_qs + offs_d[None, :],
                   offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    do = _load_tile(do_ptr + batch * stride_dob + head * stride_doh + offs_m[:, None] * stride_dos + offs_d[None, :],
                    offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)
    if CHECK_SEQ:
        lse = tl.load(lse_ptr + batch_head * seq_len + offs_m, mask=offs_m < seq_len, other=0.0)
        delta = tl.load(delta_ptr + batch_head * seq_len + offs_m, mask=offs_m < seq_len, other=0.0)
    else:
        lse = tl.load(lse_ptr + batch_head * seq_len + offs_m)
        delta = tl.load(delta_ptr + batch_head * seq_len + offs_m)
    alibi_slope2 = 0.0
    if HAS_ALIBI:
        alibi_slope2 = tl.load(slopes_ptr + head).to(tl.float32) * 1.4426950408889634
        lse = lse + alibi_slope2 * (offs_m - anchor).to(tl.float32)
    seg_k_ptr = seg_ptr + batch * stride_seg_b
    seg_q = offs_m
    seg_q_min = 0
    seg_q_max = 0
    if HAS_SEGMENTS:
        seg_q = tl.load(seg_k_ptr + offs_m, mask=offs_m < seq_len, other=-2)
        seg_q_min = tl.min(tl.where(offs_m < seq_len, seg_q, 2147483647), 0)
        seg_q_max = tl.max(seg_q, 0)

    k_ptrs = k_ptr + batch * stride_kb + kv_head * stride_kh + offs_n[:, None] * stride_ks + offs_d[None, :]
    v_ptrs = v_ptr + batch * stride_vb + kv_head * stride_vh + offs_n[:, None] * stride_vs + offs_d[None, :]
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if CAUSAL:
        dq = _backward_q_key_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q,
                                    seg_q_min, seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale,
                                    seq_len, head_dim, 0, anchor, BLOCK_N, False, False, CHECK_D, HAS_ALIBI,
                                    HAS_SEGMENTS)
        dq = _backward_q_key_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q,
                                    seg_q_min, seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale,
                                    seq_len, head_dim, anchor, tl.minimum(anchor + BLOCK_M, seq_len), BLOCK_N, True,
                                    CHECK_SEQ, CHECK_D, HAS_ALIBI, HAS_SEGMENTS)
    else:
        dq = _backward_q_key_blocks(dq, q, do, lse, delta, k_ptrs, v_ptrs, stride_ks, stride_vs, seg_k_ptr, seg_q,
                                    seg_q_min, seg_q_max, offs_m, offs_n, offs_d, alibi_slope2, anchor, qk_scale,
                                    seq_len, head_dim, 0, seq_len, BLOCK_N, False, CHECK_SEQ, CHECK_D, HAS_ALIBI,
                                    HAS_SEGMENTS)
    dq = dq * sm_scale
    _store_tile(dq_ptr + batch * stride_dqb + head * stride_dqh + offs_m[:, None] * stride_dqs + offs_d[None, :],
                dq.to(dq_ptr.dtype.element_ty), offs_m, offs_d, seq_len, head_dim, CHECK_SEQ, CHECK_D)


def _flags(seq_len: int, head_dim: int, configs: AttentionConfigs) -> tuple[int, bool, bool]:
    """(padded head dim, whether any tile crosses the sequence end, whether the head dim is padded)."""
    block_d = max(16, triton.next_power_of_2(head_dim))
    tiles = (configs.forward.block_m, configs.forward.block_n, configs.backward_kv.block_m,
             configs.backward_kv.block_n, configs.backward_q.block_m, configs.backward_q.block_n)
    return block_d, any(seq_len % tile for tile in tiles), block_d != head_dim


def _check_inputs(q, k, v, alibi_slopes, segment_ids) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flash_attention: q, k, v must be (batch, heads, seq, head_dim); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    batch, heads, seq_len, head_dim = q.shape
    if k.shape != v.shape or k.shape[0] != batch or k.shape[2] != seq_len or k.shape[3] != head_dim:
        raise ValueError(f"flash_attention: k {tuple(k.shape)} and v {tuple(v.shape)} must be (batch, kv_heads, seq, "
                         f"head_dim) with q's batch, seq and head_dim {tuple(q.shape)}")
    if heads % k.shape[1]:
        raise ValueError(f"flash_attention: {heads} query heads are not a multiple of {k.shape[1]} key/value heads")
    if head_dim > 128:
        raise ValueError(f"flash_attention: head_dim {head_dim} > 128 is not supported by the Triton kernel; use "
                         f"the reference backend (set_backend('reference') or PIPELINE_KERNELS=reference)")
    if q.stride(-1) != 1 or k.stride(-1) != 1 or v.stride(-1) != 1:
        raise ValueError("flash_attention: the head_dim axis of q, k and v must be contiguous (stride 1)")
    if alibi_slopes is not None and alibi_slopes.shape != (heads,):
        raise ValueError(f"flash_attention: alibi_slopes must have one slope per query head ({heads},); got "
                         f"{tuple(alibi_slopes.shape)}")
    if segment_ids is not None and segment_ids.shape != (batch, seq_len):
        raise ValueError(f"flash_attention: segment_ids must be (batch, seq) = ({batch}, {seq_len}); got "
                         f"{tuple(segment_ids.shape)}")


class _FlashAttention(torch.autograd.Function):

    @staticmethod
    def forward(ctx, q, k, v, causal, alibi_slopes, segment_ids, softmax_scale, configs):
        batch, heads, seq_len, head_dim = q.shape
        kv_heads = k.shape[1]
        arch = current_arch(q.device)
        block_d, check_seq, check_d = _flags(seq_len, head_dim, configs)
        sm_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
        slopes = alibi_slopes.to(torch.float32).contiguous() if alibi_slopes is not None else q  # q: unused pointer
        segments = segment_ids.to(torch.int32).contiguous() if segment_ids is not None else q.new_empty((1, 1),
                                                                                                       dtype=torch.int32)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty((batch, heads, seq_len), device=q.device, dtype=torch.float32)
        cfg = configs.forward
        grid = (triton.cdiv(seq_len, cfg.block_m), batch * heads)
        _attention_forward[grid](
            q, k, v, out, lse, slopes, segments,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2), segments.stride(0),
            heads, heads // kv_heads, seq_len, head_dim, sm_scale * LOG2E,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=block_d, CAUSAL=causal,
            HAS_ALIBI=alibi_slopes is not None, HAS_SEGMENTS=segment_ids is not None, CHECK_SEQ=check_seq,
            CHECK_D=check_d, **cfg.launch_options(arch))
        ctx.save_for_backward(q, k, v, out, lse, slopes, segments)
        ctx.settings = (causal, alibi_slopes is not None, segment_ids is not None, sm_scale, configs)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse, slopes, segments = ctx.saved_tensors
        causal, has_alibi, has_segments, sm_scale, configs = ctx.settings
        batch, heads, seq_len, head_dim = q.shape
        kv_heads = k.shape[1]
        arch = current_arch(q.device)
        block_d, check_seq, check_d = _flags(seq_len, head_dim, configs)
        grad_out = grad_out if grad_out.stride(-1) == 1 else grad_out.contiguous()

        delta = torch.empty_like(lse)
        delta_block = 64
        _attention_backward_delta[(triton.cdiv(seq_len, delta_block), batch * heads)](
            out, grad_out, delta, out.stride(0), out.stride(1), out.stride(2), grad_out.stride(0), grad_out.stride(1),
            grad_out.stride(2), heads, seq_len, head_dim, BLOCK_M=delta_block, BLOCK_D=block_d, num_warps=4)

        dq = torch.empty_like(q, memory_format=torch.contiguous_format)
        dk = torch.empty_like(k, memory_format=torch.contiguous_format)
        dv = torch.empty_like(v, memory_format=torch.contiguous_format)
        common = dict(CAUSAL=causal, HAS_ALIBI=has_alibi, HAS_SEGMENTS=has_segments, CHECK_SEQ=check_seq,
                      CHECK_D=check_d, BLOCK_D=block_d)
        cfg = configs.backward_kv
        _attention_backward_kv[(triton.cdiv(seq_len, cfg.block_n), batch * kv_heads)](
            q, k, v, grad_out, dk, dv, lse, delta, slopes, segments,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
            dk.stride(0), dk.stride(1), dk.stride(2), dv.stride(0), dv.stride(1), dv.stride(2), segments.stride(0),
            heads, kv_heads, heads // kv_heads, seq_len, head_dim, sm_scale * LOG2E, sm_scale,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **common, **cfg.launch_options(arch))
        cfg = configs.backward_q
        _attention_backward_q[(triton.cdiv(seq_len, cfg.block_m), batch * heads)](
            q, k, v, grad_out, dq, lse, delta, slopes, segments,
            q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
            v.stride(0), v.stride(1), v.stride(2), grad_out.stride(0), grad_out.stride(1), grad_out.stride(2),
            dq.stride(0), dq.stride(1), dq.stride(2), segments.stride(0),
            heads, heads // kv_heads, seq_len, head_dim, sm_scale * LOG2E, sm_scale,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, **common, **cfg.launch_options(arch))
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
                    alibi_slopes: Optional[torch.Tensor] = None, segment_ids: Optional[torch.Tensor] = None,
                    softmax_scale: Optional[float] = None, configs: Optional[AttentionConfigs] = None) -> torch.Tensor:
    """The Triton kernel behind pipeline.kernels.flash_attention; `configs` overrides the table (tests)."""
    _check_inputs(q, k, v, alibi_slopes, segment_ids)
    configs = configs or attention_configs(current_arch(q.device), q.shape[-1])
    return _FlashAttention.apply(q, k, v, causal, alibi_slopes, segment_ids, softmax_scale, configs)
