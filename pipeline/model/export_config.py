"""The typed `export` section: how the training stages write their transformers folder `hf/` (torch-free)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.errors import ConfigError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12, "KIB": 2**10, "MIB": 2**20,
          "GIB": 2**30, "TIB": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


@dataclass
class ExportConfig:
    # The largest weights file of `hf/` ("5GB", "500MB", "2GiB" or bytes), as transformers' save_pretrained takes
    # it: above it the weights go into model-00001-of-0000N.safetensors shards with model.safetensors.index.json.
    # Not part of the stages' hash: it changes the files, not the model.
    max_shard_size: str = "5GB"


def shard_bytes(export: ExportConfig) -> int:
    match = _SIZE.fullmatch(str(export.max_shard_size))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _UNITS or float(match.group(1)) * _UNITS[unit] < 1:
        raise ConfigError("export.max_shard_size", export.max_shard_size, ["a size such as 5GB, 500MB or 2GiB"])
    return int(float(match.group(1)) * _UNITS[unit])


def validate_export(export: ExportConfig) -> None:
    shard_bytes(export)
