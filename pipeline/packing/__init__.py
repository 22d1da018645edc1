"""Packed training data: tokenized shards of the mix plan's sources, and the sampler that reads them.

`from pipeline.packing import PackedSampler` is what the training stages use (pipeline/packing/sampler.py).
"""

from pipeline.packing.sampler import Batch, PackedSampler, SamplerStateError
from pipeline.packing.shards import PackedDataError

__all__ = ["Batch", "PackedDataError", "PackedSampler", "SamplerStateError"]
