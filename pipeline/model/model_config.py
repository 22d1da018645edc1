"""The transformer's shape, a typed config: the `model` section, presets in `pipeline/conf/model/`.

One dataclass covers the two families the recipe starts from: BLOOM (ALiBi, LayerNorm, embedding
LayerNorm, GELU, biases, tied head) and Llama/Mistral (RoPE, RMSNorm, SwiGLU, grouped-query
attention). This module imports no torch, so that the command line can check a config without
loading it.

The typed `export` section: how the training stages write their transformers folder `hf/`
(torch-free).

The model's size and compute, from its config alone (no weights allocated): parameters and FLOPs per
token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from pipeline.errors import ConfigError

POSITIONS = ("alibi", "rope")
NORMS = ("layernorm", "rmsnorm")
ACTIVATIONS = ("gelu", "swiglu")
QK_NORMS = ("none", "head", "full")
NORM_PLACEMENTS = ("pre", "post")
ROPE_SCALING_TYPES = ("llama3", "linear", "yarn", "longrope")
# The Hugging Face architectures the model is read from and written as (pipeline/model/hf_config.py).
ARCHITECTURES = (
    "BloomForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Olmo2ForCausalLM",
    "Phi3ForCausalLM",
)


@dataclass
class RopeScaling:
    """RoPE stretched beyond the context the model was pretrained with, computed as transformers
    computes it (`transformers.modeling_rope_utils`); `type` picks the method, which reads its own
    fields:

    - llama3 (Llama 3.1): low frequencies slowed by `factor`, high ones kept, a smooth ramp between
      (`low_freq_factor`, `high_freq_factor`);
    - linear: every frequency slowed by `factor`;
    - yarn (Qwen2.5's and Qwen3's long context): the frequencies that turn more than `beta_fast`
      times over the pretraining context kept, those under `beta_slow` slowed by `factor`, a ramp
      between (its ends rounded outwards with `truncate`), cos and sin scaled by
      `attention_factor`;
    - longrope (Phi-3 128k, Phi-3.5): each frequency divided by its own factor, `short_factor` for
      sequences of up to `original_max_seq_len` tokens and `long_factor` for longer ones, cos and
      sin scaled by `attention_factor`.
    """

    type: str = "llama3"
    factor: float = 8.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    # The context length the model was pretrained with before the scaling.
    original_max_seq_len: int = 8192
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    truncate: bool = True
    # What cos and sin are multiplied by (yarn, longrope). A base's import sets the value
    # transformers derives when config.json leaves it out, so that it never depends on max_seq_len.
    attention_factor: float = 1.0
    # One factor per pair of dimensions (head_dim / 2 of them), longrope only.
    short_factor: Optional[list[float]] = None
    long_factor: Optional[list[float]] = None


@dataclass
class ModelConfig:
    # The defaults are the demo's shape (pipeline/conf/model/tiny.yaml, the default preset).
    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    # Key/value heads: num_heads for multi-head attention, fewer for grouped-query, 1 for
    # multi-query.
    num_kv_heads: int = 2
    # Width of each attention head; null: hidden_size / num_heads. Qwen3 sets its own (e.g. 128 with
    # hidden_size 1024 and 16 heads). `head_dim` is the width in use.
    head_size: Optional[int] = None
    # Width of the feed-forward layer (for swiglu: of each of its gate and up projections).
    ffn_size: int = 384
    # The tokenizer's vocabulary (what the exported model declares).
    vocab_size: int = 32768
    # The embedding and head hold the vocabulary rounded up to this multiple (tensor-parallel shards
    # and GPU kernels want it); the extra rows are zeros and never predicted.
    pad_vocab_multiple: int = 128
    position: str = "rope"
    rope_theta: float = 10000.0
    rope_scaling: Optional[RopeScaling] = None
    norm: str = "rmsnorm"
    norm_eps: float = 1e-5
    activation: str = "swiglu"
    # A norm right after the token embedding (BLOOM).
    embedding_norm: bool = False
    # Biases in every linear layer but the head, and in LayerNorm.
    bias: bool = False
    # Biases in the attention's q, k and v projections only (Qwen2/Qwen2.5: no bias in its output
    # projection or the MLP). `bias` gives them too.
    qkv_bias: bool = False
    # An RMSNorm (model.norm_eps) of the queries and keys before RoPE: `none`; `head`, over each
    # head's head_dim values with one weight of head_dim shared by the heads (Qwen3); `full`, over
    # the whole projected q (num_heads x head_dim) and k (num_kv_heads x head_dim), a weight per
    # value (OLMo 2).
    qk_norm: str = "none"
    # Where a block's two norms are: `pre`, on each sublayer's input (x + attn(norm(x)), GPT-2 and
    # most since); `post`, on each sublayer's output (x + norm(attn(x)), OLMo 2, whose blocks have
    # no input norm). The final norm follows the last block either way.
    norm_placement: str = "pre"
    # The head reuses the input embedding matrix.
    tie_embeddings: bool = True
    # The longest sequence the model is made for (Hugging Face's max_position_embeddings).
    max_seq_len: int = 256
    # Mistral's attention window. The model does not pass it to the attention kernels yet (they
    # take it: sliding_window), so it refuses sequences longer than the window instead of silently
    # computing something else.
    sliding_window: Optional[int] = None
    # The layers (0-based) that attend within sliding_window, where only some do (Qwen2/Qwen3 with
    # use_sliding_window: the layers from max_window_layers on); null: all of them.
    sliding_window_layers: Optional[list[int]] = None
    # Standard deviation of the random initialisation (a model trained from scratch).
    init_std: float = 0.02
    # The pretrained model to start from: a local Hugging Face folder or a pipeline checkpoint, with
    # its tokenizer.json. Its config decides the fields above (pipeline/model/base_shape.py).
    base: Optional[str] = None
    # The language the base model was trained in (ISO 639-3): replayed in the mix and in the
    # tokenizer's training text so that the model keeps it, and scored by evaluate so that
    # forgetting shows.
    base_lang: str = "eng"
    # The Hugging Face architecture the model is exported as (one of ARCHITECTURES), which must
    # express its shape: the base's own (model.base decides it, as the shape), so that a Qwen2 base
    # comes back as Qwen2 and a Phi-3 as Phi-3; null: the one the shape calls for
    # (pipeline/model/hf_config.py, architecture_for).
    hf_architecture: Optional[str] = None

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.pad_vocab_multiple
        return -(-self.vocab_size // multiple) * multiple


# What a training length of null takes: the model's context within its attention window, at most
# this much (continued pretraining rarely needs a base's whole context, and attention's share of the
# compute grows with it).
DEFAULT_TRAINING_SEQ_LEN = 2048


def training_seq_len(model: ModelConfig, seq_len: Optional[int]) -> int:
    """The tokens per training sequence: `seq_len` (train.seq_len), or for null the model's context,
    at most DEFAULT_TRAINING_SEQ_LEN and its sliding window."""
    if seq_len is not None:
        return seq_len
    return min(
        model.max_seq_len, model.sliding_window or model.max_seq_len, DEFAULT_TRAINING_SEQ_LEN
    )


def uneven_for_tensor_parallel(model: ModelConfig, tp: int) -> list[str]:
    """The sizes that tensor parallelism cuts into `tp` equal parts (query heads, key/value heads,
    feed-forward width) and `tp` does not divide."""
    return [key for key in ("num_heads", "num_kv_heads", "ffn_size") if getattr(model, key) % tp]


def validate_model(model: ModelConfig, prefix: str = "model") -> None:
    """Checks that types alone cannot express; each error names the key and what is allowed."""
    for key, value, allowed in (
        ("position", model.position, POSITIONS),
        ("norm", model.norm, NORMS),
        ("activation", model.activation, ACTIVATIONS),
        ("qk_norm", model.qk_norm, QK_NORMS),
        ("norm_placement", model.norm_placement, NORM_PLACEMENTS),
    ):
        if value not in allowed:
            raise ConfigError(f"{prefix}.{key}", value, allowed)
    for key in (
        "hidden_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
        "ffn_size",
        "vocab_size",
        "pad_vocab_multiple",
        "max_seq_len",
    ):
        if getattr(model, key) < 1:
            raise ConfigError(f"{prefix}.{key}", getattr(model, key), ["an integer >= 1"])
    if model.head_size is not None and model.head_size < 1:
        raise ConfigError(f"{prefix}.head_size", model.head_size, ["null", "an integer >= 1"])
    if model.head_size is None and model.hidden_size % model.num_heads:
        raise ConfigError(
            f"{prefix}.num_heads",
            model.num_heads,
            [
                f"a divisor of {prefix}.hidden_size={model.hidden_size}",
                f"any with {prefix}.head_size set",
            ],
        )
    if model.head_dim % 2 and model.position == "rope":
        key = "head_size" if model.head_size is not None else "num_heads"
        raise ConfigError(
            f"{prefix}.{key}",
            getattr(model, key),
            [
                "a value that leaves an even head size (head_size, or hidden_size / num_heads) for "
                "RoPE"
            ],
        )
    if model.qk_norm != "none" and model.position != "rope":
        raise ConfigError(
            f"{prefix}.qk_norm",
            model.qk_norm,
            [f"none when {prefix}.position={model.position} (q/k norms come before RoPE)"],
        )
    if model.num_heads % model.num_kv_heads:
        raise ConfigError(
            f"{prefix}.num_kv_heads",
            model.num_kv_heads,
            [
                f"a divisor of {prefix}.num_heads={model.num_heads} (1 for multi-query, "
                f"{model.num_heads} for multi-head attention)"
            ],
        )
    for key in ("norm_eps", "init_std", "rope_theta"):
        if not getattr(model, key) > 0:
            raise ConfigError(f"{prefix}.{key}", getattr(model, key), ["a positive number"])
    if model.sliding_window is not None and model.sliding_window < 1:
        raise ConfigError(
            f"{prefix}.sliding_window", model.sliding_window, ["null", "an integer >= 1"]
        )
    layers = model.sliding_window_layers
    if layers is not None and (
        model.sliding_window is None
        or not layers
        or list(layers) != sorted(set(layers))
        or not 0 <= layers[0] <= layers[-1] < model.num_layers
    ):
        raise ConfigError(
            f"{prefix}.sliding_window_layers",
            layers,
            [
                "null (every layer attends within the window)",
                f"layer numbers in increasing order, each in 0..{model.num_layers - 1}, with "
                f"{prefix}.sliding_window set",
            ],
        )
    if model.rope_scaling is not None:
        _validate_rope_scaling(model, prefix)
    if model.hf_architecture is not None:
        if model.hf_architecture not in ARCHITECTURES:
            raise ConfigError(
                f"{prefix}.hf_architecture", model.hf_architecture, ["null", *ARCHITECTURES]
            )
        misfits = architecture_misfits(model, model.hf_architecture)
        if misfits:
            raise ConfigError(
                f"{prefix}.hf_architecture",
                model.hf_architecture,
                [
                    "null",
                    f"an architecture that expresses this shape ({model.hf_architecture} cannot: "
                    f"{'; '.join(misfits)})",
                ],
            )


def _validate_rope_scaling(model: ModelConfig, prefix: str) -> None:
    scaling, key = model.rope_scaling, f"{prefix}.rope_scaling"
    if model.position != "rope":
        raise ConfigError(key, "set", [f"null when {prefix}.position={model.position}"])
    if scaling.type not in ROPE_SCALING_TYPES:
        raise ConfigError(f"{key}.type", scaling.type, ROPE_SCALING_TYPES)
    if not (
        scaling.factor > 0 and scaling.original_max_seq_len > 0 and scaling.attention_factor > 0
    ):
        raise ConfigError(
            key,
            scaling,
            ["factor > 0, original_max_seq_len > 0 and attention_factor > 0"],
        )
    if scaling.type == "llama3" and not 0 < scaling.low_freq_factor < scaling.high_freq_factor:
        raise ConfigError(
            key,
            scaling,
            [
                "0 < low_freq_factor < high_freq_factor (Llama 3.1: factor 8, low_freq_factor 1, "
                "high_freq_factor 4, original_max_seq_len 8192)"
            ],
        )
    if scaling.type == "longrope":
        pairs = model.head_dim // 2
        for name in ("short_factor", "long_factor"):
            factors = getattr(scaling, name)
            if factors is None or len(factors) != pairs or not all(f > 0 for f in factors):
                raise ConfigError(
                    f"{key}.{name}",
                    factors,
                    [f"{pairs} positive numbers, one per pair of a head's {model.head_dim} values"],
                )


def architecture_misfits(model: ModelConfig, architecture: str) -> list[str]:
    """What keeps `architecture` (one of ARCHITECTURES) from expressing `model`, as
    "model.<key>=<value> (needs ...)"; empty if it fits."""
    if architecture == "BloomForCausalLM":
        wanted = {
            "position": "alibi",
            "norm": "layernorm",
            "activation": "gelu",
            "embedding_norm": True,
            "bias": True,
            "ffn_size": 4 * model.hidden_size,
            "num_kv_heads": model.num_heads,
            "head_size": None,
            "sliding_window": None,
        }
    else:
        wanted = {
            "position": "rope",
            "norm": "rmsnorm",
            "activation": "swiglu",
            "embedding_norm": False,
        }
        wanted.update(
            {
                "LlamaForCausalLM": {"sliding_window": None},
                "MistralForCausalLM": {"bias": False, "sliding_window_layers": None},
                "Qwen2ForCausalLM": {"bias": False, "qkv_bias": True},
                "Qwen3ForCausalLM": {"bias": False, "qk_norm": "head"},
                "Olmo2ForCausalLM": {
                    "bias": False,
                    "qk_norm": "full",
                    "norm_placement": "post",
                    "sliding_window": None,
                },
                "Phi3ForCausalLM": {"bias": False, "sliding_window_layers": None},
            }[architecture]
        )
    defaults = {"qkv_bias": False, "qk_norm": "none", "norm_placement": "pre"}
    wanted = {**defaults, **wanted}
    if architecture in ("BloomForCausalLM", "LlamaForCausalLM") and model.bias:
        wanted["qkv_bias"] = model.qkv_bias  # biases everywhere include q, k and v's
    misfits = [
        f"model.{key}={getattr(model, key)!r} (needs {value!r})"
        for key, value in wanted.items()
        if getattr(model, key) != value
    ]
    scaling = model.rope_scaling
    if architecture == "Phi3ForCausalLM" and scaling is not None and scaling.type != "longrope":
        misfits.append(
            f"model.rope_scaling.type={scaling.type!r} (needs null or 'longrope': Phi3Config reads "
            "no other)"
        )
    return misfits


_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


@dataclass
class ExportConfig:
    # The largest weights file of `hf/` ("5GB", "500MB", "2GiB" or bytes), as transformers'
    # save_pretrained takes it: above it the weights go into model-00001-of-0000N.safetensors shards
    # with model.safetensors.index.json. Not part of the stages' hash: it changes the files, not the
    # model.
    max_shard_size: str = "5GB"


def shard_bytes(export: ExportConfig) -> int:
    match = _SIZE.fullmatch(str(export.max_shard_size))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConfigError(
            "export.max_shard_size", export.max_shard_size, ["a size such as 5GB, 500MB or 2GiB"]
        )
    return int(float(match.group(1)) * _UNITS[unit])


def validate_export(export: ExportConfig) -> None:
    shard_bytes(export)


def _matmul_parameters_per_block(cfg: ModelConfig) -> int:
    """Weights of the matrix multiplications in one block: attention q, k, v, out and the MLP."""
    attention = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = (3 if cfg.activation == "swiglu" else 2) * cfg.hidden_size * cfg.ffn_size
    return attention + mlp


def qk_norm_parameters(cfg: ModelConfig, tp: int = 1) -> int:
    """The weights of one block's q and k norms on a tensor-parallel rank: `head` ones are whole on
    every rank, `full` ones cut by head."""
    if cfg.qk_norm == "head":
        return 2 * cfg.head_dim
    if cfg.qk_norm == "full":
        return cfg.head_dim * (cfg.num_heads + cfg.num_kv_heads) // tp
    return 0


def parameter_count(cfg: ModelConfig) -> int:
    """Parameters as Hugging Face counts them: the real vocabulary (no padding), a tied head counted
    once."""
    h = cfg.hidden_size
    norm = h * (2 if cfg.norm == "layernorm" and cfg.bias else 1)
    qkv_biases = cfg.head_dim * (cfg.num_heads + 2 * cfg.num_kv_heads)
    other_biases = h + cfg.ffn_size * (2 if cfg.activation == "swiglu" else 1) + h
    biases = (qkv_biases if cfg.bias or cfg.qkv_bias else 0) + (other_biases if cfg.bias else 0)
    block = _matmul_parameters_per_block(cfg) + biases + 2 * norm + qk_norm_parameters(cfg)
    embedding = cfg.vocab_size * h + (norm if cfg.embedding_norm else 0)
    head = 0 if cfg.tie_embeddings else cfg.vocab_size * h
    return embedding + cfg.num_layers * block + norm + head


def flops_per_token(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token (forward + backward = 3 x forward), for MFU.

    Counts the matrix multiplications, as PaLM (Chowdhery et al. 2022, appendix B) and Megatron do:
    2 FLOPs per weight per token in the forward pass for every linear layer and the LM head (the
    real vocabulary, not the padding), plus attention's two products QK^T and AV, 2 * 2 * seq_len *
    num_heads * head_dim per layer and token. Attention is counted over the full seq_len x seq_len
    score matrix, *not* halved for the causal mask, as PaLM's 6N + 12 L H Q T does, so the numbers
    compare with published MFU. Norms, activations, softmax and the embedding lookup are left out.
    """
    matmul_weights = (
        cfg.num_layers * _matmul_parameters_per_block(cfg) + cfg.vocab_size * cfg.hidden_size
    )
    attention = cfg.num_layers * 2 * 2 * seq_len * cfg.num_heads * cfg.head_dim
    return 3 * (2 * matmul_weights + attention)
