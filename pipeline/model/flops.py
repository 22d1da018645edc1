"""The model's size and compute, from its config alone (no weights allocated): parameters and FLOPs per token."""

from __future__ import annotations

from pipeline.model.config import ModelConfig


def _matmul_parameters_per_block(cfg: ModelConfig) -> int:
    """Weights of the matrix multiplications in one block: attention q, k, v, out and the MLP."""
    attention = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = (3 if cfg.activation == "swiglu" else 2) * cfg.hidden_size * cfg.ffn_size
    return attention + mlp


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters as Hugging Face counts them: the real vocabulary (no padding), a tied head counted once."""
    h = cfg.hidden_size
    norm = h * (2 if cfg.norm == "layernorm" and cfg.bias else 1)
    attention_biases = cfg.head_dim * (cfg.num_heads + 2 * cfg.num_kv_heads) + h
    mlp_biases = cfg.ffn_size * (2 if cfg.activation == "swiglu" else 1) + h
    biases = attention_biases + mlp_biases if cfg.bias else 0
    block = _matmul_parameters_per_block(cfg) + biases + 2 * norm
    embedding = cfg.vocab_size * h + (norm if cfg.embedding_norm else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * h
    return embedding + cfg.num_layers * block + norm + head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward = 3 x forward), for MFU.

    Counts the matrix multiplications, as PaLM (Chowdhery et al. 2022, appendix B) and Megatron do:
    2 FLOPs per weight per token in the forward pass for every linear layer and the LM head (the real
    vocabulary, not the padding), plus attention's two products QK^T and AV, 2 * 2 * seq_len *
    num_heads * head_dim per layer and token. Attention is counted over the full seq_len x seq_len
    score matrix, *not* halved for the causal mask, as PaLM's 6N + 12 L H Q T does, so the numbers
    compare with published MFU. Norms, activations, softmax and the embedding lookup are left out.
    """
    matmul_weights = cfg.num_layers * _matmul_parameters_per_block(cfg) + cfg.vocab_size * cfg.hidden_size
    attention = cfg.num_layers * 2 * 2 * seq_len * cfg.num_heads * cfg.head_dim
    return 3 * (2 * matmul_weights + attention)
