"""Hugging Face's BLOOM, Llama and Mistral `config.json` in the project's terms (ModelConfig), both
ways.

Torch-free, so that the command line reads a base model's shape (`model.base`,
pipeline/model/base_shape.py) in a moment; the tensor names of the same architectures are below.

Both directions of the config keys and the tensor names live here, next to each other, so that
import and export cannot drift apart. Tensors map 1:1 except BLOOM's fused `query_key_value`, whose
rows are interleaved per head ([q_0, k_0, v_0, q_1, k_1, v_1, ...], each head_dim rows), which the
project keeps as separate q, k, v: the two reshapes need torch and live together in hf_import.py
(`split_bloom_fused`, `fuse_bloom`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from pipeline.model.model_config import ModelConfig, RopeScaling, validate_model

BLOOM, LLAMA, MISTRAL = "BloomForCausalLM", "LlamaForCausalLM", "MistralForCausalLM"
SUPPORTED_ARCHITECTURES = (BLOOM, LLAMA, MISTRAL)
_MODEL_TYPES = {"bloom": BLOOM, "llama": LLAMA, "mistral": MISTRAL}
CONFIG_FILE = "config.json"


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

    def need(*keys: str):
        for key in keys:
            if hf.get(key) is not None:
                return hf[key]
        raise CheckpointError(
            f"{source}: `{keys[0]}` is missing; a {architecture} config.json needs it."
        )

    def refuse(key: str, value, supported: str):
        raise CheckpointError(f"{source}: `{key}`={value!r} is not supported ({supported}).")

    if architecture == BLOOM:
        if hf.get("apply_residual_connection_post_layernorm"):
            refuse(
                "apply_residual_connection_post_layernorm", True, "released BLOOM models use false"
            )
        hidden = need("hidden_size", "n_embed")
        heads = need("n_head", "num_attention_heads")
        return ModelConfig(
            hidden_size=hidden,
            num_layers=need("n_layer", "num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=heads,
            ffn_size=4 * hidden,
            vocab_size=need("vocab_size"),
            position="alibi",
            norm="layernorm",
            norm_eps=hf.get("layer_norm_epsilon", 1e-5),
            activation="gelu",
            embedding_norm=True,
            bias=True,
            tie_embeddings=hf.get("tie_word_embeddings", True),
            max_seq_len=hf.get("seq_length") or 2048,
            init_std=hf.get("initializer_range", 0.02),
        )

    hidden, heads = need("hidden_size"), need("num_attention_heads")
    if hf.get("hidden_act", "silu") != "silu":
        refuse("hidden_act", hf["hidden_act"], "SwiGLU needs silu")
    if hf.get("head_dim") not in (None, hidden // heads):
        refuse(
            "head_dim",
            hf["head_dim"],
            f"the model needs hidden_size / num_attention_heads = {hidden // heads}",
        )
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        refuse("partial_rotary_factor", hf["partial_rotary_factor"], "RoPE rotates the whole head")
    bias = bool(hf.get("attention_bias", False))
    if bool(hf.get("mlp_bias", False)) != bias:
        refuse(
            "mlp_bias",
            hf.get("mlp_bias"),
            "the model has biases everywhere or nowhere: it must equal attention_bias",
        )
    # transformers 4.x writes rope_theta and rope_scaling; 5.x nests both in rope_parameters.
    rope = dict(hf.get("rope_parameters") or {})
    scaling = hf.get("rope_scaling") or (
        rope if rope.get("rope_type", "default") != "default" else None
    )
    # transformers' MistralConfig attends within 4096 tokens when config.json does not say.
    window = hf.get("sliding_window", 4096) if architecture == MISTRAL else None
    return ModelConfig(
        hidden_size=hidden,
        num_layers=need("num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        ffn_size=need("intermediate_size"),
        vocab_size=need("vocab_size"),
        position="rope",
        rope_theta=hf.get("rope_theta") or rope.get("rope_theta", 10000.0),
        rope_scaling=_rope_scaling_from_hf(scaling, source),
        norm="rmsnorm",
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        activation="swiglu",
        embedding_norm=False,
        bias=bias,
        tie_embeddings=hf.get("tie_word_embeddings", False),
        max_seq_len=hf.get("max_position_embeddings", 2048),
        sliding_window=window,
        init_std=hf.get("initializer_range", 0.02),
    )


def _rope_scaling_from_hf(scaling: Optional[dict], source: str) -> Optional[RopeScaling]:
    if not scaling:
        return None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind == "default":
        return None
    if kind != "llama3":
        raise CheckpointError(
            f"{source}: RoPE scaling of type {kind!r} is not supported (supported: llama3, or "
            "none)."
        )
    return RopeScaling(
        type="llama3",
        factor=scaling["factor"],
        low_freq_factor=scaling["low_freq_factor"],
        high_freq_factor=scaling["high_freq_factor"],
        original_max_seq_len=scaling["original_max_position_embeddings"],
    )


def architecture_for(cfg: ModelConfig) -> str:
    """The Hugging Face architecture that expresses `cfg`, or an error naming what does not fit."""
    if cfg.position == "alibi":
        wanted = {
            "norm": "layernorm",
            "activation": "gelu",
            "embedding_norm": True,
            "bias": True,
            "ffn_size": 4 * cfg.hidden_size,
            "num_kv_heads": cfg.num_heads,
            "sliding_window": None,
        }
        architecture = BLOOM
    else:
        wanted = {"norm": "rmsnorm", "activation": "swiglu", "embedding_norm": False}
        # Mistral is Llama with a sliding window (and no biases).
        architecture = MISTRAL if cfg.sliding_window is not None else LLAMA
        if architecture == MISTRAL:
            wanted["bias"] = False
    wrong = [
        f"model.{key}={getattr(cfg, key)!r} (needs {value!r})"
        for key, value in wanted.items()
        if getattr(cfg, key) != value
    ]
    if wrong:
        raise CheckpointError(
            f"This model cannot be written as {architecture} (position={cfg.position}): "
            f"{'; '.join(wrong)}. Supported: {', '.join(SUPPORTED_ARCHITECTURES)}."
        )
    return architecture


def config_to_hf(cfg: ModelConfig, architecture: str, dtype: str, special_ids: dict) -> dict:
    """config.json for `architecture`, in the keys that transformers 4.x and 5.x both read."""
    common = {
        "architectures": [architecture],
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
            "model_type": "bloom",
            "n_layer": cfg.num_layers,
            "n_head": cfg.num_heads,
            "layer_norm_epsilon": cfg.norm_eps,
            "apply_residual_connection_post_layernorm": False,
            "seq_length": cfg.max_seq_len,
        }
    scaling = cfg.rope_scaling
    config = {
        **common,
        "model_type": "llama" if architecture == LLAMA else "mistral",
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.ffn_size,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_seq_len,
        "rope_theta": cfg.rope_theta,
        "rope_scaling": None
        if scaling is None
        else {
            "rope_type": scaling.type,
            "factor": scaling.factor,
            "low_freq_factor": scaling.low_freq_factor,
            "high_freq_factor": scaling.high_freq_factor,
            "original_max_position_embeddings": scaling.original_max_seq_len,
        },
    }
    if architecture == LLAMA:
        return {**config, "attention_bias": cfg.bias, "mlp_bias": cfg.bias}
    return {**config, "sliding_window": cfg.sliding_window}


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
)
_BLOOM_FUSED = "self_attention.query_key_value"
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
_BLOCK_NAME = re.compile(r"blocks\.(\d+)\.(.+)\.(weight|bias)")
_TOP_NAME = re.compile(r"(.+)\.(weight|bias)")


def tensor_names(architecture: str) -> TensorNames:
    return _BLOOM_NAMES if architecture == BLOOM else _LLAMA_NAMES


def hf_tensor_name(architecture: str, name: str) -> tuple[str, Optional[int]]:
    """Hugging Face's name of the project's tensor `name`, and for BLOOM's q/k/v their part (0-2) of
    the fused query_key_value."""
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
