"""Hugging Face's `config.json` of BLOOM, Llama, Mistral, Qwen2 (Qwen2.5), Qwen3, OLMo 2, Phi-3 and
the Gemma 2 and Gemma 3 text models in the project's terms (ModelConfig), both ways.

Torch-free, so that the command line reads a base model's shape (`model.base`,
pipeline/model/base_shape.py) in a moment; the tensor names of the same architectures are below.

Both directions of the config keys and the tensor names live here, next to each other, so that
import and export cannot drift apart. A config.json that asks for something the model does not
compute exactly (a RoPE scaling it lacks, partial rotary embeddings, biases where it has none) fails
naming the key and the reason, never approximated. Tensors map 1:1 except the fused ones, which the
project keeps as separate q, k, v (and gate, up): BLOOM's `query_key_value`, whose rows are
interleaved per head ([q_0, k_0, v_0, q_1, k_1, v_1, ...], each head_dim rows), and Phi-3's
`qkv_proj` ([q; k; v]) and `gate_up_proj` ([gate; up]); the reshapes need torch and live together
in hf_import.py (`split_fused`, `fuse`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional

from pipeline.model.model_config import (
    ARCHITECTURES,
    ModelConfig,
    RopeScaling,
    architecture_misfits,
    validate_model,
)

BLOOM, LLAMA, MISTRAL, QWEN2, QWEN3, OLMO2, PHI3, GEMMA2, GEMMA3 = ARCHITECTURES
SUPPORTED_ARCHITECTURES = ARCHITECTURES
_MODEL_TYPES = {
    "bloom": BLOOM,
    "llama": LLAMA,
    "mistral": MISTRAL,
    "qwen2": QWEN2,
    "qwen3": QWEN3,
    "olmo2": OLMO2,
    "phi3": PHI3,
    "gemma2": GEMMA2,
    "gemma3_text": GEMMA3,
}
_MODEL_TYPE_OF = {architecture: kind for kind, architecture in _MODEL_TYPES.items()}
CONFIG_FILE = "config.json"
# transformers' defaults where a config.json leaves a key out, per architecture.
_RMS_NORM_EPS = {OLMO2: 1e-5, PHI3: 1e-5}
_MAX_POSITIONS = {
    MISTRAL: 4096 * 32,
    QWEN2: 32768,
    QWEN3: 32768,
    PHI3: 4096,
    GEMMA2: 8192,
    GEMMA3: 131072,
}
_HEAD_DIMS = {GEMMA2: 256, GEMMA3: 256}
_ROPE_THETAS = {GEMMA3: 1_000_000.0}
_GEMMA3_LOCAL_THETA = 10_000.0
_PHI3_ORIGINAL_CONTEXT = 4096
_QWEN_MAX_WINDOW_LAYERS = 28


class CheckpointError(ValueError):
    """A Hugging Face folder that cannot be read or written; the message says which file and what to
    do."""


def read_json(path: Path, missing_hint: str = "") -> dict:
    if not path.is_file():
        raise CheckpointError(f"{path} is missing. {missing_hint}".strip())
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise CheckpointError(
            f"{path} is not valid JSON ({error}); restore it from the original checkpoint."
        ) from None


def read_config(path) -> tuple[str, ModelConfig]:
    """The architecture and ModelConfig of a Hugging Face model folder."""
    source = Path(path) / CONFIG_FILE
    hf = read_json(
        source,
        "from_hf wants a local Hugging Face model folder with config.json and *.safetensors.",
    )
    architecture = architecture_of(hf, str(source))
    cfg = config_from_hf(hf, architecture, str(source))
    try:
        validate_model(cfg)
    except ValueError as error:
        raise CheckpointError(
            f"{source} describes a model the project cannot build: {error}"
        ) from None
    return architecture, cfg


def architecture_of(hf: dict, source: str) -> str:
    """The architecture named by a config.json, or an error naming the supported ones."""
    declared = hf.get("architectures") or []
    architecture = next((a for a in declared if a in SUPPORTED_ARCHITECTURES), None)
    if architecture is None and not declared:
        architecture = _MODEL_TYPES.get(hf.get("model_type"))
    if architecture is None:
        found = declared or [f"model_type={hf.get('model_type')!r}"]
        raise CheckpointError(
            f"{source}: unsupported architecture {', '.join(map(str, found))}. Supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    return architecture


def config_from_hf(hf: dict, architecture: str, source: str) -> ModelConfig:
    """The ModelConfig of a Hugging Face config.json (already known to be of `architecture`)."""
    keys = _HFKeys(hf, architecture, source)
    if architecture == BLOOM:
        return _bloom_config(keys)
    hidden, heads = keys.need("hidden_size"), keys.need("num_attention_heads")
    layers = keys.need("num_hidden_layers")
    head_dim = hf.get("head_dim") or _HEAD_DIMS.get(architecture) or hidden // heads
    partial = hf.get(
        "partial_rotary_factor", (hf.get("rope_parameters") or {}).get("partial_rotary_factor")
    )
    if partial not in (None, 1.0):
        keys.refuse("partial_rotary_factor", partial, "RoPE rotates the whole head")
    max_seq_len = hf.get("max_position_embeddings", _MAX_POSITIONS.get(architecture, 2048))
    window, window_layers = _sliding_window_from_hf(keys, layers)
    rope, local_rope = _rope_parameters(keys)
    config = ModelConfig(
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_size=None if head_dim == hidden // heads and not hidden % heads else head_dim,
        ffn_size=keys.need("intermediate_size"),
        vocab_size=keys.need("vocab_size"),
        position="rope",
        rope_theta=rope.get("rope_theta") or _ROPE_THETAS.get(architecture, 10000.0),
        rope_scaling=_rope_scaling_from_hf(keys, rope, head_dim, max_seq_len),
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", _RMS_NORM_EPS.get(architecture, 1e-6)),
        embedding_norm=False,
        qk_norm={QWEN3: "head", OLMO2: "full", GEMMA3: "head"}.get(architecture, "none"),
        norm_placement={OLMO2: "post", GEMMA2: "both", GEMMA3: "both"}.get(architecture, "pre"),
        tie_embeddings=hf.get("tie_word_embeddings", architecture in (GEMMA2, GEMMA3)),
        max_seq_len=max_seq_len,
        sliding_window=window,
        sliding_window_layers=window_layers,
        init_std=hf.get("initializer_range", 0.02),
        hf_architecture=architecture,
    )
    _set_biases(keys, config)
    if architecture in (GEMMA2, GEMMA3):
        _set_gemma_fields(keys, config, local_rope)
    elif hf.get("hidden_act", "silu") != "silu":
        keys.refuse("hidden_act", hf["hidden_act"], "SwiGLU needs silu")
    return config


@dataclass(frozen=True)
class _HFKeys:
    """A config.json being read: its keys, and errors that name its file."""

    hf: dict
    architecture: str
    source: str

    def need(self, *keys: str):
        for key in keys:
            if self.hf.get(key) is not None:
                return self.hf[key]
        raise CheckpointError(
            f"{self.source}: `{keys[0]}` is missing; a {self.architecture} config.json needs it."
        )

    def refuse(self, key: str, value, supported: str):
        raise CheckpointError(f"{self.source}: `{key}`={value!r} is not supported ({supported}).")

    def get(self, key: str, default=None):
        """The key's value, `default` where config.json leaves it out (a null stays null)."""
        return self.hf[key] if key in self.hf else default


