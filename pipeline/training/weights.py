"""A pipeline stage's weights in and out of one safetensors file with the single model's names.

Every stage reads only its own tensors from the shared file; after training, the first data-parallel
replica of each stage writes its part and rank 0 joins the parts into one file, copying their bytes.
The result loads into `pipeline.model.transformer.Transformer` as it is.

Under tensor parallelism a rank reads only its shard of each stored tensor, and saving gathers the
full tensors over the tensor-parallel group one at a time; its rank 0 writes the stage's part as
they come.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch
from torch import nn

from pipeline.model.hf_config import CheckpointError
from pipeline.parallel.tensor_parallel import parameter_shards, tensor_parallel_rank
from pipeline.tensor_files import TensorFileReader, TensorFileWriter, dtype_name, join_tensor_files


def load_layers(layers: list[tuple[str, nn.Module]], path: Path) -> None:
    """Fill the layers' tensors from `path` (single-model names); a tensor-parallel shard reads only
    its rows or columns of the stored tensor, so that no rank reads a whole layer it does not hold."""
    try:
        stored = TensorFileReader(path)
    except OSError as error:
        raise CheckpointError(
            f"{error}; the stage's launching process writes it: run the stage again."
        ) from None
    names = set(stored.keys())
    with stored, torch.no_grad():
        for prefix, layer in layers:
            shards = parameter_shards(layer)
            for name, tensor in layer.state_dict().items():
                key = prefix + name
                if key not in names:
                    raise CheckpointError(
                        f"{path} has no tensor {key}; it does not belong to this model config."
                    )
                shard = shards.get(name)
                wanted = (
                    shard.full_shape(tensor.shape) if shard is not None else tuple(tensor.shape)
                )
                if stored.shape(key) != wanted:
                    raise CheckpointError(
                        f"{path}: {key} has shape {stored.shape(key)}, the model wants {wanted}."
                    )
                if shard is None:
                    tensor.copy_(stored.read(key))
                else:
                    _load_shard(tensor, stored, key, shard)


def _load_shard(tensor: torch.Tensor, stored: TensorFileReader, key: str, shard) -> None:
    """This rank's part of the stored tensor `key` along the shard's dimension; rows past the full
    size (the padding that makes the parts equal) are zeros."""
    stop = min(shard.start + shard.size, shard.full_size)
    held = max(0, stop - shard.start)
    if held:
        tensor.narrow(shard.dim, 0, held).copy_(
            stored.read_slice(key, shard.dim, shard.start, stop)
        )
    tensor.narrow(shard.dim, held, shard.size - held).zero_()


def save_part(layers: list[tuple[str, nn.Module]], path: Path) -> None:
    """Write the stage's part a tensor at a time; under tensor parallelism every rank of the group
    calls it (each tensor is gathered over the group in turn, so no rank holds more than its share
    and one full tensor), and the group's rank 0 writes."""
    modules = [layer for _, layer in layers]
    writes = tensor_parallel_rank(modules) in (None, 0)
    tensors, layout = [], {}
    for prefix, layer in layers:
        shards = parameter_shards(layer)
        for name, tensor in layer.state_dict().items():
            shard = shards.get(name)
            tensors.append((prefix + name, tensor, shard))
            layout[prefix + name] = (
                dtype_name(tensor.dtype),
                shard.full_shape(tensor.shape) if shard is not None else tuple(tensor.shape),
            )
    with contextlib.ExitStack() as stack:
        out = stack.enter_context(TensorFileWriter(path, layout)) if writes else None
        for name, tensor, shard in tensors:
            full = (
                shard.gather(tensor) if shard is not None else tensor
            )  # a collective over the group
            if out is not None:
                out.write(name, full.detach().cpu())


def join_parts(parts: list[Path], path: Path) -> None:
    """One file from the stages' parts (a tied embedding is in two parts, identical: kept once),
    copied a tensor at a time: the rank that joins them never holds the model."""
    join_tensor_files(parts, path)
