"""Triton kernels (attention, RoPE, norms, cross-entropy) and their plain PyTorch references.

Public API (each runs the Triton kernel on a GPU tensor and the reference in
pipeline/kernels/reference.py on CPU, attention without an autograd graph through PyTorch's fused
attention; see pipeline/kernels/backend.py for the switch):

- `flash_attention(q, k, v, *, causal=True, alibi_slopes=None, segment_ids=None,
  softmax_scale=None, sliding_window=None, softcap=None)`: (batch, heads, seq, head_dim) like SDPA,
  any strides with a contiguous head_dim (the Triton kernel's output and gradients keep their
  input's memory layout); k and v may have fewer heads (GQA/MQA); `alibi_slopes` holds the slopes
  of the caller's own heads (tensor parallelism passes its slice); `segment_ids` (batch, seq) keeps
  attention within each packed document; `sliding_window` W (causal only) lets query i see the keys
  j with i - j < W, itself and the W - 1 before it, as Mistral's and Gemma's sliding-window layers
  (transformers' `sliding_window` config value); `softcap` c caps the scaled scores to c *
  tanh(score / c) before the masks (Gemma 2's `attn_logit_softcapping`; refused with ALiBi). Head
  dims up to 128 in the Triton kernel.
- `stacked_flash_attention(qkv, heads, head_dim, *, causal=True, alibi_slopes=None,
  segment_ids=None, softmax_scale=None, sliding_window=None, softcap=None)`: the same over q, k, v
  side by side in one (batch, seq, (heads + 2 kv_heads) x head_dim) tensor, as one projection makes
  them (`unstack_qkv(qkv, heads, head_dim)` gives the three views); the Triton kernel's gradient is
  one tensor like qkv.
- `rotate_stacked_qkv(qkv, heads, head_dim, cos, sin)`: q and k of such a stack rotated by RoPE
  (cos and sin (seq, head_dim) of positions 0 .. seq - 1; dimension i pairs with i + head_dim / 2),
  v unchanged, in the same layout: the Triton kernel reads and writes the stack once in each pass.
- `rms_norm(x, weight, eps)` and `layer_norm(x, weight, bias, eps)` (bias may be None): over the
  last axis, statistics in float32, output in x's dtype; the Triton kernels hold a row whole (hidden
  size <= 65536).
- `add_rms_norm(x, addend, weight, eps)` and `add_layer_norm(x, addend, weight, bias, eps)` ->
  `(total, normed)`: total = x + addend (same shape and dtype) and its norm, in one pass over the
  rows (a block's residual stream and its attention output, or the previous block's MLP output); the
  backward adds total's own gradient into the norm's.
- `linear_cross_entropy(hidden, weight, targets, ignore_index=-100, chunk_size=None,
  reduction="mean", shard=None, softcap=None)`: the mean (or sum) cross-entropy of the LM head
  `hidden @ weight.T` (capped to softcap * tanh(logits / softcap) when given)
  (hidden (..., d), weight (vocab, d), targets hidden.shape[:-1]) over the targets that are not
  `ignore_index`, computed `chunk_size` rows at a time (default: ~128M logits per chunk) so that the
  whole (tokens, vocab) logits never exist; gradients flow to hidden and weight. With `shard` (a
  `VocabShard`), `weight` is this rank's real rows of a head cut by vocabulary, the statistics are
  combined over the ranks and the chunks follow the shard's full size, the same on every rank
  (fused_head.py).
- `vocab_shard_statistics(logits, targets, vocab_start=0) -> (lse, target_logit)`: the building
  block of a vocab-parallel cross-entropy. For a (rows, shard_vocab) logits shard holding the ids
  vocab_start .. vocab_start + shard_vocab - 1: per row, the float32 log-sum-exp over the shard and
  the logit of the row's (global) target id, 0 where another shard holds it; differentiable. Across
  tensor-parallel ranks: lse = log(all_reduce_sum(exp(lse_shard - global_max))) + global_max
  (global_max = all_reduce_max of lse_shard), target_logit = all_reduce_sum(target_logit_shard),
  loss = lse - target_logit.
- `set_backend("auto" | "reference" | "triton")`, `kernel_backend(name)` (context manager),
  `get_backend()`, and the environment variable `PIPELINE_KERNELS` (read at import) choose the
  backend.
"""

from __future__ import annotations

from typing import Optional

import torch

from pipeline.kernels import reference
from pipeline.kernels.backend import get_backend, kernel_backend, set_backend, use_triton
from pipeline.kernels.fused_head import VocabShard, fused_linear_cross_entropy
from pipeline.kernels.reference import apply_rope, unstack_qkv