def _bloom_config(keys: _HFKeys) -> ModelConfig:
    hf = keys.hf
    if hf.get("apply_residual_connection_post_layernorm"):
        keys.refuse(
            "apply_residual_connection_post_layernorm", True, "released BLOOM models use false"
        )
    hidden = keys.need("hidden_size", "n_embed")
    heads = keys.need("n_head", "num_attention_heads")
    return ModelConfig(
        hidden_size=hidden,
        num_layers=keys.need("n_layer", "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=heads,
        ffn_size=4 * hidden,
        vocab_size=keys.need("vocab_size"),
        position="alibi",
        norm="layernorm",
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        activation="gelu",
        embedding_norm=True,
        bias=True,
        tie_embeddings=hf.get("tie_word_embeddings", True),
        max_seq_len=hf.get("seq_length") or 2048,
        init_std=hf.get("initializer_range", 0.02),
        hf_architecture=BLOOM,
    )


def _set_biases(keys: _HFKeys, config: ModelConfig) -> None:
    """Biases everywhere or nowhere (Llama, Mistral), on q, k and v only (Qwen2), or none."""
    hf, architecture = keys.hf, keys.architecture
    if architecture in (LLAMA, MISTRAL):
        config.bias = bool(hf.get("attention_bias", False))
        if bool(hf.get("mlp_bias", False)) != config.bias:
            keys.refuse(
                "mlp_bias",
                hf.get("mlp_bias"),
                "the model has biases everywhere or nowhere: it must equal attention_bias",
            )
    elif architecture == QWEN2:
        config.qkv_bias = True  # Qwen2's q, k and v always have biases, its other layers never
    elif hf.get("attention_bias"):
        keys.refuse(
            "attention_bias",
            True,
            f"{architecture}'s attention_bias adds a bias to o_proj too, which the model has only "
            "with biases in the MLP as well; released models use false",
        )


def _set_gemma_fields(keys: _HFKeys, config: ModelConfig, local_rope: Optional[dict]) -> None:
    """GeGLU, the norms as offsets from one, the scaled embedding, the query scale, the soft caps
    and Gemma 3's RoPE base of its local layers, with transformers' defaults."""
    activation = keys.get("hidden_activation") or keys.get("hidden_act", "gelu_pytorch_tanh")
    if activation != "gelu_pytorch_tanh":
        keys.refuse("hidden_activation", activation, "GeGLU with GELU's tanh approximation")
    if keys.get("use_bidirectional_attention"):
        keys.refuse("use_bidirectional_attention", True, "the model is causal")
    gemma2 = keys.architecture == GEMMA2
    config.activation, config.norm_unit_offset, config.embedding_scale = "geglu", True, True
    config.attention_scale_size = keys.get("query_pre_attn_scalar", 256)
    config.attention_softcap = keys.get("attn_logit_softcapping", 50.0 if gemma2 else None)
    config.logit_softcap = keys.get("final_logit_softcapping", 30.0 if gemma2 else None)
    if local_rope is not None and config.sliding_window is not None:
        if local_rope.get("rope_type", "default") != "default":
            keys.refuse(
                "rope_parameters.sliding_attention.rope_type",
                local_rope["rope_type"],
                "the local layers rotate unscaled",
            )
        config.rope_local_theta = local_rope.get("rope_theta") or _GEMMA3_LOCAL_THETA


def _sliding_window_from_hf(
    keys: _HFKeys, layers: int
) -> tuple[Optional[int], Optional[list[int]]]:
    """The attention window and the layers that use it (None: all), as transformers reads them."""
    hf, architecture = keys.hf, keys.architecture
    if architecture == MISTRAL:
        # transformers' MistralConfig attends within 4096 tokens when config.json does not say.
        return hf.get("sliding_window", 4096), None
    if architecture == PHI3:
        return hf.get("sliding_window"), None
    if architecture in (GEMMA2, GEMMA3):
        # Gemma 2 slides in every other layer, Gemma 3 in five of six (sliding_window_pattern).
        window = keys.get("sliding_window", 4096)
        pattern = 2 if architecture == GEMMA2 else hf.get("sliding_window_pattern", 6)
        default_sliding = [i for i in range(layers) if (i + 1) % pattern]
    elif architecture in (QWEN2, QWEN3):
        # Qwen: a window only with use_sliding_window (false in every released model), for the
        # layers that layer_types names (transformers 5 writes it) or else from max_window_layers
        # on.
        window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
        first = hf.get("max_window_layers", _QWEN_MAX_WINDOW_LAYERS)
        default_sliding = list(range(first, layers))
    else:
        return None, None
    if window is None:
        return None, None
    types = hf.get("layer_types") or [
        "sliding_attention" if i in default_sliding else "full_attention" for i in range(layers)
    ]
    if len(types) != layers or set(types) - {"full_attention", "sliding_attention"}:
        keys.refuse(
            "layer_types",
            types,
            f"one of full_attention and sliding_attention for each of the {layers} layers",
        )
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    if not sliding:
        return None, None
    return window, None if len(sliding) == layers else sliding


def _rope_parameters(keys: _HFKeys) -> tuple[dict, Optional[dict]]:
    """The RoPE parameters of the (global) layers, with theta, and Gemma 3's of its local layers.
    transformers 4.x writes rope_theta and rope_scaling (Gemma 3: rope_local_base_freq); 5.x nests
    them in rope_parameters (Gemma 3: one dict per layer type)."""
    hf = keys.hf
    nested = dict(hf.get("rope_parameters") or {})
    local = None
    if keys.architecture == GEMMA3:
        local = nested.pop("sliding_attention", None) or {
            "rope_theta": hf.get("rope_local_base_freq")
        }
        nested = dict(nested.pop("full_attention", None) or nested)
    scaling = hf.get("rope_scaling") or nested
    theta = hf.get("rope_theta") or nested.get("rope_theta")
    return {**scaling, "rope_theta": theta}, local


def _rope_scaling_from_hf(
    keys: _HFKeys, scaling: dict, head_dim: int, max_seq_len: int
) -> Optional[RopeScaling]:
    """The RoPE scaling of a config.json, with what transformers derives from other keys
    (transformers.modeling_rope_utils) made explicit; a kind the model does not compute exactly
    fails, naming it."""
    hf, architecture = keys.hf, keys.architecture
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return None
    if architecture == PHI3 and kind in ("su", "yarn"):
        kind = "longrope"  # Phi3Config's own names of LongRoPE
    # Phi-3 keeps its pretraining context beside rope_scaling, and transformers prefers it there.
    original = (
        hf.get("original_max_position_embeddings", _PHI3_ORIGINAL_CONTEXT)
        if architecture == PHI3
        else scaling.get("original_max_position_embeddings") or max_seq_len
    )
    factor = scaling.get("factor")
    if kind == "llama3":
        return RopeScaling(
            type="llama3",
            factor=factor,
            low_freq_factor=scaling["low_freq_factor"],
            high_freq_factor=scaling["high_freq_factor"],
            original_max_seq_len=original,
        )
    if kind == "linear":
        return RopeScaling(type="linear", factor=factor, original_max_seq_len=original)
    if factor is None:
        factor = max_seq_len / original
    if kind == "yarn":
        return _yarn_scaling(scaling, factor, original)
    if kind == "longrope":
        return _longrope_scaling(keys, scaling, factor, original, head_dim)
    if kind == "dynamic":
        keys.refuse(
            "rope_scaling.rope_type",
            kind,
            "transformers' dynamic NTK scaling changes the frequencies with the longest sequence "
            "it has run so far, which training cannot reproduce; supported: llama3, linear, yarn, "
            "longrope, or none",
        )
    keys.refuse(
        "rope_scaling.rope_type", kind, "supported: llama3, linear, yarn, longrope, or none"
    )


def _yarn_scaling(scaling: dict, factor: float, original: int) -> RopeScaling:
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        mscale, mscale_all_dim = scaling.get("mscale"), scaling.get("mscale_all_dim")

        def yarn_mscale(scale: float, m: float = 1.0) -> float:
            return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

        attention_factor = (
            float(yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim))
            if mscale and mscale_all_dim
            else yarn_mscale(factor)
        )
    return RopeScaling(
        type="yarn",
        factor=factor,
        original_max_seq_len=original,
        beta_fast=scaling.get("beta_fast") or 32.0,
        beta_slow=scaling.get("beta_slow") or 1.0,
        truncate=scaling.get("truncate", True),
        attention_factor=attention_factor,
    )


