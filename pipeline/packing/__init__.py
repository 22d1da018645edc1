"""Packed training data: tokenized shards of the mix plan's sources, and the sampler that reads them.

`from pipeline.packing import PackedSampler` is what the training stages use (pipeline/packing/sampler.py). The
sampler loads numpy on first use, so that the command line checks the `pack` section (config.py) in a moment.
"""

from __future__ import annotations

import importlib

_LAZY = {
    "Batch": "pipeline.packing.sampler",
    "PackedSampler": "pipeline.packing.sampler",
    "SamplerStateError": "pipeline.packing.sampler",
    "PackedDataError": "pipeline.packing.shards",
}

__all__ = list(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'pipeline.packing' has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
