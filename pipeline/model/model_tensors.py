"""A model's tensors one at a time: read from a file, drawn at random, or taken from a module, and
written to a pipeline checkpoint without ever holding the whole model.

The training stages' launching process starts a model of any size this way: it converts the base
model (a Hugging Face folder or a pipeline checkpoint) or draws a random one tensor by tensor into
the checkpoint that the ranks read their shares from, so that it holds one tensor at a time, not the
model (docs/model.md, "What a rank holds").

Every source gives the project's tensor names (`Transformer.state_dict()`, the tied head left out)
with the padded vocabulary rows, under `cfg`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
import hashlib
import json
from pathlib import Path
from typing import Optional

import torch

from pipeline.model.base_shape import CHECKPOINT_CONFIG, read_model_config
from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_config import CheckpointError
from pipeline.model.transformer import Transformer, initialise
from pipeline.tensor_files import TensorFileReader, TensorFileWriter, dtype_name

CHECKPOINT_WEIGHTS = "model.safetensors"


def model_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The checkpoint's tensor names and shapes in the model's order (a tied head is the embedding:
    left out)."""
    with torch.device("meta"):
        model = Transformer(cfg)
    return {
        name: tuple(tensor.shape)
        for name, tensor in model.state_dict().items()
        if not (cfg.tie_embeddings and name == "head.weight")
    }


class ModelTensors:
    """A model's tensors by name; a context manager that holds the files it reads open."""

    cfg: ModelConfig

    def read(self, name: str) -> torch.Tensor:
        raise NotImplementedError

    def __enter__(self) -> "ModelTensors":
        return self

    def __exit__(self, *error) -> None:
        return None


class ModuleTensors(ModelTensors):
    """The tensors of a model in memory."""

    def __init__(self, model: Transformer) -> None:
        self.cfg = model.cfg
        self._state = model.state_dict()

    def read(self, name: str) -> torch.Tensor:
        return self._state[name].detach()


class ScratchTensors(ModelTensors):
    """A random model (`Transformer.reset_parameters`' distributions), each tensor drawn from its
    own generator seeded by `seed` and its name: the same values whichever tensors are drawn, in
    whatever order."""

    def __init__(self, cfg: ModelConfig, seed: int) -> None:
        self.cfg = cfg
        self._seed = seed
        self._shapes = model_shapes(cfg)

    def read(self, name: str) -> torch.Tensor:
        digest = hashlib.sha256(f"{self._seed}:{name}".encode("utf-8")).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "little") >> 1)
        tensor = torch.empty(self._shapes[name])
        initialise(self.cfg, name, tensor, generator)
        return tensor


class CheckpointTensors(ModelTensors):
    """A pipeline checkpoint folder (`model_config.json`, `model.safetensors`), read a tensor at a
    time, in `dtype` (default: as stored)."""

    def __init__(self, folder: Path, dtype: Optional[torch.dtype] = None) -> None:
        self.folder, self.dtype = Path(folder), dtype
        self.cfg = read_model_config(self.folder / CHECKPOINT_CONFIG)
        self._handle = None

    def __enter__(self) -> "CheckpointTensors":
        path = self.folder / CHECKPOINT_WEIGHTS
        try:
            self._handle = TensorFileReader(path).__enter__()
        except OSError as error:
            raise CheckpointError(f"{error}; write the checkpoint again.") from None
        missing = sorted(set(model_shapes(self.cfg)) - set(self._handle.keys()))
        if missing:
            raise CheckpointError(
                f"{path} does not match {self.folder / CHECKPOINT_CONFIG}: it lacks "
                f"{', '.join(missing[:5])}. Write the checkpoint again."
            )
        return self

    def __exit__(self, *error) -> None:
        self._handle.__exit__(*error)

    def read(self, name: str) -> torch.Tensor:
        tensor = self._handle.read(name)
        return tensor if self.dtype is None else tensor.to(self.dtype)


class ReplacedTensors(ModelTensors):
    """Another model's tensors with some replaced, under its own config (the warm start: the base's
    body, new vocabulary matrices)."""

    def __init__(
        self, base: ModelTensors, cfg: ModelConfig, replaced: dict[str, torch.Tensor]
    ) -> None:
        self.base, self.cfg, self.replaced = base, cfg, replaced

    def __enter__(self) -> "ReplacedTensors":
        self.base.__enter__()
        return self

    def __exit__(self, *error) -> None:
        self.base.__exit__(*error)

    def read(self, name: str) -> torch.Tensor:
        return self.replaced[name] if name in self.replaced else self.base.read(name)


@dataclass
class StartingModel:
    """The model a training stage's ranks start from, read a tensor at a time, and what to tell the
    user if it holds non-finite values."""

    tensors: ModelTensors
    what: str  # "warmup: the base model ...", naming it in the message
    advice: str


def opened_checkpoint(folder: Path) -> CheckpointTensors:
    """A checkpoint's tensors, its file opened once to check it (a damaged one fails here, naming
    it)."""
    tensors = CheckpointTensors(folder)
    with tensors:
        return tensors


def build_model(tensors: ModelTensors) -> Transformer:
    """The whole model in memory (for scoring, the warm start's tests, the demo)."""
    cfg = tensors.cfg
    with torch.device("meta"):
        model = Transformer(cfg)
    with tensors:
        state = {name: tensors.read(name) for name in model_shapes(cfg)}
    if cfg.tie_embeddings:
        state["head.weight"] = state["embedding.tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    return model


def write_checkpoint(tensors: ModelTensors, folder: Path) -> list[str]:
    """`tensors` as a float32 pipeline checkpoint in `folder`, a tensor at a time. Returns the names
    of the tensors that hold a NaN or an infinity (written all the same: the caller decides)."""
    cfg = tensors.cfg
    shapes = model_shapes(cfg)
    folder.mkdir(parents=True, exist_ok=True)
    non_finite = []
    with (
        tensors,
        TensorFileWriter(
            folder / CHECKPOINT_WEIGHTS,
            {name: (dtype_name(torch.float32), shape) for name, shape in shapes.items()},
        ) as out,
    ):
        for name in shapes:
            tensor = tensors.read(name).to(torch.float32)
            if not bool(torch.isfinite(tensor).all()):
                non_finite.append(name)
            out.write(name, tensor)
    (folder / CHECKPOINT_CONFIG).write_text(
        json.dumps(dataclasses.asdict(cfg), indent=2) + "\n", encoding="utf-8"
    )
    return non_finite
