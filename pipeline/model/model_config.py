"""The transformer's shape, a typed config: the `model` section, presets in `pipeline/conf/model/`.

One dataclass covers the families the recipe starts from: BLOOM (ALiBi, LayerNorm, embedding
LayerNorm, GELU, biases, tied head), Llama/Mistral (RoPE, RMSNorm, SwiGLU, grouped-query attention)
and what Qwen, OLMo 2, Phi-3 and Gemma 2/3 change on the latter (q/k biases and norms, norms after
the sublayers, GeGLU, soft-capped scores, windowed layers with their own RoPE base). This module imports no torch, so that the command line can check a config without
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
ACTIVATIONS = ("gelu", "swiglu", "geglu")
QK_NORMS = ("none", "head", "full")
NORM_PLACEMENTS = ("pre", "post", "both")
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
    "Gemma2ForCausalLM",
    "Gemma3ForCausalLM",
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
    # Width of the feed-forward layer (for swiglu and geglu: of each of its gate and up
    # projections).
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
    # gelu: down(gelu(up(x))) (BLOOM); swiglu: down(silu(gate(x)) * up(x)) (Llama and most since);
    # geglu: the same with GELU's tanh approximation as the gate (Gemma).
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
    # no input norm); `both`, on each sublayer's input and output (x + norm2(attn(norm1(x))),
    # Gemma 2 and 3: four norms a block). The final norm follows the last block either way.
    norm_placement: str = "pre"
    # RMSNorm weights stored as offsets from one, the norm scaling by 1 + weight in float32 (Gemma);
    # a new model's norms then start at zero.
    norm_unit_offset: bool = False
    # The token embeddings multiplied by sqrt(hidden_size), rounded to the activations' dtype
    # (Gemma).
    embedding_scale: bool = False
    # Attention scores scaled by 1 / sqrt(this) instead of 1 / sqrt(head_dim) (Gemma's
    # query_pre_attn_scalar); null: head_dim.
    attention_scale_size: Optional[int] = None
    # Scores capped to c * tanh(score / c) before the softmax (Gemma 2's attn_logit_softcapping: 50);
    # null: not capped.
    attention_softcap: Optional[float] = None
    # The head's logits capped the same way (Gemma 2's final_logit_softcapping: 30), in training's
    # fused loss too; null: not capped.
    logit_softcap: Optional[float] = None
    # The head reuses the input embedding matrix.
    tie_embeddings: bool = True
    # The longest sequence the model is made for (Hugging Face's max_position_embeddings).
    max_seq_len: int = 256
    # The attention window: a query sees itself and the sliding_window - 1 tokens before it
    # (Mistral, Gemma's local layers); null: the whole sequence.
    sliding_window: Optional[int] = None
    # The layers (0-based) that attend within sliding_window, where only some do (Gemma 2: every
    # other one, Gemma 3: five of six; Qwen2/Qwen3 with use_sliding_window: the layers from
    # max_window_layers on); null: all of them.
    sliding_window_layers: Optional[list[int]] = None
    # The RoPE base of the windowed layers, which then rotate unscaled (Gemma 3: 10,000 there and
    # rope_theta 1,000,000, with rope_scaling, in the global layers); null: rope_theta and
    # rope_scaling in every layer.
    rope_local_theta: Optional[float] = None
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
    def softmax_scale(self) -> float:
        return (self.attention_scale_size or self.head_dim) ** -0.5

    def layer_window(self, layer: int) -> Optional[int]:
        """The attention window of block `layer` (None: the whole sequence)."""
        layers = self.sliding_window_layers
        return self.sliding_window if layers is None or layer in layers else None

    @property
    def padded_vocab_size(self) -> int:
        multiple = self.pad_vocab_multiple
        return -(-self.vocab_size // multiple) * multiple


# What a training length of null takes: the model's context, at most
# this much (continued pretraining rarely needs a base's whole context, and attention's share of the
# compute grows with it).
DEFAULT_TRAINING_SEQ_LEN = 2048


def training_seq_len(model: ModelConfig, seq_len: Optional[int]) -> int:
    """The tokens per training sequence: `seq_len` (train.seq_len), or for null the model's context,
    at most DEFAULT_TRAINING_SEQ_LEN."""
    if seq_len is not None:
        return seq_len
    return min(model.max_seq_len, DEFAULT_TRAINING_SEQ_LEN)


def uneven_for_tensor_parallel(model: ModelConfig, tp: int) -> list[str]:
    """The sizes that tensor parallelism cuts into `tp` equal parts (query heads, key/value heads,
    feed-forward width) and `tp` does not divide."""
    return [key for key in ("num_heads", "num_kv_heads", "ffn_size") if getattr(model, key) % tp]


def validate_model(model: ModelConfig, prefix: str = "model") -> None:
    """Checks that types alone cannot express; each error names the key and what is allowed."""
    _validate_choices_and_sizes(model, prefix)
    _validate_heads(model, prefix)
    _validate_options(model, prefix)
    _validate_window(model, prefix)
    if model.rope_scaling is not None:
        _validate_rope_scaling(model, prefix)
    if model.hf_architecture is not None:
        _validate_architecture(model, prefix)


def _validate_choices_and_sizes(model: ModelConfig, prefix: str) -> None:
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
    for key in ("norm_eps", "init_std", "rope_theta"):
        if not getattr(model, key) > 0:
            raise ConfigError(f"{prefix}.{key}", getattr(model, key), ["a positive number"])
    for key in ("attention_scale_size", "attention_softcap", "logit_softcap", "rope_local_theta"):
        value = getattr(model, key)
        if value is not None and not 0 < value < float("inf"):
            raise ConfigError(f"{prefix}.{key}", value, ["null", "a positive number"])


def _validate_heads(model: ModelConfig, prefix: str) -> None:
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
    if model.num_heads % model.num_kv_heads:
        raise ConfigError(
            f"{prefix}.num_kv_heads",
            model.num_kv_heads,
            [
                f"a divisor of {prefix}.num_heads={model.num_heads} (1 for multi-query, "
                f"{model.num_heads} for multi-head attention)"
            ],
        )


def _validate_options(model: ModelConfig, prefix: str) -> None:
    """The options that only some positions or norms have."""
    if model.qk_norm != "none" and model.position != "rope":
        raise ConfigError(
            f"{prefix}.qk_norm",
            model.qk_norm,
            [f"none when {prefix}.position={model.position} (q/k norms come before RoPE)"],
        )
    if model.attention_softcap is not None and model.position != "rope":
        raise ConfigError(
            f"{prefix}.attention_softcap",
            model.attention_softcap,
            [f"null when {prefix}.position={model.position} (the kernels cap RoPE scores only)"],
        )
    if model.norm_unit_offset and model.norm != "rmsnorm":
        raise ConfigError(
            f"{prefix}.norm_unit_offset", True, [f"false when {prefix}.norm={model.norm}"]
        )


def _validate_window(model: ModelConfig, prefix: str) -> None:
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
    if model.rope_local_theta is not None and (
        model.sliding_window is None or model.position != "rope"
    ):
        raise ConfigError(
            f"{prefix}.rope_local_theta",
            model.rope_local_theta,
            ["null", f"a base for the windowed layers, with {prefix}.sliding_window set (RoPE)"],
        )


def _validate_architecture(model: ModelConfig, prefix: str) -> None:
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


# What each architecture's config.json can say, beyond the keys every architecture has; a key left
# out must keep its default (_PLAIN).
_PLAIN = {
    "position": "rope",
    "norm": "rmsnorm",
    "activation": "swiglu",
    "embedding_norm": False,
    "qkv_bias": False,
    "qk_norm": "none",
    "norm_placement": "pre",
    "norm_unit_offset": False,
    "embedding_scale": False,
    "attention_scale_size": None,
    "attention_softcap": None,
    "logit_softcap": None,
    "rope_local_theta": None,
}
_GEMMA = {
    "activation": "geglu",
    "bias": False,
    "norm_placement": "both",
    "norm_unit_offset": True,
    "embedding_scale": True,
}
_ARCHITECTURE_NEEDS = {
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
    "Gemma2ForCausalLM": _GEMMA,
    "Gemma3ForCausalLM": {**_GEMMA, "qk_norm": "head"},
}
# The keys that an architecture's config.json states freely (not fixed to _PLAIN's values).
_FREE = {
    "Gemma2ForCausalLM": ("attention_scale_size", "attention_softcap", "logit_softcap"),
    "Gemma3ForCausalLM": (
        "attention_scale_size",
        "attention_softcap",
        "logit_softcap",
        "rope_local_theta",
    ),
}


def architecture_misfits(model: ModelConfig, architecture: str) -> list[str]:
    """What keeps `architecture` (one of ARCHITECTURES) from expressing `model`, as
    "model.<key>=<value> (needs ...)"; empty if it fits."""
    if architecture == "BloomForCausalLM":
        wanted = {
            **_PLAIN,
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
        wanted = {**_PLAIN, **_ARCHITECTURE_NEEDS[architecture]}
        for key in _FREE.get(architecture, ()):
            wanted.pop(key)
    if architecture in ("BloomForCausalLM", "LlamaForCausalLM") and model.bias:
        wanted["qkv_bias"] = model.qkv_bias  # biases everywhere include q, k and v's
    misfits = [
        f"model.{key}={getattr(model, key)!r} (needs {value!r})"
        for key, value in wanted.items()
        if getattr(model, key) != value
    ]
    scaling = model.rope_scaling
    if (
        architecture == "Gemma3ForCausalLM"
        and scaling is not None
        and model.sliding_window is not None
        and model.rope_local_theta is None
    ):
        misfits.append(
            "model.rope_local_theta=None (needs a base: Gemma 3's windowed layers rotate without "
            "rope_scaling)"
        )
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


def gated(cfg: ModelConfig) -> bool:
    """Whether the MLP has a gate projection beside its up projection (SwiGLU, GeGLU)."""
    return cfg.activation in ("swiglu", "geglu")


def norms_per_block(cfg: ModelConfig) -> int:
    return 4 if cfg.norm_placement == "both" else 2


def _matmul_parameters_per_block(cfg: ModelConfig) -> int:
    """Weights of the matrix multiplications in one block: attention q, k, v, out and the MLP."""
    attention = cfg.hidden_size * cfg.head_dim * (2 * cfg.num_heads + 2 * cfg.num_kv_heads)
    mlp = (3 if gated(cfg) else 2) * cfg.hidden_size * cfg.ffn_size
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
    other_biases = h + cfg.ffn_size * (2 if gated(cfg) else 1) + h
    biases = (qkv_biases if cfg.bias or cfg.qkv_bias else 0) + (other_biases if cfg.bias else 0)
    block = (
        _matmul_parameters_per_block(cfg)
        + biases
        + norms_per_block(cfg) * norm
        + qk_norm_parameters(cfg)
    )
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
    compare with published MFU; a windowed layer over seq_len x its window where that is shorter.
    Norms, activations, softmax and the embedding lookup are left out.
    """
    matmul_weights = (
        cfg.num_layers * _matmul_parameters_per_block(cfg) + cfg.vocab_size * cfg.hidden_size
    )
    keys = sum(min(seq_len, cfg.layer_window(layer) or seq_len) for layer in range(cfg.num_layers))
    attention = 2 * 2 * keys * cfg.num_heads * cfg.head_dim
    return 3 * (2 * matmul_weights + attention)
