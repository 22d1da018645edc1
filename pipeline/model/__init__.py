"""The transformer (BLOOM- and Llama/Mistral-style) and its Hugging Face import and export.

`ModelConfig` comes without torch, so that the command line checks configs quickly; the rest loads
torch on first use:

    from pipeline.model import from_hf, to_hf, Transformer, flops_per_token
"""

from __future__ import annotations

import importlib

from pipeline.model.config import ModelConfig, RopeScaling, validate_model

_LAZY = {
    "Transformer": "pipeline.model.transformer",
    "from_hf": "pipeline.model.hf_import",
    "to_hf": "pipeline.model.hf_export",
    "CheckpointError": "pipeline.model.hf_config",
    "SUPPORTED_ARCHITECTURES": "pipeline.model.hf_config",
    "alibi_slopes": "pipeline.model.transformer",
    "flops_per_token": "pipeline.model.config",
    "parameter_count": "pipeline.model.config",
}

__all__ = ["ModelConfig", "RopeScaling", "validate_model", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pipeline.model' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