def _longrope_scaling(
    keys: _HFKeys, scaling: dict, factor: float, original: int, head_dim: int
) -> RopeScaling:
    attention_factor = scaling.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    for key in ("short_factor", "long_factor"):
        if len(scaling.get(key) or ()) != head_dim // 2:
            keys.refuse(
                f"rope_scaling.{key}",
                scaling.get(key),
                f"LongRoPE needs one factor per pair of a head's {head_dim} values",
            )
    return RopeScaling(
        type="longrope",
        factor=factor,
        original_max_seq_len=original,
        attention_factor=attention_factor,
        short_factor=[float(f) for f in scaling["short_factor"]],
        long_factor=[float(f) for f in scaling["long_factor"]],
    )


def architecture_for(cfg: ModelConfig) -> str:
    """The Hugging Face architecture that expresses `cfg`: `cfg.hf_architecture` (a base's own), or
    the one its shape calls for; an error names what does not fit."""
    architecture = cfg.hf_architecture or _architecture_of_shape(cfg)
    misfits = architecture_misfits(cfg, architecture)
    if misfits:
        raise CheckpointError(
            f"This model cannot be written as {architecture} (position={cfg.position}): "
            f"{'; '.join(misfits)}. Supported: {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    return architecture


def _architecture_of_shape(cfg: ModelConfig) -> str:
    if cfg.position == "alibi":
        return BLOOM
    if cfg.norm_placement == "both":
        return GEMMA3 if cfg.qk_norm == "head" or cfg.rope_local_theta is not None else GEMMA2
    if cfg.norm_placement == "post" or cfg.qk_norm == "full":
        return OLMO2
    if cfg.qk_norm == "head":
        return QWEN3
    if cfg.qkv_bias and not cfg.bias or cfg.sliding_window_layers is not None:
        return QWEN2
    # Mistral is Llama with a sliding window (and no biases).
    return MISTRAL if cfg.sliding_window is not None else LLAMA


def config_to_hf(cfg: ModelConfig, architecture: str, dtype: str, special_ids: dict) -> dict:
    """config.json for `architecture`, in the keys that transformers 4.x and 5.x both read."""
    common = {
        "architectures": [architecture],
        "model_type": _MODEL_TYPE_OF[architecture],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "initializer_range": cfg.init_std,
        "torch_dtype": dtype,
        **{f"{role}_token_id": special_ids.get(role) for role in ("bos", "eos", "pad")},
    }
    if architecture == BLOOM:
        return {
            **common,
            "n_layer": cfg.num_layers,
            "n_head": cfg.num_heads,
            "layer_norm_epsilon": cfg.norm_eps,
            "apply_residual_connection_post_layernorm": False,
            "seq_length": cfg.max_seq_len,
        }
    config = {
        **common,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_size,
        "hidden_act": "gelu_pytorch_tanh" if cfg.activation == "geglu" else "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": _rope_scaling_to_hf(cfg.rope_scaling),
    }
    if architecture == LLAMA:
        return {**config, "attention_bias": cfg.bias, "mlp_bias": cfg.bias}
    if architecture == MISTRAL:
        return {**config, "sliding_window": cfg.sliding_window}
    if architecture in (QWEN2, QWEN3):
        sliding = _sliding_layers(cfg)
        config.update(
            {
                "use_sliding_window": bool(sliding),
                "sliding_window": cfg.sliding_window,
                # transformers 5 reads layer_types; earlier versions slide from max_window_layers on.
                "max_window_layers": sliding[0] if sliding else cfg.num_layers,
                "layer_types": [
                    "sliding_attention" if i in sliding else "full_attention"
                    for i in range(cfg.num_layers)
                ],
            }
        )
        return config if architecture == QWEN2 else {**config, "attention_bias": False}
    if architecture == OLMO2:
        return {**config, "attention_bias": False}
    if architecture in (GEMMA2, GEMMA3):
        return _gemma_config(cfg, architecture, config)
    # Phi-3 keeps the pretraining context beside rope_scaling (transformers prefers it there).
    scaling = cfg.rope_scaling
    return {
        **config,
        "sliding_window": cfg.sliding_window,
        "original_max_position_embeddings": cfg.max_seq_len
        if scaling is None
        else scaling.original_max_seq_len,
    }


def _gemma_config(cfg: ModelConfig, architecture: str, config: dict) -> dict:
    """Gemma 2's and 3's keys over the common ones: the activation, the query scale, the soft caps,
    the layers' types and Gemma 3's local RoPE base."""
    sliding = _sliding_layers(cfg)
    config = {
        **config,
        "hidden_activation": "gelu_pytorch_tanh",
        "attention_bias": False,
        "query_pre_attn_scalar": cfg.attention_scale_size or cfg.head_dim,
        "attn_logit_softcapping": cfg.attention_softcap,
        "final_logit_softcapping": cfg.logit_softcap,
        # transformers builds Gemma's windowed mask even where no layer uses it
        "sliding_window": cfg.sliding_window or cfg.max_seq_len,
        "layer_types": [
            "sliding_attention" if i in sliding else "full_attention" for i in range(cfg.num_layers)
        ],
    }
    if architecture == GEMMA3:
        # transformers 5 reads these into rope_parameters (its global and local layers' bases)
        config["rope_local_base_freq"] = cfg.rope_local_theta or cfg.rope_theta
    return config


def _sliding_layers(cfg: ModelConfig) -> list[int]:
    if cfg.sliding_window is None:
        return []
    return cfg.sliding_window_layers or list(range(cfg.num_layers))


def _rope_scaling_to_hf(scaling: Optional[RopeScaling]) -> Optional[dict]:
    """rope_scaling with the keys transformers reads for its type, all explicit."""
    if scaling is None:
        return None
    keys = {
        "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_seq_len"),
        "linear": ("factor",),
        "yarn": (
            "factor",
            "original_max_seq_len",
            "beta_fast",
            "beta_slow",
            "truncate",
            "attention_factor",
        ),
        "longrope": (
            "factor",
            "original_max_seq_len",
            "attention_factor",
            "short_factor",
            "long_factor",
        ),
    }[scaling.type]
    hf_key = {"original_max_seq_len": "original_max_position_embeddings"}
    return {
        "rope_type": scaling.type,
        **{hf_key.get(key, key): getattr(scaling, key) for key in keys},
    }


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
    # The project's names inside a block that are parts of a fused tensor -> (Hugging Face's name
    # of it, the part's place in it).
    fused: Optional[dict] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "fused", self.fused or {})


