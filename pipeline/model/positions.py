"""Where a token is: ALiBi slopes (BLOOM) and rotary embeddings (Llama/Mistral).

Both follow the published checkpoints' conventions so that weights map 1:1: ALiBi slopes as BLOOM
computes them, RoPE rotating the two halves of each head (transformers' `rotate_half`, not
interleaved pairs), with frequencies and angles in float32 as transformers computes them.
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from pipeline.model.config import ModelConfig


def alibi_slopes(num_heads: int, device: Optional[torch.device] = None) -> torch.Tensor:
    """One slope per head, for all heads (tensor parallelism slices its ranks' share).

    For a power of two n the slopes are 2^(-8k/n), k = 1..n (Press et al. 2022). For other counts,
    BLOOM takes the slopes of the closest smaller power of two p and adds every other slope of 2p.
    """
    def geometric(n: int) -> list[float]:
        return [2.0 ** (-8.0 * k / n) for k in range(1, n + 1)]

    closest = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(closest) + geometric(2 * closest)[0::2][:num_heads - closest]
    return torch.tensor(slopes, dtype=torch.float32, device=device)


def rope_frequencies(cfg: ModelConfig, device: Optional[torch.device] = None) -> torch.Tensor:
    """The rotation speed of each pair of dimensions (head_dim / 2 values), with Llama 3's scaling if set."""
    dim = cfg.head_dim
    inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
    scaling = cfg.rope_scaling
    if scaling is None:
        return inv_freq
    # Llama 3.1: wavelengths longer than the pretraining context / low_freq_factor are slowed down by
    # `factor`, those shorter than context / high_freq_factor are kept, the band between is interpolated.
    wavelength = 2 * math.pi / inv_freq
    context = scaling.original_max_seq_len
    slowed = inv_freq / scaling.factor
    ramp = (context / wavelength - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    between = (1 - ramp) * slowed + ramp * inv_freq
    scaled = torch.where(wavelength > context / scaling.low_freq_factor, slowed, inv_freq)
    in_band = (wavelength >= context / scaling.high_freq_factor) & (wavelength <= context / scaling.low_freq_factor)
    return torch.where(in_band, between, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, seq_len: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of every position's angles, (seq, head_dim): positions 0..seq_len-1 of the sequence."""
    positions = torch.arange(seq_len, device=inv_freq.device, dtype=torch.float32)
    angles = torch.outer(positions, inv_freq)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim): dimension i pairs with i + head_dim/2."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin
