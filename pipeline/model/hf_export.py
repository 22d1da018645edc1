"""`to_hf`: the project's Transformer -> a folder that
`transformers.AutoModelForCausalLM.from_pretrained` loads.

Writes the weights as safetensors a tensor at a time (one `model.safetensors`, or shards of at most
`max_shard_bytes` with `model.safetensors.index.json`: `export.max_shard_size`), `config.json` in
the keys that transformers 4.x and 5.x both read, `generation_config.json`, and the tokenizer files
when a tokenizer is given. The vocabulary padding is cut off: the folder declares the tokenizer's
vocabulary, as the original checkpoint did.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Optional, Union

import torch
from tokenizers import Tokenizer

from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_config import (
    CONFIG_FILE,
    CheckpointError,
    architecture_for,
    config_to_hf,
    hf_tensor_name,
)
from pipeline.model.hf_import import INDEX_FILE, SINGLE_FILE, fuse
from pipeline.model.model_tensors import ModelTensors, ModuleTensors, model_shapes
from pipeline.model.transformer import VOCAB_TENSORS, Transformer
from pipeline.tensor_files import TensorFileWriter, dtype_name
from pipeline.tokenization.tokenizer_config import SpecialTokens
from pipeline.tokenization.folder import (
    TOKENIZER_FILE,
    TrainedTokenizer,
    special_token_strings,
    write_tokenizer_folder,
)

# The files of a tokenizer folder that travel with the model (transformers' fast and SentencePiece
# tokenizers).
TOKENIZER_FILES = (
    TOKENIZER_FILE,
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
)


def to_hf(
    model: Union[Transformer, ModelTensors],
    path,
    tokenizer: Union[None, Tokenizer, str, Path] = None,
    max_shard_bytes: int = 5 * 2**30,
) -> Path:
    """Write `model` (in memory, or its tensors one at a time: model_tensors.py) to the new folder
    `path` as its Hugging Face architecture (`hf_config.architecture_for`: the base's own, or the
    one its shape calls for), holding one tensor (a fused one: its parts) at a time; weights with a
    NaN or an infinity raise NonFiniteWeights, and no weights stay behind.

    `tokenizer` is a folder holding tokenizer.json (the tokenizer stage's output, or the base
    model's folder: its files are copied), a tokenizer.json file, or a `tokenizers.Tokenizer`. The
    special tokens' ids (bos, eos, pad) go into config.json and generation_config.json; they come
    from the folder's tokenizer_config.json / special_tokens_map.json, and for a bare tokenizer.json
    or Tokenizer from the project's special tokens (<s>, </s>, <pad>, <unk>) when it holds them.
    """
    tensors = ModuleTensors(model) if isinstance(model, Transformer) else model
    cfg = tensors.cfg
    architecture = architecture_for(cfg)
    folder = Path(path)
    if (folder / CONFIG_FILE).exists() or any(folder.glob("*.safetensors")):
        raise CheckpointError(
            f"{folder} already holds a model; to_hf writes into a new or empty folder."
        )
    folder.mkdir(parents=True, exist_ok=True)
    special_ids = (
        _write_tokenizer(tokenizer, folder, cfg.vocab_size) if tokenizer is not None else {}
    )
    with tensors:
        dtype = tensors.read("final_norm.weight").dtype  # a model's tensors share one dtype
        _write_weights(tensors, folder, max_shard_bytes, dtype)
    _write_json(
        folder / CONFIG_FILE,
        config_to_hf(cfg, architecture, str(dtype).removeprefix("torch."), special_ids),
    )
    generation = {
        f"{role}_token_id": special_ids[role]
        for role in ("bos", "eos", "pad")
        if special_ids.get(role) is not None
    }
    _write_json(folder / "generation_config.json", generation)
    return folder


class NonFiniteWeights(CheckpointError):
    """to_hf was given weights with a NaN or an infinity; `names` are the project's tensors that
    hold them."""

    def __init__(self, names: list[str]) -> None:
        super().__init__(
            f"non-finite values in {', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
        )
        self.names = names


def hf_layout(cfg: ModelConfig) -> dict[str, tuple[list[str], tuple[int, ...]]]:
    """Hugging Face's tensor names, sorted, each with the project's tensors it is made of (a fused
    one, such as BLOOM's query_key_value: q, k, v) and its shape (vocabulary unpadded)."""
    architecture = architecture_for(cfg)
    layout: dict[str, tuple[list[str], tuple[int, ...]]] = {}
    for name, shape in model_shapes(cfg).items():
        hf_name, part = hf_tensor_name(architecture, name)
        if name in VOCAB_TENSORS:
            shape = (cfg.vocab_size, *shape[1:])
        if part is None:
            layout[hf_name] = ([name], shape)
        else:
            parts, fused = layout.get(hf_name, ([], (0, *shape[1:])))
            layout[hf_name] = (parts + [name], (fused[0] + shape[0], *shape[1:]))
    return dict(sorted(layout.items()))


def hf_tensor(tensors: ModelTensors, parts: list[str]) -> torch.Tensor:
    """One of Hugging Face's tensors (hf_layout) from the project's."""
    cfg = tensors.cfg
    if len(parts) > 1:  # a fused tensor
        return fuse(architecture_for(cfg), [tensors.read(name) for name in parts], cfg.num_heads)
    tensor = tensors.read(parts[0])
    return tensor[: cfg.vocab_size] if parts[0] in VOCAB_TENSORS else tensor


def _write_weights(
    tensors: ModelTensors, folder: Path, max_shard_bytes: int, dtype: torch.dtype
) -> None:
    layout = hf_layout(tensors.cfg)
    itemsize = torch.empty(0, dtype=dtype).element_size()
    shards, size = [{}], 0
    for hf_name, (_, shape) in layout.items():
        nbytes = math.prod(shape) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][hf_name] = (dtype_name(dtype), shape)
        size += nbytes
    files = (
        [SINGLE_FILE]
        if len(shards) == 1
        else [
            f"model-{number:05d}-of-{len(shards):05d}.safetensors"
            for number in range(1, len(shards) + 1)
        ]
    )
    non_finite = []
    try:
        for file, shard in zip(files, shards):
            # transformers checks that the file says it holds PyTorch tensors
            with TensorFileWriter(folder / file, shard, metadata={"format": "pt"}) as out:
                for hf_name in shard:
                    parts = layout[hf_name][0]
                    tensor = hf_tensor(tensors, parts).to(dtype)
                    if not bool(torch.isfinite(tensor).all()):
                        non_finite += parts
                    out.write(hf_name, tensor)
        if non_finite:
            raise NonFiniteWeights(non_finite)
    except BaseException:
        for file in files:
            (folder / file).unlink(missing_ok=True)
        raise
    if len(shards) > 1:
        weight_map = {hf_name: file for file, shard in zip(files, shards) for hf_name in shard}
        total = sum(math.prod(shape) * itemsize for _, shape in layout.values())
        _write_json(
            folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map}
        )


