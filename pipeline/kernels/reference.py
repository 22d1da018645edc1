"""Plain PyTorch references of the kernels: the CPU path and the test oracle of the Triton kernels.

`attention` writes every score out (batch x heads x seq x seq in float32), which makes it the oracle
and makes the memory of a training step predictable (pipeline/memory_fit counts what its autograd
saves); `scoring_attention` computes the same with PyTorch's fused attention, for the forward passes
that build no autograd graph (scoring held-out text on a CPU, at 2,048 tokens: 10x faster causal
alone, 2.3x with ALiBi and documents).
"""

from __future__ import annotations

import math
import numbers
from typing import Optional

import torch

from pipeline.kernels.fused_head import RowPrimitives


def unstack_qkv(
    qkv: torch.Tensor, heads: int, head_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v as (batch, heads, seq, head_dim) views of their stack (batch, seq, (heads + 2
    kv_heads) x head_dim)."""
    batch, seq, width = qkv.shape
    kv_heads = (width // head_dim - heads) // 2
    q, k, v = qkv.view(batch, seq, -1, head_dim).split([heads, kv_heads, kv_heads], dim=2)
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) by cos and sin (seq, head_dim): dimension i pairs with
    i + head_dim / 2."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def rotate_stacked_qkv(
    qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """`apply_rope` on the q and k of their stack with v (batch, seq, (heads + 2 kv_heads) x
    head_dim), v unchanged, in the same layout."""
    batch, seq, width = qkv.shape
    q, k, v = unstack_qkv(qkv, heads, head_dim)
    parts = (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
    return torch.cat([part.transpose(1, 2) for part in parts], dim=2).reshape(batch, seq, width)


def _check_heads(q: torch.Tensor, k: torch.Tensor) -> None:
    if q.shape[1] % k.shape[1]:
        raise ValueError(
            f"attention: {q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value "
            "heads"
        )


def check_attention_options(
    causal: bool,
    alibi_slopes: Optional[torch.Tensor],
    sliding_window: Optional[int],
    softcap: Optional[float],
) -> None:
    """Refuse the combinations that no backend computes (the same on every backend, so that a run
    never depends on where it runs): a sliding window is causal (Mistral, Gemma 2/3), and the soft
    cap (Gemma 2) is refused with ALiBi, whose bias the kernels add after the cap, relative to each
    block, which only a linear score allows."""
    if sliding_window is not None:
        if isinstance(sliding_window, bool) or not isinstance(sliding_window, numbers.Integral):
            raise TypeError(
                f"attention: sliding_window must be an int (keys per query, itself included) or "
                f"None; got {sliding_window!r}"
            )
        if sliding_window < 1:
            raise ValueError(
                f"attention: sliding_window must be >= 1 (a query sees itself and the "
                f"sliding_window - 1 keys before it); got {sliding_window}"
            )
        if not causal:
            raise ValueError(
                "attention: sliding_window needs causal=True: the window is causal as Mistral and "
                "Gemma define it; bidirectional sliding windows are not supported"
            )
    if softcap is not None:
        if not isinstance(softcap, numbers.Real) or isinstance(softcap, bool):
            raise TypeError(f"attention: softcap must be a float or None; got {softcap!r}")
        if not math.isfinite(softcap) or softcap <= 0:
            raise ValueError(f"attention: softcap must be a finite number > 0; got {softcap}")
        if alibi_slopes is not None:
            raise ValueError(
                "attention: softcap together with alibi_slopes is not supported (no model uses "
                "both, and the kernels add ALiBi to the scores after the cap); pass one of them"
            )


def _mask(
    q: torch.Tensor,
    causal: bool,
    alibi_slopes: Optional[torch.Tensor],
    segment_ids: Optional[torch.Tensor],
    sliding_window: Optional[int] = None,
) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Which keys each query may see, (batch or 1, 1, seq, seq), and the ALiBi bias slope_h * (j -
    i) of query i and key j, (1, heads, seq, seq) in float32, or None. A sliding window of W keeps
    the keys with i - j < W (transformers' `sliding_window_overlay`: kv_idx > q_idx - W)."""
    _, heads, seq, _ = q.shape
    positions = torch.arange(seq, device=q.device)
    distance = positions[None, :] - positions[:, None]  # j - i
    allowed = (distance <= 0 if causal else torch.ones_like(distance, dtype=torch.bool)).view(
        1, 1, seq, seq
    )
    if sliding_window is not None:
        allowed = allowed & (distance > -sliding_window)
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    bias = None if alibi_slopes is None else alibi_slopes.float().view(1, heads, 1, 1) * distance
    return allowed, bias


def attention(
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
) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim); k and v may have fewer heads (GQA/MQA).

    ALiBi adds slope_h * (j - i) to the score of query i and key j: BLOOM adds slope_h * j, which
    differs by a constant per row and so gives the same softmax. Softmax runs in float32.
    `sliding_window` W lets query i see the keys j with i - j < W only (itself and the W - 1 before
    it: Mistral's and Gemma's window); `softcap` c caps the scaled scores to c * tanh(score / c)
    before the masks, as Gemma 2's attention does.
    """
    _check_heads(q, k)
    check_attention_options(causal, alibi_slopes, sliding_window, softcap)
    heads, head_dim, kv_heads = q.shape[1], q.shape[-1], k.shape[1]
    allowed, bias = _mask(q, causal, alibi_slopes, segment_ids, sliding_window)
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if bias is not None:
        scores = scores + bias
    scores = scores.masked_fill(~allowed, float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return torch.matmul(probabilities, v.float()).to(q.dtype)


def scoring_attention(
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
) -> torch.Tensor:
    """`attention` through `scaled_dot_product_attention` in float32: the same masks and ALiBi bias
    (`_mask`, as an additive mask), the softmax fused; causal attention alone takes SDPA's own
    causal kernel. SDPA has no soft cap: with `softcap` this is `attention` itself."""
    _check_heads(q, k)
    check_attention_options(causal, alibi_slopes, sliding_window, softcap)
    if softcap is not None:
        return attention(
            q,
            k,
            v,
            causal=causal,
            segment_ids=segment_ids,
            softmax_scale=softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
        )
    q32, k32, v32 = q.float(), k.float(), v.float()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    if alibi_slopes is None and segment_ids is None and sliding_window is None:
        return sdpa(q32, k32, v32, is_causal=causal, scale=softmax_scale, enable_gqa=True).to(
            q.dtype
        )
    allowed, bias = _mask(q, causal, alibi_slopes, segment_ids, sliding_window)
    mask = allowed if bias is None else bias.masked_fill(~allowed, float("-inf"))
    return sdpa(q32, k32, v32, attn_mask=mask, scale=softmax_scale, enable_gqa=True).to(q.dtype)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last axis, in float32."""
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (normed * weight.float()).to(x.dtype)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis, in float32."""
    out = torch.nn.functional.layer_norm(
        x.float(), x.shape[-1:], weight.float(), bias.float() if bias is not None else None, eps
    )
    return out.to(x.dtype)


def vocab_shard_statistics(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of a (rows, shard_vocab) logits shard: float32 log-sum-exp, and the logit of the
    row's target (a global id; the shard holds ids vocab_start .. vocab_start + shard_vocab - 1), 0
    where the shard lacks it."""
    logits = logits.float()
    local = targets - vocab_start
    holds = (local >= 0) & (local < logits.shape[-1])
    target_logit = logits.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
    return logits.logsumexp(-1), torch.where(holds, target_logit, 0.0)


