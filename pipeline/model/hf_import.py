"""`from_hf`: a local Hugging Face BLOOM / Llama / Mistral folder -> the project's Transformer.

Reads `config.json` and the weights from `model.safetensors` or the shards named by
`model.safetensors.index.json`, with safetensors only: nothing is unpickled, nothing is downloaded,
no remote code runs. The model is built on the meta device and the checkpoint's tensors are put in
place as they are (same dtype unless `dtype` is given), so loading a 7B model needs its size in memory once.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Optional

import torch
from safetensors import safe_open

from pipeline.model.config import ModelConfig
from pipeline.model.hf_architectures import hf_tensor_name, split_bloom_fused, tensor_names
from pipeline.model.hf_config import CheckpointError, read_config, read_json
from pipeline.model.transformer import Transformer

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# Tensors that some checkpoints carry but that are computed, not learned.
_COMPUTED = (".rotary_emb.inv_freq",)
# The project's tensors with one row per vocabulary entry, padded to `pad_vocab_multiple` rows.
VOCAB_TENSORS = ("embedding.tokens.weight", "head.weight")


def weight_files(folder: Path) -> dict[str, Path]:
    """Each tensor name of the checkpoint -> the safetensors file that holds it."""
    if (folder / INDEX_FILE).is_file():
        index = read_json(folder / INDEX_FILE)
        if not isinstance(index.get("weight_map"), dict):
            raise CheckpointError(f"{folder / INDEX_FILE} has no `weight_map`; restore it from the original "
                                  "checkpoint.")
        files = {name: folder / file for name, file in index["weight_map"].items()}
        missing = sorted({str(path) for path in files.values() if not path.is_file()})
        if missing:
            raise CheckpointError(f"{folder / INDEX_FILE} names shards that are missing: {', '.join(missing)}.")
        return files
    if (folder / SINGLE_FILE).is_file():
        with _open(folder / SINGLE_FILE) as handle:
            return {name: folder / SINGLE_FILE for name in handle.keys()}
    pickled = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
    hint = (f" It holds {', '.join(pickled)}: only safetensors are read (pickled weights can run code). Convert "
            f"them where you trust them, e.g. save_pretrained(..., safe_serialization=True).") if pickled else ""
    raise CheckpointError(f"{folder} has no {SINGLE_FILE} or {INDEX_FILE}.{hint}")


@contextlib.contextmanager
def _open(path: Path):
    try:
        handle = safe_open(str(path), framework="pt")
    except Exception as error:  # safetensors raises its own SafetensorError, or OSError
        raise CheckpointError(f"{path} is not a readable safetensors file ({error}); re-download or re-export "
                              f"the checkpoint.") from None
    with handle:
        yield handle


def from_hf(path, dtype: Optional[torch.dtype] = None) -> tuple[Transformer, ModelConfig]:
    """Load a local BloomForCausalLM, LlamaForCausalLM or MistralForCausalLM folder; returns (model, config)."""
    folder = Path(path)
    if not folder.is_dir():
        raise CheckpointError(f"{folder} is not a folder; from_hf wants a local Hugging Face model folder.")
    architecture, cfg = read_config(folder)
    files = weight_files(folder)
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = {name: p.shape for name, p in model.state_dict().items()
                if not (cfg.tie_embeddings and name == "head.weight")}
    prefix = tensor_names(architecture).prefix
    # The original BLOOM checkpoints store the body without its "transformer." prefix.
    strip_prefix = not any(name.startswith(prefix) for name in files)

    def stored_name(hf_name: str) -> str:
        return hf_name.removeprefix(prefix) if strip_prefix else hf_name

    state, used = {}, set()
    with contextlib.ExitStack() as stack:
        handles = {}

        def read(hf_name: str) -> torch.Tensor:
            name = stored_name(hf_name)
            if name not in files:
                raise CheckpointError(f"{folder}: tensor `{name}` is missing from the checkpoint; a {architecture} "
                                      f"with this config.json needs it.")
            file = files[name]
            if file not in handles:
                handles[file] = stack.enter_context(_open(file))
            used.add(name)
            try:
                return handles[file].get_tensor(name)
            except Exception as error:
                raise CheckpointError(f"{file}: tensor `{name}` cannot be read ({error}); re-download or "
                                      f"re-export the checkpoint.") from None

        fused = {}  # BLOOM's query_key_value of the current block, split once for its q, k and v
        for name, shape in expected.items():
            hf_name, part = hf_tensor_name(architecture, name)
            if part is None:
                tensor = read(hf_name)
            else:
                if hf_name not in fused:
                    fused = {hf_name: split_bloom_fused(read(hf_name), cfg.num_heads)}
                tensor = fused[hf_name][part]
            stored_shape = (cfg.vocab_size, *shape[1:]) if name in VOCAB_TENSORS else shape
            if tensor.shape != stored_shape:
                raise CheckpointError(f"{folder}: tensor `{stored_name(hf_name)}` has shape {tuple(tensor.shape)}, "
                                      f"but config.json implies {tuple(stored_shape)}.")
            if name in VOCAB_TENSORS:
                tensor = _pad_rows(tensor, shape[0])
            state[name] = tensor if dtype is None else tensor.to(dtype)

    unexpected = sorted(name for name in set(files) - used if not name.endswith(_COMPUTED)
                        and not (cfg.tie_embeddings and name == "lm_head.weight"))
    if unexpected:
        raise CheckpointError(f"{folder}: the checkpoint holds tensors that a {architecture} with this config.json "
                              f"does not have: {', '.join(unexpected[:5])}{' ...' if len(unexpected) > 5 else ''}.")
    if cfg.tie_embeddings:
        state["head.weight"] = state["embedding.tokens.weight"]
    model.load_state_dict(state, strict=True, assign=True)
    model.tie_weights()
    return model, cfg


def _pad_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    if tensor.shape[0] == rows:
        return tensor
    return torch.cat([tensor, tensor.new_zeros(rows - tensor.shape[0], *tensor.shape[1:])])
