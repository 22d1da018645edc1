"""Hugging Face's BLOOM, Llama and Mistral tensor names in the project's terms (their config.json keys are in
hf_config.py).

Both directions live here, next to each other, so that import and export cannot drift apart. Tensors
map 1:1 except BLOOM's fused `query_key_value`, whose rows are interleaved per head
([q_0, k_0, v_0, q_1, k_1, v_1, ...], each head_dim rows), which the project keeps as separate q, k, v.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

import torch

from pipeline.model.hf_config import BLOOM


@dataclass(frozen=True)
class TensorNames:
    # Where the body's tensors live ("transformer." / "model.").
    prefix: str
    # The project's names outside the blocks -> Hugging Face's (below `prefix`, except the head).
    top: dict
    # Hugging Face's name of block i is f"{layers}.{i}.<name>".
    layers: str
    # The project's names inside a block -> Hugging Face's.
    block: dict


_BLOOM_NAMES = TensorNames(
    prefix="transformer.",
    top={"embedding.tokens": "word_embeddings", "embedding.norm": "word_embeddings_layernorm", "final_norm": "ln_f"},
    layers="h",
    block={"attn_norm": "input_layernorm", "attn.out": "self_attention.dense", "mlp_norm": "post_attention_layernorm",
           "mlp.up": "mlp.dense_h_to_4h", "mlp.down": "mlp.dense_4h_to_h"},
)
_BLOOM_FUSED = "self_attention.query_key_value"
_LLAMA_NAMES = TensorNames(
    prefix="model.",
    top={"embedding.tokens": "embed_tokens", "final_norm": "norm"},
    layers="layers",
    block={"attn_norm": "input_layernorm", "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
           "attn.v": "self_attn.v_proj", "attn.out": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
           "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"},
)
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")
_TOP_NAME = re.compile(r"(.+)\.(weight|bias)")


def tensor_names(architecture: str) -> TensorNames:
    return _BLOOM_NAMES if architecture == BLOOM else _LLAMA_NAMES


def hf_tensor_name(architecture: str, name: str) -> tuple[str, Optional[int]]:
    """Hugging Face's name of the project's tensor `name`, and for BLOOM's q/k/v their part (0-2) of the fused
    query_key_value."""
    names = tensor_names(architecture)
    if name == "head.weight":
        return "lm_head.weight", None
    block = _BLOCK_NAME.fullmatch(name)
    if block:
        index, module, kind = block.groups()
        if architecture == BLOOM and module in ("attn.q", "attn.k", "attn.v"):
            part = ("attn.q", "attn.k", "attn.v").index(module)
            return f"{names.prefix}{names.layers}.{index}.{_BLOOM_FUSED}.{kind}", part
        return f"{names.prefix}{names.layers}.{index}.{names.block[module]}.{kind}", None
    module, kind = _TOP_NAME.fullmatch(name).groups()
    return f"{names.prefix}{names.top[module]}.{kind}", None


def split_bloom_fused(fused: torch.Tensor, num_heads: int) -> list[torch.Tensor]:
    """BLOOM's (3 * hidden, ...) query_key_value -> [q, k, v], each (hidden, ...)."""
    per_head = fused.reshape(num_heads, 3, -1, *fused.shape[1:])
    return [per_head[:, part].reshape(-1, *fused.shape[1:]) for part in range(3)]


def fuse_bloom(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    return torch.stack([t.reshape(num_heads, -1, *t.shape[1:]) for t in (q, k, v)], dim=1).reshape(-1, *q.shape[1:])
