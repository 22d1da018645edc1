"""A training checkpoint's tensors, read back for any tensor, pipeline and data-parallel layout.

Each (pipeline stage p, tensor-parallel rank t) of the run that writes a checkpoint describes its
share in `layout-pp{p}-tp{t}.json` (`describe_stage`): every tensor of its model file with how it
is cut from the single model's tensor (the dimension, and the full size along it), and its
optimizer's parameter groups, each the single-model names of its parameters in the order of ZeRO-1's
flat buffer with their sizes and the padding after each. The data-parallel ranks'
`optim-pp{p}-tp{t}-dp{d}.safetensors` cut each flat group in order, d = 0, 1, ...

`SavedShards` finds any parameter by its single-model name in those files: its weight in the model
file of a stage that holds it, its fp32 master copy and Adam's moments in that stage's flat groups.
It reads only the saved tensor-parallel shards that overlap the part a rank asks for (its own shard
of the parameter, zeros past the full size), a parameter at a time: a rank of another layout never
holds the whole model, at most one parameter's saved shards at a time (in fp32 for the optimizer's
values).

A checkpoint written before the layout files resumes only with the tensor and pipeline layout it was
written in: the resuming rank's own share, as its engine describes it, is then the saved one.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from pipeline.errors import StageError
from pipeline.parallel.deepspeed_internals import ZeroPartition
from pipeline.parallel.tensor_parallel import Shard, parameter_shards
from pipeline.tensor_files import TensorFileReader

LAYOUT_FILE = "layout-pp{p}-tp{t}.json"
MODEL_FILE = "model-pp{p}-tp{t}.safetensors"
OPTIMIZER_FILE = "optim-pp{p}-tp{t}-dp{d}.safetensors"
# The fp32 master copy among the optimizer values (`SavedShards.optimizer_value`'s key).
MASTER = "master"


def parameter_names(layers: list[tuple[str, nn.Module]]) -> dict[int, str]:
    """Each parameter of the stage's layers (by id) -> its single-model name."""
    names = {}
    for prefix, layer in layers:
        for name, parameter in layer.named_parameters(remove_duplicate=False):
            names.setdefault(id(parameter), prefix + name)
    return names


def describe_stage(layers: list[tuple[str, nn.Module]], partitions: list[ZeroPartition]) -> dict:
    """What `layout-pp{p}-tp{t}.json` holds for this rank's share: its tensors and how they are cut,
    and its flat optimizer groups (a parameter that is not the model's, the idle anchor of a stage
    that trains nothing, has the empty name)."""
    tensors = {}
    for prefix, layer in layers:
        shards = parameter_shards(layer)
        for name, tensor in layer.state_dict().items():
            shard = shards.get(name)
            tensors[prefix + name] = {
                "shape": list(tensor.shape),
                "dim": None if shard is None else shard.dim,
                "full": None if shard is None else shard.full_size,
            }
    names = parameter_names(layers)
    groups = [
        [
            [names.get(id(param), ""), param.numel(), padding]
            for param, padding in zip(part.params, part.paddings)
        ]
        for part in partitions
    ]
    return {"tensors": tensors, "groups": groups}