def _check_stack(qkv: torch.Tensor, heads: int, head_dim: int, caller: str) -> None:
    if (
        qkv.dim() != 3
        or qkv.shape[-1] % head_dim
        or (qkv.shape[-1] // head_dim - heads) % 2
        or qkv.shape[-1] // head_dim <= heads
    ):
        raise ValueError(
            f"{caller}: qkv {tuple(qkv.shape)} is not (batch, seq, (heads + 2 kv_heads) x "
            f"head_dim) for {heads} query heads of {head_dim}"
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
) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim); the semantics are those of
    `reference.attention`."""
    if use_triton(q):
        from pipeline.kernels.attention import flash_attention as triton_attention

        return triton_attention(
            q,
            k,
            v,
            causal=causal,
            alibi_slopes=alibi_slopes,
            segment_ids=segment_ids,
            softmax_scale=softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
        )
    # Without an autograd graph nothing is saved for a backward, so PyTorch's fused attention may
    # run instead.
    building_graph = torch.is_grad_enabled() and (
        q.requires_grad or k.requires_grad or v.requires_grad
    )
    attend = reference.attention if building_graph else reference.scoring_attention
    return attend(
        q,
        k,
        v,
        causal=causal,
        alibi_slopes=alibi_slopes,
        segment_ids=segment_ids,
        softmax_scale=softmax_scale,
        sliding_window=sliding_window,
        softcap=softcap,
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
) -> torch.Tensor:
    """`flash_attention` of q, k, v held side by side: qkv is (batch, seq, (heads + 2 kv_heads) x
    head_dim), as one projection makes them; the result is (batch, heads, seq, head_dim). The Triton
    kernel's gradient is one tensor like qkv, which reaches the projection without the copy that
    three separate gradients would need."""
    _check_stack(qkv, heads, head_dim, "stacked_flash_attention")
    if use_triton(qkv):
        from pipeline.kernels.attention import stacked_flash_attention as triton_attention

        return triton_attention(
            qkv,
            heads,
            head_dim,
            causal=causal,
            alibi_slopes=alibi_slopes,
            segment_ids=segment_ids,
            softmax_scale=softmax_scale,
            sliding_window=sliding_window,
            softcap=softcap,
        )
    return flash_attention(
        *unstack_qkv(qkv, heads, head_dim),
        causal=causal,
        alibi_slopes=alibi_slopes,
        segment_ids=segment_ids,
        softmax_scale=softmax_scale,
        sliding_window=sliding_window,
        softcap=softcap,
    )


def rotate_stacked_qkv(
    qkv: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """q and k of their stack with v rotated by RoPE (`reference.rotate_stacked_qkv`), the layout
    kept, for `stacked_flash_attention`."""
    _check_stack(qkv, heads, head_dim, "rotate_stacked_qkv")
    seq = qkv.shape[1]
    if cos.shape != sin.shape or cos.dim() != 2 or cos.shape[0] < seq or cos.shape[1] != head_dim:
        raise ValueError(
            f"rotate_stacked_qkv: cos {tuple(cos.shape)} and sin {tuple(sin.shape)} must both be "
            f"(seq, head_dim) tables of at least {seq} positions of {head_dim}"
        )
    if use_triton(qkv):
        from pipeline.kernels import rope

        return rope.rotate_stacked_qkv(qkv, heads, head_dim, cos, sin)
    return reference.rotate_stacked_qkv(qkv, heads, head_dim, cos, sin)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    if use_triton(x):
        from pipeline.kernels import norms

        return norms.rms_norm(x, weight, eps)
    return reference.rms_norm(x, weight, eps)


def layer_norm(
    x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], eps: float
) -> torch.Tensor:
    if use_triton(x):
        from pipeline.kernels import norms

        return norms.layer_norm(x, weight, bias, eps)
    return reference.layer_norm(x, weight, bias, eps)


def _check_addend(x: torch.Tensor, addend: torch.Tensor, where: str) -> None:
    if addend.shape != x.shape or addend.dtype != x.dtype:
        raise ValueError(
            f"{where}: the addend must have x's shape and dtype: x {tuple(x.shape)} {x.dtype}, "
            "addend "
            f"{tuple(addend.shape)} {addend.dtype}"
        )


def add_rms_norm(
    x: torch.Tensor, addend: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_addend(x, addend, "add_rms_norm")
    if use_triton(x):
        from pipeline.kernels import norms

        return norms.add_rms_norm(x, addend, weight, eps)
    total = x + addend
    return total, reference.rms_norm(total, weight, eps)


def add_layer_norm(
    x: torch.Tensor,
    addend: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    _check_addend(x, addend, "add_layer_norm")
    if use_triton(x):
        from pipeline.kernels import norms

        return norms.add_layer_norm(x, addend, weight, bias, eps)
    total = x + addend
    return total, reference.layer_norm(total, weight, bias, eps)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    ignore_index: int = -100,
    chunk_size: Optional[int] = None,
    reduction: str = "mean",
    shard: Optional[VocabShard] = None,
    softcap: Optional[float] = None,
) -> torch.Tensor:
    if use_triton(hidden):
        from pipeline.kernels.cross_entropy import ROW_PRIMITIVES
    else:
        ROW_PRIMITIVES = reference.ROW_PRIMITIVES
    return fused_linear_cross_entropy(
        hidden, weight, targets, ROW_PRIMITIVES, ignore_index, chunk_size, reduction, shard, softcap
    )


def vocab_shard_statistics(
    logits: torch.Tensor, targets: torch.Tensor, vocab_start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    if use_triton(logits):
        from pipeline.kernels import cross_entropy

        return cross_entropy.vocab_shard_statistics(logits, targets, vocab_start)
    return reference.vocab_shard_statistics(logits, targets, vocab_start)


__all__ = [
    "VocabShard",
    "apply_rope",
    "add_layer_norm",
    "add_rms_norm",
    "flash_attention",
    "get_backend",
    "kernel_backend",
    "layer_norm",
    "linear_cross_entropy",
    "rms_norm",
    "rotate_stacked_qkv",
    "set_backend",
    "stacked_flash_attention",
    "unstack_qkv",
    "vocab_shard_statistics",
]