def _write_tokenizer(tokenizer, folder: Path, vocab_size: int) -> dict[str, Optional[int]]:
    """Put the tokenizer files into `folder`; returns the ids of its bos, eos and pad tokens."""
    source = Path(tokenizer) if isinstance(tokenizer, (str, Path)) else None
    if source is not None and source.is_dir():
        if not (source / TOKENIZER_FILE).is_file():
            raise CheckpointError(f"to_hf: tokenizer folder {source} has no {TOKENIZER_FILE}.")
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copyfile(source / name, folder / name)
    else:
        if source is not None:
            if not source.is_file():
                raise CheckpointError(
                    f"to_hf: tokenizer {source} is neither a folder nor a {TOKENIZER_FILE} file."
                )
            tokenizer = Tokenizer.from_file(str(source))
        _write_bare_tokenizer(tokenizer, folder)
    loaded = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    if loaded.get_vocab_size() > vocab_size:
        raise CheckpointError(
            f"to_hf: the tokenizer has {loaded.get_vocab_size()} tokens but the model only "
            f"{vocab_size} (model.vocab_size); its ids beyond that have no embedding."
        )
    named = special_token_strings(folder, ("bos", "eos", "pad"))
    return {role: loaded.token_to_id(token) for role, token in named.items()}


def _write_bare_tokenizer(tokenizer: Tokenizer, folder: Path) -> None:
    specials = SpecialTokens()
    if all(tokenizer.token_to_id(token) is not None for token in specials.in_id_order()):
        write_tokenizer_folder(folder, TrainedTokenizer(tokenizer), specials)
        return
    # Which of its tokens are bos/eos/pad is unknown: transformers loads it without special roles.
    tokenizer.save(str(folder / TOKENIZER_FILE))
    _write_json(folder / "tokenizer_config.json", {"tokenizer_class": "PreTrainedTokenizerFast"})


def _write_json(path: Path, content: dict) -> None:
    path.write_text(json.dumps(content, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
