"""The anchor of bench/train.py: the benchmark's model written as plain PyTorch, to time our stack against.

nn.Linear, nn.LayerNorm / nn.RMSNorm, GELU / SwiGLU, and the attention torch itself offers: FlexAttention with an
ALiBi `score_mod` and a causal block mask for the BLOOM-shaped model, scaled_dot_product_attention(is_causal=True)
for the Llama-shaped RoPE model. It shares nothing with pipeline/model but the shape config, so that equal losses
from the same weights show that our stack computes the same function. Query, key and value are one matrix, as in
BLOOM and GPT-2; `anchor_state_dict` maps our Transformer's tensors onto these modules.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from pipeline.model.config import ModelConfig


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes: 2^(-8k/n), k = 1..n, for the largest power of two n <= heads, then every other slope of 2n."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8 * k / n) for k in range(1, n + 1)]
    return torch.tensor(slopes + [2 ** (-8 * k / (2 * n)) for k in range(1, 2 * n, 2)][:heads - n])


def causal(batch, head, q_idx, kv_idx):
    return q_idx >= kv_idx


def dense_mask(score_mod, heads: int, seq: int, device: torch.device) -> torch.Tensor:
    """A score_mod and the causal mask as SDPA's float mask (heads, seq, seq), where FlexAttention has no backward
    (a CPU): the same functions decide the scores."""
    head = torch.arange(heads, device=device).view(-1, 1, 1)
    q_idx, kv_idx = torch.arange(seq, device=device).view(-1, 1), torch.arange(seq, device=device)
    bias = score_mod(torch.zeros(heads, seq, seq, device=device), None, head, q_idx, kv_idx)
    return bias.masked_fill(~causal(None, head, q_idx, kv_idx), float("-inf"))


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as Llama's checkpoints define it: dimension i turns with dimension i + head_dim / 2."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.widths = [cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim]
        self.attn_norm, self.mlp_norm = make_norm(cfg), make_norm(cfg)
        self.qkv = nn.Linear(cfg.hidden_size, sum(self.widths), bias=cfg.bias)
        self.out = nn.Linear(self.widths[0], cfg.hidden_size, bias=cfg.bias)
        self.gate = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias) if cfg.activation == "swiglu" else None
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)
        if cfg.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(cfg.num_heads), persistent=False)

    def attention(self, x: torch.Tensor, positions) -> torch.Tensor:
        q, k, v = (part.unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2)
                   for part in self.qkv(x).split(self.widths, dim=-1))
        if self.cfg.position == "rope":
            cos, sin = positions
            y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True,
                                               enable_gqa=self.cfg.num_kv_heads != self.cfg.num_heads)
        else:
            slopes = self.slopes

            def alibi(score, batch, head, q_idx, kv_idx):
                return score + slopes[head] * (kv_idx - q_idx)

            if q.is_cuda:
                y = flex_attention(q, k, v, score_mod=alibi, block_mask=positions)
            else:
                mask = dense_mask(alibi, q.shape[1], q.shape[2], q.device).to(q.dtype)
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.out(y.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor, positions) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x), positions)
        h = self.mlp_norm(x)
        h = F.silu(self.gate(h)) * self.up(h) if self.gate is not None else F.gelu(self.up(h), approximate="tanh")
        return x + self.down(h)


class AnchorModel(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.embed_norm = make_norm(cfg) if cfg.embedding_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
        self.final_norm = make_norm(cfg)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.cached_positions = {}

    def positions(self, seq: int, device: torch.device):
        """What attention needs to know where tokens are, built once per length: RoPE's cos and sin (float32),
        or the causal block mask of FlexAttention."""
        if (seq, device) not in self.cached_positions:
            if self.cfg.position == "rope":
                dim = self.cfg.head_dim
                inv_freq = 1.0 / self.cfg.rope_theta ** (torch.arange(0, dim, 2, device=device).float() / dim)
                angles = torch.outer(torch.arange(seq, device=device).float(), inv_freq).repeat(1, 2)
                self.cached_positions[seq, device] = angles.cos(), angles.sin()
            else:
                mask = create_block_mask(causal, None, None, seq, seq, device=device) if device.type == "cuda" else None
                self.cached_positions[seq, device] = mask
        return self.cached_positions[seq, device]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = self.positions(input_ids.shape[1], input_ids.device)
        x = self.embed_norm(self.embed(input_ids))
        for block in self.blocks:
            x = block(x, positions)
        head = self.embed.weight if self.head is None else self.head.weight
        return F.linear(self.final_norm(x), head)[..., :self.cfg.vocab_size]


def anchor_state_dict(ours: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our Transformer's tensors (its state-dict names) under the anchor's names; q, k and v become one matrix."""
    renamed = {re.sub(r"\.(attn|mlp)\.", ".", name.replace("embedding.tokens.", "embed.")
                      .replace("embedding.norm.", "embed_norm.")): tensor for name, tensor in ours.items()}
    for name in [name for name in renamed if re.search(r"\.q\.(weight|bias)$", name)]:
        prefix, kind = name.rsplit(".q.", 1)
        renamed[f"{prefix}.qkv.{kind}"] = torch.cat([renamed.pop(f"{prefix}.{part}.{kind}") for part in "qkv"])
    return renamed