def softmax_gradient(
    logits: torch.Tensor,
    out: torch.Tensor,
    targets: torch.Tensor,
    lse: torch.Tensor,
    grad_lse: torch.Tensor,
    grad_target: torch.Tensor,
    vocab_start: int = 0,
) -> None:
    """out = grad_lse * softmax(logits) + grad_target * one-hot(target), per row (out may be logits
    itself); the gradient of grad_lse * lse + grad_target * target_logit, as the Triton kernel
    computes it."""
    local = targets - vocab_start
    holds = (local >= 0) & (local < logits.shape[-1])
    # In `out` when it is float32, so that no float32 copy of the chunk is held besides it (the
    # planner counts none).
    grad = out if out.dtype == torch.float32 else torch.empty_like(out, dtype=torch.float32)
    torch.sub(logits.float(), lse[:, None], out=grad).exp_().mul_(grad_lse[:, None])
    rows = torch.arange(len(targets), device=logits.device)[holds]
    grad[rows, local[holds]] += grad_target[holds]
    if grad is not out:
        out.copy_(grad)


# The per-row primitives of the fused LM head (fused_head.py) on a CPU.
ROW_PRIMITIVES = RowPrimitives(statistics=vocab_shard_statistics, softmax_gradient=softmax_gradient)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    reduction: str = "mean",
) -> torch.Tensor:
    """Cross-entropy of the LM head `hidden @ weight.T` over the targets that are not `ignore_index`
    (their mean or sum), all logits at once: the oracle of the fused, chunked one (fused_head.py)."""
    logits = (hidden @ weight.t()).float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        ignore_index=ignore_index,
        reduction=reduction,
    )
