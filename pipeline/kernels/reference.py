"""Plain PyTorch references of the kernels: the CPU path and the test oracle of the Triton kernels."""

from __future__ import annotations

import math
from typing import Optional

import torch


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = True,
              alibi_slopes: Optional[torch.Tensor] = None, segment_ids: Optional[torch.Tensor] = None,
              softmax_scale: Optional[float] = None) -> torch.Tensor:
    """Attention over (batch, heads, seq, head_dim); k and v may have fewer heads (GQA/MQA).

    ALiBi adds slope_h * (j - i) to the score of query i and key j: BLOOM adds slope_h * j, which
    differs by a constant per row and so gives the same softmax. Softmax runs in float32.
    """
    batch, heads, seq, head_dim = q.shape
    kv_heads = k.shape[1]
    if heads % kv_heads:
        raise ValueError(f"attention: {heads} query heads are not a multiple of {kv_heads} key/value heads")
    if kv_heads != heads:
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(head_dim)
    scores = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    positions = torch.arange(seq, device=q.device)
    distance = positions[None, :] - positions[:, None]  # j - i
    if alibi_slopes is not None:
        scores = scores + alibi_slopes.float().view(1, heads, 1, 1) * distance
    allowed = torch.ones(seq, seq, dtype=torch.bool, device=q.device)
    if causal:
        allowed = distance <= 0
    allowed = allowed.view(1, 1, seq, seq)
    if segment_ids is not None:
        allowed = allowed & (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
    scores = scores.masked_fill(~allowed, float("-inf"))
    probabilities = torch.softmax(scores, dim=-1)
    return torch.matmul(probabilities, v.float()).to(q.dtype)
