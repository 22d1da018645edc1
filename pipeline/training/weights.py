"""A pipeline stage's weights in and out of one safetensors file with the single model's names.

Every stage reads only its own tensors from the shared file; after training, the first data-parallel
replica of each stage writes its part and rank 0 joins the parts into one file, copying their bytes. The result
loads into `pipeline.model.Transformer` as it is.

Under tensor parallelism a rank reads only its shard of each stored tensor, and saving gathers the full tensors
over the tensor-parallel group; its rank 0 writes the stage's part.
"""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from torch import nn

from pipeline.model.hf_config import CheckpointError
from pipeline.parallel.tensor_parallel import full_state_dict, parameter_shards, tensor_parallel_rank
from pipeline.tensor_files import join_tensor_files, save_tensors


def load_layers(layers: list[tuple[str, nn.Module]], path: Path) -> None:
    """Fill the layers' tensors from `path` (single-model names); a tensor-parallel shard reads only its rows or
    columns of the stored tensor (safetensors' get_slice), so that no rank reads a whole layer it does not hold."""
    with safe_open(str(path), framework="pt") as handle:
        names = set(handle.keys())
        for prefix, layer in layers:
            shards = parameter_shards(layer)
            for name, tensor in layer.state_dict().items():
                key = prefix + name
                if key not in names:
                    raise CheckpointError(f"{path} has no tensor {key}; it does not belong to this model config.")
                stored = handle.get_slice(key)
                shard = shards.get(name)
                wanted = shard.full_shape(tensor.shape) if shard is not None else tuple(tensor.shape)
                if tuple(stored.get_shape()) != wanted:
                    raise CheckpointError(f"{path}: {key} has shape {tuple(stored.get_shape())}, the model wants "
                                          f"{wanted}.")
                with torch.no_grad():
                    if shard is None:
                        tensor.copy_(stored[:])
                    else:
                        _load_shard(tensor, stored, shard)


def _load_shard(tensor: torch.Tensor, stored, shard) -> None:
    """This rank's part of the stored tensor along the shard's dimension; rows past the full size (the padding
    that makes the parts equal) are zeros."""
    stop = min(shard.start + shard.size, shard.full_size)
    held = max(0, stop - shard.start)
    if held:
        index = tuple(slice(shard.start, stop) if axis == shard.dim else slice(None) for axis in range(tensor.dim()))
        tensor.narrow(shard.dim, 0, held).copy_(stored[index])
    tensor.narrow(shard.dim, held, shard.size - held).zero_()


def layers_state(layers: list[tuple[str, nn.Module]]) -> dict[str, torch.Tensor]:
    """The layers' full tensors (gathered over the tensor-parallel group: a collective there)."""
    return {prefix + name: tensor.detach().cpu().contiguous()
            for prefix, layer in layers for name, tensor in full_state_dict(layer).items()}


def save_part(layers: list[tuple[str, nn.Module]], path: Path) -> None:
    """Write the stage's part; under tensor parallelism every rank of the group calls it, rank 0 writes."""
    state = layers_state(layers)
    if tensor_parallel_rank([layer for _, layer in layers]) in (None, 0):
        save_tensors(state, path)


def join_parts(parts: list[Path], path: Path) -> None:
    """One file from the stages' parts (a tied embedding is in two parts, identical: kept once), copied a tensor at a
    time: the rank that joins them never holds the model."""
    join_tensor_files(parts, path)
