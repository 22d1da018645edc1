"""The anchor of bench/train.py: the benchmark's model written as plain PyTorch, to time our stack
against.

nn.Linear, nn.LayerNorm / nn.RMSNorm, GELU / SwiGLU, and the attention torch itself offers:
FlexAttention with an ALiBi `score_mod` and a causal block mask for the BLOOM-shaped model,
scaled_dot_product_attention(is_causal=True) for the Llama-shaped RoPE model. It shares nothing with
pipeline/model but the shape config, so that equal losses from the same weights show that our stack
computes the same function. Query, key and value are one matrix, as in BLOOM and GPT-2, or three
(`fused_qkv=False`: the tensor-parallel anchor, bench/anchor_tensor_parallel.py, whose ranks must each
get whole heads of every one); `anchor_state_dict` maps our Transformer's tensors onto these
modules.

Packed rows (`segment_ids`, documents numbered along each row as the pretrain stage's sampler
numbers them): both models attend within each document through FlexAttention with a
causal-and-same-document block mask, built once per batch for all layers (what torchtitan does),
with the ALiBi score_mod for the BLOOM-shaped model. The mask reads the ids from one persistent
tensor that each batch is copied into, so that its `mask_mod` is one function and the compiled
blocks are not compiled again per batch.
"""

from __future__ import annotations

import math
import re

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from pipeline.model.model_config import ModelConfig


def alibi_slopes(heads: int) -> torch.Tensor:
    """BLOOM's slopes: 2^(-8k/n), k = 1..n, for the largest power of two n <= heads, then every
    other slope of 2n."""
    n = 2 ** math.floor(math.log2(heads))
    slopes = [2 ** (-8 * k / n) for k in range(1, n + 1)]
    return torch.tensor(slopes + [2 ** (-8 * k / (2 * n)) for k in range(1, 2 * n, 2)][: heads - n])


def causal(batch, head, q_idx, kv_idx):
    return q_idx >= kv_idx


def dense_mask(
    score_mod, heads: int, seq: int, device: torch.device, allowed: torch.Tensor | None = None
) -> torch.Tensor:
    """A score_mod and the causal mask (or `allowed`, (batch, 1, seq, seq) booleans) as SDPA's float
    mask ((batch or 1), heads, seq, seq), where FlexAttention has no backward (a CPU): the same
    functions decide the scores."""
    head = torch.arange(heads, device=device).view(-1, 1, 1)
    q_idx, kv_idx = torch.arange(seq, device=device).view(-1, 1), torch.arange(seq, device=device)
    bias = torch.zeros(heads, seq, seq, device=device)
    if score_mod is not None:
        bias = score_mod(bias, None, head, q_idx, kv_idx)
    if allowed is None:
        allowed = causal(None, head, q_idx, kv_idx)
    return bias.masked_fill(~allowed, float("-inf"))


def make_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden_size, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps, bias=cfg.bias)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE as Llama's checkpoints define it: dimension i turns with dimension i + head_dim / 2."""
    first, second = x.chunk(2, dim=-1)
    return x * cos.to(x.dtype) + torch.cat((-second, first), dim=-1) * sin.to(x.dtype)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, fused_qkv: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.widths = [
            cfg.num_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
            cfg.num_kv_heads * cfg.head_dim,
        ]
        self.attn_norm, self.mlp_norm = make_norm(cfg), make_norm(cfg)
        self.fused_qkv = fused_qkv
        if fused_qkv:
            self.qkv = nn.Linear(cfg.hidden_size, sum(self.widths), bias=cfg.bias)
        else:
            self.q, self.k, self.v = (
                nn.Linear(cfg.hidden_size, width, bias=cfg.bias) for width in self.widths
            )
        self.out = nn.Linear(self.widths[0], cfg.hidden_size, bias=cfg.bias)
        self.gate = (
            nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
            if cfg.activation == "swiglu"
            else None
        )
        self.up = nn.Linear(cfg.hidden_size, cfg.ffn_size, bias=cfg.bias)
        self.down = nn.Linear(cfg.ffn_size, cfg.hidden_size, bias=cfg.bias)
        if cfg.position == "alibi":
            self.register_buffer("slopes", alibi_slopes(cfg.num_heads), persistent=False)

    def attention(self, x: torch.Tensor, rope, mask) -> torch.Tensor:
        """`rope`: RoPE's (cos, sin) or None; `mask`: None (causal), FlexAttention's BlockMask (a
        GPU) or the allowed pairs (batch, 1, seq, seq) as booleans (a CPU)."""
        parts = (
            self.qkv(x).split(self.widths, dim=-1)
            if self.fused_qkv
            else (self.q(x), self.k(x), self.v(x))
        )
        # -1: the heads there are (a tensor-parallel rank's share of them)
        q, k, v = (part.unflatten(-1, (-1, self.cfg.head_dim)).transpose(1, 2) for part in parts)
        gqa = self.cfg.num_kv_heads != self.cfg.num_heads
        alibi = None
        if self.cfg.position == "rope":
            cos, sin = rope
            q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        else:
            slopes = self.slopes

            def alibi(score, batch, head, q_idx, kv_idx):
                return score + slopes[head] * (kv_idx - q_idx)

        if alibi is None and mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif q.is_cuda:
            y = flex_attention(q, k, v, score_mod=alibi, block_mask=mask, enable_gqa=gqa)
        else:
            bias = dense_mask(alibi, q.shape[1], q.shape[2], q.device, mask).to(q.dtype)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, enable_gqa=gqa)
        return self.out(y.transpose(1, 2).flatten(2))

    def forward(self, x: torch.Tensor, rope, mask) -> torch.Tensor:
        x = x + self.attention(self.attn_norm(x), rope, mask)
        h = self.mlp_norm(x)
        h = (
            F.silu(self.gate(h)) * self.up(h)
            if self.gate is not None
            else F.gelu(self.up(h), approximate="tanh")
        )
        return x + self.down(h)


