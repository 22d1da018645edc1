"""The shape of a Hugging Face model folder from its config.json alone, without torch, for `stage=plan
model.base=<folder>`. It reads what the planner needs of the three architectures that pipeline/model/hf_import.py
loads (BLOOM, Llama, Mistral) and nothing else; loading the model (`from_hf`) checks the rest.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from pipeline.model.config import ModelConfig

CONFIG_FILE = "config.json"


class ShapeError(ValueError):
    """A model folder whose shape cannot be read; the message names the file and what to do."""


def read_hf_shape(folder, base: ModelConfig) -> ModelConfig:
    """`base` (the model preset) with the sizes of the Hugging Face model in `folder`."""
    path = Path(folder) / CONFIG_FILE
    try:
        hf = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise ShapeError(f"model.base: cannot read {path} ({error}); give a local Hugging Face model folder with "
                         f"its config.json.") from None
    model_type = hf.get("model_type")

    def need(*keys: str):
        for key in keys:
            if hf.get(key) is not None:
                return hf[key]
        raise ShapeError(f"{path}: `{keys[0]}` is missing; a {model_type} config.json has it.")

    if model_type == "bloom":
        hidden, heads = need("hidden_size", "n_embed"), need("n_head", "num_attention_heads")
        return dataclasses.replace(
            base, hidden_size=hidden, num_layers=need("n_layer", "num_hidden_layers"), num_heads=heads,
            num_kv_heads=heads, ffn_size=4 * hidden, vocab_size=need("vocab_size"), position="alibi",
            norm="layernorm", activation="gelu", embedding_norm=True, bias=True,
            tie_embeddings=hf.get("tie_word_embeddings", True), max_seq_len=hf.get("seq_length") or 2048,
            sliding_window=None, rope_scaling=None)
    if model_type in ("llama", "mistral"):
        heads = need("num_attention_heads")
        return dataclasses.replace(
            base, hidden_size=need("hidden_size"), num_layers=need("num_hidden_layers"), num_heads=heads,
            num_kv_heads=hf.get("num_key_value_heads") or heads, ffn_size=need("intermediate_size"),
            vocab_size=need("vocab_size"), position="rope", norm="rmsnorm", activation="swiglu",
            embedding_norm=False, bias=bool(hf.get("attention_bias", False)),
            tie_embeddings=hf.get("tie_word_embeddings", False), max_seq_len=hf.get("max_position_embeddings", 2048),
            sliding_window=hf.get("sliding_window", 4096) if model_type == "mistral" else None)
    raise ShapeError(f"{path}: model_type {model_type!r} is not one the pipeline loads (bloom, llama, mistral).")
