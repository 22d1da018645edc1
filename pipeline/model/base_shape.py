"""The base model decides the model's shape: `model.base`'s config, read torch-free for the command
line.

A base model is a Hugging Face folder (`config.json`) or a pipeline checkpoint
(`model_config.json`); either says everything about the body the training stages load (architecture,
sizes, positions, norms and where they are, biases, activation, tied head, vocabulary). The command line merges that shape over
the `model=` preset's (pipeline/config.py), so that `--cfg job` shows the shape that will be used
and the preset only shapes models trained from scratch; values given on the command line come after
it, and the config check refuses one that contradicts the base.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.errors import ConfigError
from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_config import CONFIG_FILE, CheckpointError, read_config

CHECKPOINT_CONFIG = "model_config.json"
# What the base decides; a preset's value gives way, a command-line value must agree.
BASE_DECIDES = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_size",
    "ffn_size",
    "vocab_size",
    "position",
    "rope_theta",
    "rope_scaling",
    "norm",
    "norm_eps",
    "activation",
    "embedding_norm",
    "bias",
    "qkv_bias",
    "qk_norm",
    "norm_placement",
    "norm_unit_offset",
    "embedding_scale",
    "attention_scale_size",
    "attention_softcap",
    "logit_softcap",
    "tie_embeddings",
    "sliding_window",
    "sliding_window_layers",
    "rope_local_theta",
    "hf_architecture",
)
# Taken from the base unless given: a context shorter than the base's is a choice (the training
# length), not a contradiction.
BASE_DEFAULTS = ("max_seq_len",)


def read_model_config(path: Path) -> ModelConfig:
    """A pipeline checkpoint's `model_config.json`."""
    return OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(ModelConfig), json.loads(path.read_text(encoding="utf-8"))
        )
    )


def base_config(path: str) -> ModelConfig:
    """The ModelConfig of the base model folder `path`; CheckpointError says what is wrong with it."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(
            f"{path} is not a folder. Give a local Hugging Face model folder (config.json, "
            f"*.safetensors, tokenizer.json) or a pipeline checkpoint (e.g. "
            f"work/<lang>/warmup/checkpoint)."
        )
    if (folder / CHECKPOINT_CONFIG).is_file():
        return read_model_config(folder / CHECKPOINT_CONFIG)
    if not (folder / CONFIG_FILE).is_file():
        raise CheckpointError(
            f"{path} holds neither {CONFIG_FILE} (a Hugging Face model) nor {CHECKPOINT_CONFIG} "
            f"(a pipeline checkpoint)."
        )
    return read_config(folder)[1]


def base_shape(path: str) -> dict:
    """The keys the base decides (or defaults), with its values, as the `model` section's plain
    data."""
    base = base_config(path)
    return {
        key: dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
        for key, value in ((key, getattr(base, key)) for key in (*BASE_DECIDES, *BASE_DEFAULTS))
    }


def check_base_shape(model: ModelConfig) -> None:
    """Refuse a configured shape that contradicts `model.base`'s, naming both values."""
    try:
        base = base_config(model.base)
    except CheckpointError as error:
        raise ConfigError("model.base", model.base, [f"a base model folder ({error})"]) from None
    for key in BASE_DECIDES:
        wanted, found = getattr(model, key), getattr(base, key)
        if wanted != found:
            raise ConfigError(
                f"model.{key}",
                wanted,
                [
                    f"{found!r}: the base model {model.base} has {key}={found!r}, and model.base "
                    "decides the model's "
                    f"shape. Leave model.{key}={wanted!r} out, or give a base model of that shape"
                ],
            )