_BLOOM_NAMES = TensorNames(
    prefix="transformer.",
    top={
        "embedding.tokens": "word_embeddings",
        "embedding.norm": "word_embeddings_layernorm",
        "final_norm": "ln_f",
    },
    layers="h",
    block={
        "attn_norm": "input_layernorm",
        "attn.out": "self_attention.dense",
        "mlp_norm": "post_attention_layernorm",
        "mlp.up": "mlp.dense_h_to_4h",
        "mlp.down": "mlp.dense_4h_to_h",
    },
    fused={
        "attn.q": ("self_attention.query_key_value", 0),
        "attn.k": ("self_attention.query_key_value", 1),
        "attn.v": ("self_attention.query_key_value", 2),
    },
)
_LLAMA_NAMES = TensorNames(
    prefix="model.",
    top={"embedding.tokens": "embed_tokens", "final_norm": "norm"},
    layers="layers",
    block={
        "attn_norm": "input_layernorm",
        "attn.q": "self_attn.q_proj",
        "attn.k": "self_attn.k_proj",
        "attn.v": "self_attn.v_proj",
        "attn.out": "self_attn.o_proj",
        "mlp_norm": "post_attention_layernorm",
        "mlp.gate": "mlp.gate_proj",
        "mlp.up": "mlp.up_proj",
        "mlp.down": "mlp.down_proj",
    },
)
_QK_NORMS = {"attn.q_norm": "self_attn.q_norm", "attn.k_norm": "self_attn.k_norm"}


