"""`from_hf`: a local Hugging Face BLOOM / Llama / Mistral / Qwen2 / Qwen3 / OLMo 2 / Phi-3 / Gemma 2 /
Gemma 3 folder -> the project's Transformer.

Reads `config.json` and the weights from `model.safetensors` or the shards named by
`model.safetensors.index.json`, with safetensors only: nothing is unpickled, nothing is downloaded,
no remote code runs. The model is built on the meta device and the checkpoint's tensors are put in
place as they are (same dtype unless `dtype` is given), so loading a 7B model needs its size in
memory once. `HFTensors` reads the same tensors one at a time (model_tensors.py).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch

from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_config import (
    BLOOM,
    CheckpointError,
    hf_tensor_name,
    read_config,
    read_json,
    tensor_names,
)
from pipeline.model.model_tensors import ModelTensors, build_model, model_shapes
from pipeline.model.transformer import VOCAB_TENSORS, Transformer
from pipeline.tensor_files import TensorFileReader

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors that some checkpoints carry but that are computed, not learned.
_COMPUTED = (".rotary_emb.inv_freq",)


def weight_files(folder: Path) -> dict[str, Path]:
    """Each tensor name of the checkpoint -> the safetensors file that holds it."""
    if (folder / INDEX_FILE).is_file():
        index = read_json(folder / INDEX_FILE)
        if not isinstance(index.get("weight_map"), dict):
            raise CheckpointError(
                f"{folder / INDEX_FILE} has no `weight_map`; restore it from the original "
                "checkpoint."
            )
        files = {name: folder / file for name, file in index["weight_map"].items()}
        missing = sorted({str(path) for path in files.values() if not path.is_file()})
        if missing:
            raise CheckpointError(
                f"{folder / INDEX_FILE} names shards that are missing: {', '.join(missing)}."
            )
        return files
    if (folder / SINGLE_FILE).is_file():
        return {name: folder / SINGLE_FILE for name in _open(folder / SINGLE_FILE).keys()}
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(
        p.name for p in folder.glob("*.pt*")
    )
    hint = (
        (
            f" It holds {', '.join(pickled)}: only safetensors are read (pickled weights can run "
            "code). Convert "
            f"them where you trust them, e.g. save_pretrained(..., safe_serialization=True)."
        )
        if pickled
        else ""
    )
    raise CheckpointError(f"{folder} has no {SINGLE_FILE} or {INDEX_FILE}.{hint}")


def _open(path: Path) -> TensorFileReader:
    try:
        return TensorFileReader(path)
    except OSError as error:
        raise CheckpointError(f"{error}; re-download or re-export the checkpoint.") from None


class HFTensors(ModelTensors):
    """The tensors of a local Hugging Face folder of a supported architecture
    (hf_config.SUPPORTED_ARCHITECTURES) under the project's names, a tensor at a time (a fused tensor,
    BLOOM's query_key_value or Phi-3's qkv_proj and gate_up_proj, read once for its parts),
    vocabulary rows padded, in `dtype` (default: as stored)."""

    def __init__(self, path, dtype: Optional[torch.dtype] = None) -> None:
        folder = Path(path)
        if not folder.is_dir():
            raise CheckpointError(
                f"{folder} is not a folder; from_hf wants a local Hugging Face model folder."
            )
        self.folder, self.dtype = folder, dtype
        self.architecture, self.cfg = read_config(folder)
        self._files = weight_files(folder)
        self._shapes = model_shapes(self.cfg)
        # Each fused tensor's parts (the project's names, in order).
        self._parts: dict[str, list[str]] = {}
        for name in self._shapes:
            hf_name, part = hf_tensor_name(self.architecture, name)
            if part is not None:
                self._parts.setdefault(hf_name, []).append(name)
        prefix = tensor_names(self.architecture).prefix
        # The original BLOOM checkpoints store the body without its "transformer." prefix.
        self._strip_prefix = not any(name.startswith(prefix) for name in self._files)
        used = {
            self._stored_name(hf_tensor_name(self.architecture, name)[0]) for name in self._shapes
        }
        unexpected = sorted(
            name
            for name in set(self._files) - used
            if not name.endswith(_COMPUTED)
            and not (self.cfg.tie_embeddings and name == "lm_head.weight")
        )
        if unexpected:
            raise CheckpointError(
                f"{folder}: the checkpoint holds tensors that a {self.architecture} with this "
                f"config.json does not have: {', '.join(unexpected[:5])}"
                f"{' ...' if len(unexpected) > 5 else ''}."
            )
        self._stack: Optional[contextlib.ExitStack] = None
        self._handles: dict = {}
        self._fused: dict = {}  # the last fused tensor read, split

    def _stored_name(self, hf_name: str) -> str:
        prefix = tensor_names(self.architecture).prefix
        return hf_name.removeprefix(prefix) if self._strip_prefix else hf_name

    def __enter__(self) -> "HFTensors":
        self._stack = contextlib.ExitStack()
        return self

    def __exit__(self, *error) -> None:
        self._stack.close()
        self._handles, self._fused = {}, {}

    def _read_stored(self, hf_name: str) -> torch.Tensor:
        name = self._stored_name(hf_name)
        if name not in self._files:
            raise CheckpointError(
                f"{self.folder}: tensor `{name}` is missing from the checkpoint; a "
                f"{self.architecture} with this config.json needs it."
            )
        file = self._files[name]
        if file not in self._handles:
            self._handles[file] = self._stack.enter_context(_open(file))
        try:
            return self._handles[file].read(name)
        except OSError as error:
            raise CheckpointError(
                f"{file}: tensor `{name}` cannot be read ({error}); re-download or re-export the "
                f"checkpoint."
            ) from None

    def read(self, name: str) -> torch.Tensor:
        hf_name, part = hf_tensor_name(self.architecture, name)
        if part is None:
            tensor = self._read_stored(hf_name)
        else:
            if hf_name not in self._fused:
                sizes = [self._shapes[name][0] for name in self._parts[hf_name]]
                self._fused = {
                    hf_name: split_fused(
                        self.architecture, self._read_stored(hf_name), sizes, self.cfg.num_heads
                    )
                }
            tensor = self._fused[hf_name][part]
        shape = self._shapes[name]
        stored_shape = (self.cfg.vocab_size, *shape[1:]) if name in VOCAB_TENSORS else shape
        if tuple(tensor.shape) != stored_shape:
            raise CheckpointError(
                f"{self.folder}: tensor `{self._stored_name(hf_name)}` has shape "
                f"{tuple(tensor.shape)}, but config.json implies {tuple(stored_shape)}."
            )
        if name in VOCAB_TENSORS:
            tensor = _pad_rows(tensor, shape[0])
        return tensor if self.dtype is None else tensor.to(self.dtype)


def from_hf(path, dtype: Optional[torch.dtype] = None) -> tuple[Transformer, ModelConfig]:
    """Load a local Hugging Face folder of a supported architecture (hf_config.SUPPORTED_ARCHITECTURES:
    BloomForCausalLM, LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,
    Olmo2ForCausalLM, Phi3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM); returns (model,
    config)."""
    tensors = HFTensors(path, dtype)
    return build_model(tensors), tensors.cfg


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])


def split_fused(
    architecture: str, fused: torch.Tensor, sizes: list[int], num_heads: int
) -> list[torch.Tensor]:
    """A fused tensor -> its parts, of `sizes` rows: BLOOM's query_key_value interleaved per head,
    Phi-3's qkv_proj and gate_up_proj stacked."""
    if architecture == BLOOM:
        return split_bloom_fused(fused, num_heads)
    return list(fused.split(sizes))


def fuse(architecture: str, parts: list[torch.Tensor], num_heads: int) -> torch.Tensor:
    """The project's tensors -> the fused one they are parts of: split_fused undone (export)."""
    if architecture == BLOOM:
        return fuse_bloom(*parts, num_heads)
    return torch.cat(parts)


def split_bloom_fused(fused: torch.Tensor, num_heads: int) -> list[torch.Tensor]:
    """BLOOM's (3 * hidden, ...) query_key_value -> [q, k, v], each (hidden, ...)."""
    per_head = fused.reshape(num_heads, 3, -1, *fused.shape[1:])
    return [per_head[:, part].reshape(-1, *fused.shape[1:]) for part in range(3)]


def fuse_bloom(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[q, k, v] -> BLOOM's query_key_value: split_bloom_fused undone (export)."""
    return torch.stack([t.reshape(num_heads, -1, *t.shape[1:]) for t in (q, k, v)], dim=1).reshape(
        -1, *q.shape[1:]
    )