class SavedShards:
    """Checkpoint `folder`'s tensors by single-model name. `layout` is the checkpoint's {"tp", "pp",
    "dp"}; `own` the resuming rank's (stage, tensor-parallel rank) and `own_description` its
    `describe_stage` where its tensor and pipeline layout is the checkpoint's (else None): it stands
    for the saved share of a checkpoint without layout files. `remedy` ends every error: what to do
    instead. Files are opened for each read only (a stage saved by many replicas has many)."""

    def __init__(
        self,
        folder: Path,
        layout: dict,
        own: tuple[int, int],
        own_description: Optional[dict],
        remedy: str,
    ) -> None:
        self.folder, self.remedy = folder, remedy
        self.tp, self.dp = layout["tp"], layout["dp"]
        self.stages = {
            (p, t): json.loads(path.read_text(encoding="utf-8"))
            for p in range(layout["pp"])
            for t in range(layout["tp"])
            if (path := folder / LAYOUT_FILE.format(p=p, t=t)).is_file()
        }
        if not self.stages:
            if own_description is None:
                raise StageError(self._layout_refusal(layout))
            self.stages = {own: own_description}
        # name -> the first (stage, tensor-parallel rank) described that holds it, for the model's
        # tensors and for the optimizer's (a tied embedding is on two stages, the same on both).
        self._tensor_holder: dict[str, tuple[int, int]] = {}
        self._flat: dict[str, tuple[tuple[int, int], int, int, int]] = {}
        for key, description in sorted(self.stages.items()):
            for name in description["tensors"]:
                self._tensor_holder.setdefault(name, key)
            for group, entries in enumerate(description["groups"]):
                offset = 0
                for name, numel, padding in entries:
                    if name:
                        self._flat.setdefault(name, (key, group, offset, numel))
                    offset += numel + padding
        # Headers only: a reader opens its file in `with`.
        self._readers: dict[str, TensorFileReader] = {}
        self.state_keys, self.step = self._optimizer_keys()

    def _layout_refusal(self, layout: dict) -> str:
        return (
            f"The checkpoint {self.folder} was written with parallel.tp={layout['tp']} and "
            f"parallel.pp={layout['pp']} by a version of the pipeline that did not record its "
            f"layout ({LAYOUT_FILE.format(p=0, t=0)}), so it resumes only with that tensor and "
            f"pipeline layout (the data-parallel degree may change). Resume with those. "
            f"{self.remedy}"
        )

    def _reader(self, name: str) -> TensorFileReader:
        if name not in self._readers:
            self._readers[name] = TensorFileReader(self.folder / name)
        return self._readers[name]

    def _optimizer_keys(self) -> tuple[list[str], Optional[float]]:
        """Adam's per-element state keys (exp_avg, exp_avg_sq) and its step count; none before the
        optimizer's first step."""
        p, t = min(self.stages)
        reader = self._reader(OPTIMIZER_FILE.format(p=p, t=t, d=0))
        keys, step = set(), None
        for name in reader.keys():
            if name.startswith("state."):
                key = name.split(".", 2)[2]
                if key == "step":
                    with reader:
                        step = reader.read(name).item()
                else:
                    keys.add(key)
        return sorted(keys), step

    def weight(self, name: str, shard: Optional[Shard], like: torch.Tensor) -> torch.Tensor:
        """Tensor `name` of the model, the part `shard` cuts from it (the whole without one), in
        `like`'s shape and dtype."""
        p, t = self._holder(name, self._tensor_holder)

        def read(source: int, dim: Optional[int], start: int, stop: int) -> torch.Tensor:
            with self._reader(MODEL_FILE.format(p=p, t=source)) as reader:
                if dim is None:
                    return reader.read(name)
                return reader.read_slice(name, dim, start, stop)

        return self._cut(
            self.stages[(p, t)]["tensors"][name], t, shard, like.shape, like.dtype, read
        )

    def optimizer_value(
        self, name: str, key: str, shard: Optional[Shard], like: torch.Tensor
    ) -> torch.Tensor:
        """The fp32 master copy (`MASTER`) or the optimizer state `key` of parameter `name`, the
        part `shard` cuts from it, in `like`'s shape, in fp32."""
        (p, t), group, offset, numel = self._holder(name, self._flat)
        entry = self.stages[(p, t)]["tensors"][name]

        def read(source: int, dim: Optional[int], start: int, stop: int) -> torch.Tensor:
            values = self._flat_range(p, source, group, key, offset, offset + numel)
            values = values.reshape(entry["shape"])
            return values if dim is None else values.narrow(dim, start, stop - start)

        return self._cut(entry, t, shard, like.shape, torch.float32, read)

    def _holder(self, name: str, index: dict):
        if name not in index:
            raise StageError(
                f"The checkpoint {self.folder} holds no trained {name}: it was written by another "
                f"model, or one that did not train it. {self.remedy}"
            )
        return index[name]

    def _cut(
        self,
        entry: dict,
        replica: int,
        shard: Optional[Shard],
        shape: torch.Size,
        dtype: torch.dtype,
        read: Callable[[int, Optional[int], int, int], torch.Tensor],
    ) -> torch.Tensor:
        """The part of a saved tensor that `shard` cuts, from the saved shards that overlap it.
        `read(t, dim, start, stop)` reads saved shard t along `dim` (all of it for None); a tensor
        saved whole is read from tensor-parallel rank `replica`."""
        out = torch.zeros(shape, dtype=dtype)
        saved_dim = entry["dim"]
        if shard is None and saved_dim is None:
            return out.copy_(read(replica, None, 0, 0))
        dim = shard.dim if shard is not None else saved_dim
        full = shard.full_size if shard is not None else entry["full"]
        start = shard.start if shard is not None else 0
        stop = min(start + shape[dim], full)
        if saved_dim is None:
            if stop > start:
                out.narrow(dim, 0, stop - start).copy_(read(replica, dim, start, stop))
            return out
        size = entry["shape"][dim]  # each saved shard's, padding included
        for source in range(self.tp):
            first, last = max(start, source * size), min(stop, (source + 1) * size)
            if first < last:
                out.narrow(dim, first - start, last - first).copy_(
                    read(source, dim, first - source * size, last - source * size)
                )
        return out

    def _flat_range(
        self, p: int, t: int, group: int, key: str, start: int, stop: int
    ) -> torch.Tensor:
        """Elements [start, stop) of flat group `group` of stage p, rank t, for the master copy or
        the state `key`, from the data-parallel ranks' files that cut it."""
        name = f"fp32.{group}" if key == MASTER else f"state.{group}.{key}"
        pieces, offset = [], 0
        for d in range(self.dp):
            reader = self._reader(OPTIMIZER_FILE.format(p=p, t=t, d=d))
            length = reader.shape(name)[0]
            first, last = max(start, offset), min(stop, offset + length)
            if first < last:
                with reader:
                    pieces.append(reader.read_slice(name, 0, first - offset, last - offset))
            offset += length
        found = sum(piece.numel() for piece in pieces)
        if found != stop - start:
            raise StageError(
                f"The checkpoint {self.folder}: the data-parallel parts of {name} of stage {p}, "
                f"tensor-parallel rank {t}, hold {offset:,} elements, fewer than its layout file "
                f"says. {self.remedy}"
            )
        return torch.cat(pieces)