def _llama_names_with(block: dict, **fused) -> TensorNames:
    """Llama's names with `block`'s over its block names (and fused tensors, if any)."""
    return replace(_LLAMA_NAMES, block={**_LLAMA_NAMES.block, **block}, fused=fused or None)


_QWEN3_NAMES = _llama_names_with(_QK_NORMS)
# OLMo 2's norms follow the sublayers: the project's attn_norm normalises the attention's output.
_OLMO2_NAMES = _llama_names_with(
    {
        **_QK_NORMS,
        "attn_norm": "post_attention_layernorm",
        "mlp_norm": "post_feedforward_layernorm",
    }
)
# Gemma's four norms: before and after each sublayer (Gemma 3's q/k norms too).
_GEMMA_NORMS = {
    "attn_out_norm": "post_attention_layernorm",
    "mlp_norm": "pre_feedforward_layernorm",
    "mlp_out_norm": "post_feedforward_layernorm",
}
_GEMMA2_NAMES = _llama_names_with(_GEMMA_NORMS)
_GEMMA3_NAMES = _llama_names_with({**_GEMMA_NORMS, **_QK_NORMS})
# Phi-3 fuses q, k, v and gate, up: their entries of Llama's block names are never looked up.
_PHI3_NAMES = _llama_names_with(
    {},
    **{
        "attn.q": ("self_attn.qkv_proj", 0),
        "attn.k": ("self_attn.qkv_proj", 1),
        "attn.v": ("self_attn.qkv_proj", 2),
        "mlp.gate": ("mlp.gate_up_proj", 0),
        "mlp.up": ("mlp.gate_up_proj", 1),
    },
)
_NAMES = {
    BLOOM: _BLOOM_NAMES,
    QWEN3: _QWEN3_NAMES,
    OLMO2: _OLMO2_NAMES,
    PHI3: _PHI3_NAMES,
    GEMMA2: _GEMMA2_NAMES,
    GEMMA3: _GEMMA3_NAMES,
}
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")
_TOP_NAME = re.compile(r"(.+)\.(weight|bias)")


def tensor_names(architecture: str) -> TensorNames:
    return _NAMES.get(architecture, _LLAMA_NAMES)


def hf_tensor_name(architecture: str, name: str) -> tuple[str, Optional[int]]:
    """Hugging Face's name of the project's tensor `name`, and for a part of a fused tensor (BLOOM's
    query_key_value, Phi-3's qkv_proj and gate_up_proj) its place in it."""
    names = tensor_names(architecture)
    if name == "head.weight":
        return "lm_head.weight", None
    block = _BLOCK_NAME.fullmatch(name)
    if block:
        index, module, kind = block.groups()
        layer = f"{names.prefix}{names.layers}.{index}"
        if module in names.fused:
            fused, part = names.fused[module]
            return f"{layer}.{fused}.{kind}", part
        return f"{layer}.{names.block[module]}.{kind}", None
    module, kind = _TOP_NAME.fullmatch(name).groups()
    return f"{names.prefix}{names.top[module]}.{kind}", None