class AnchorModel(nn.Module):
    def __init__(self, cfg: ModelConfig, fused_qkv: bool = True) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.embed_norm = make_norm(cfg) if cfg.embedding_norm else nn.Identity()
        self.blocks = nn.ModuleList(Block(cfg, fused_qkv) for _ in range(cfg.num_layers))
        self.final_norm = make_norm(cfg)
        self.head = (
            None
            if cfg.tie_embeddings
            else nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        )
        self.cached_positions = {}
        self.documents = None  # the current batch's segment ids, which the document mask_mod reads
        self.mask_mod = None

    def positions(self, seq: int, device: torch.device):
        """RoPE's cos and sin (float32) for this length, built once; None for ALiBi."""
        if self.cfg.position != "rope":
            return None
        if (seq, device) not in self.cached_positions:
            dim = self.cfg.head_dim
            inv_freq = 1.0 / self.cfg.rope_theta ** (
                torch.arange(0, dim, 2, device=device).float() / dim
            )
            angles = torch.outer(torch.arange(seq, device=device).float(), inv_freq).repeat(1, 2)
            self.cached_positions[seq, device] = angles.cos(), angles.sin()
        return self.cached_positions[seq, device]

    def mask(self, seq: int, device: torch.device, segment_ids: torch.Tensor | None):
        """The attention mask of this batch: without documents, FlexAttention's causal block mask
        (ALiBi on a GPU, built once per length) or None (causal SDPA, or the CPU's dense causal
        mask); with documents, the causal-and-same-document block mask (a GPU) or boolean pairs (a
        CPU), built for this batch."""
        if segment_ids is None:
            if self.cfg.position == "rope" or device.type != "cuda":
                return None
            if ("causal", seq, device) not in self.cached_positions:
                self.cached_positions["causal", seq, device] = create_block_mask(
                    causal, None, None, seq, seq, device=device
                )
            return self.cached_positions["causal", seq, device]
        if device.type != "cuda":
            positions = torch.arange(seq, device=device)
            return (
                (positions[:, None] >= positions[None, :])
                & (segment_ids[:, :, None] == segment_ids[:, None, :])
            ).unsqueeze(1)
        if self.documents is None or self.documents.shape != segment_ids.shape:
            self.documents = documents = segment_ids.clone()

            def causal_document(batch, head, q_idx, kv_idx):
                return (q_idx >= kv_idx) & (documents[batch, q_idx] == documents[batch, kv_idx])

            self.mask_mod = (
                causal_document  # one function for every batch of this shape: no recompiles
            )
        else:
            self.documents.copy_(segment_ids)
        return create_block_mask(self.mask_mod, segment_ids.shape[0], None, seq, seq, device=device)

    def hidden_states(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final norm's output, which the LM head reads."""
        seq, device = input_ids.shape[1], input_ids.device
        rope, mask = self.positions(seq, device), self.mask(seq, device, segment_ids)
        x = self.embed_norm(self.embed(input_ids))
        for block in self.blocks:
            x = block(x, rope, mask)
        return self.final_norm(x)

    def forward(
        self, input_ids: torch.Tensor, segment_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        head = self.embed.weight if self.head is None else self.head.weight
        return F.linear(self.hidden_states(input_ids, segment_ids), head)[
            ..., : self.cfg.vocab_size
        ]


def anchor_state_dict(
    ours: dict[str, torch.Tensor], fused_qkv: bool = True
) -> dict[str, torch.Tensor]:
    """Our Transformer's tensors (its state-dict names) under the anchor's names; q, k and v become
    one matrix unless `fused_qkv` is False."""
    renamed = {
        re.sub(
            r"\.(attn|mlp)\.",
            ".",
            name.replace("embedding.tokens.", "embed.").replace("embedding.norm.", "embed_norm."),
        ): tensor
        for name, tensor in ours.items()
    }
    if not fused_qkv:
        return renamed
    for name in [name for name in renamed if re.search(r"\.q\.(weight|bias)$", name)]:
        prefix, kind = name.rsplit(".q.", 1)
        renamed[f"{prefix}.qkv.{kind}"] = torch.cat(
            [renamed.pop(f"{prefix}.{part}.{kind}") for part in "qkv"]
        )
    return renamed
