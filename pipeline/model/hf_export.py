"""`to_hf`: the project's Transformer -> a folder that `transformers.AutoModelForCausalLM.from_pretrained` loads.

Writes the weights as safetensors (one `model.safetensors`, or shards with `model.safetensors.index.json`
above `max_shard_bytes`), `config.json` in the keys that transformers 4.x and 5.x both read,
`generation_config.json`, and the tokenizer files when a tokenizer is given. The vocabulary padding is
cut off: the folder declares the tokenizer's vocabulary, as the original checkpoint did.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional, Union

import torch
from tokenizers import Tokenizer

from pipeline.model.hf_architectures import fuse_bloom, hf_tensor_name
from pipeline.model.hf_config import CONFIG_FILE, CheckpointError, architecture_for, config_to_hf
from pipeline.model.hf_import import INDEX_FILE, SINGLE_FILE, VOCAB_TENSORS
from pipeline.model.transformer import Transformer
from pipeline.tensor_files import save_tensors
from pipeline.tokenization.config import SpecialTokens
from pipeline.tokenization.folder import TOKENIZER_FILE, special_token_strings, write_tokenizer_folder
from pipeline.tokenization.trained import TrainedTokenizer

# The files of a tokenizer folder that travel with the model (transformers' fast and SentencePiece tokenizers).
TOKENIZER_FILES = (TOKENIZER_FILE, "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model")


def to_hf(model: Transformer, path, tokenizer: Union[None, Tokenizer, str, Path] = None,
          max_shard_bytes: int = 5 * 2**30) -> Path:
    """Write `model` to the new folder `path` as BloomForCausalLM, LlamaForCausalLM or MistralForCausalLM.

    `tokenizer` is a folder holding tokenizer.json (the tokenizer stage's output, or the base model's
    folder: its files are copied), a tokenizer.json file, or a `tokenizers.Tokenizer`. The
    special tokens' ids (bos, eos, pad) go into config.json and generation_config.json; they come from
    the folder's tokenizer_config.json / special_tokens_map.json, and for a bare tokenizer.json or
    Tokenizer from the project's special tokens (<s>, </s>, <pad>, <unk>) when it holds them.
    """
    cfg = model.cfg
    architecture = architecture_for(cfg)
    folder = Path(path)
    if (folder / CONFIG_FILE).exists() or any(folder.glob("*.safetensors")):
        raise CheckpointError(f"{folder} already holds a model; to_hf writes into a new or empty folder.")
    folder.mkdir(parents=True, exist_ok=True)
    special_ids = _write_tokenizer(tokenizer, folder, cfg.vocab_size) if tokenizer is not None else {}
    tensors = hf_tensors(model)
    _write_weights(tensors, folder, max_shard_bytes)
    dtype = model.embedding.tokens.weight.dtype
    _write_json(folder / CONFIG_FILE, config_to_hf(cfg, architecture, str(dtype).removeprefix("torch."), special_ids))
    generation = {f"{role}_token_id": special_ids[role] for role in ("bos", "eos", "pad")
                  if special_ids.get(role) is not None}
    _write_json(folder / "generation_config.json", generation)
    return folder


def hf_tensors(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's tensors under Hugging Face's names, vocabulary unpadded, BLOOM's q/k/v fused."""
    cfg = model.cfg
    architecture = architecture_for(cfg)
    tensors, parts = {}, {}
    for name, tensor in model.state_dict().items():
        if cfg.tie_embeddings and name == "head.weight":
            continue  # transformers ties it to the embedding on load
        if name in VOCAB_TENSORS:
            tensor = tensor[:cfg.vocab_size]
        hf_name, part = hf_tensor_name(architecture, name)
        tensor = tensor.detach().cpu()
        if part is None:
            tensors[hf_name] = tensor.contiguous()
        else:
            parts.setdefault(hf_name, {})[part] = tensor
    for hf_name, qkv in parts.items():  # BLOOM's query_key_value
        tensors[hf_name] = fuse_bloom(qkv[0], qkv[1], qkv[2], cfg.num_heads)
    return dict(sorted(tensors.items()))


def _write_weights(tensors: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int) -> None:
    shards, size = [{}], 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    metadata = {"format": "pt"}  # transformers checks that the file says it holds PyTorch tensors
    if len(shards) == 1:
        save_tensors(shards[0], folder / SINGLE_FILE, metadata=metadata)
        return
    weight_map = {}
    for number, shard in enumerate(shards, start=1):
        file = f"model-{number:05d}-of-{len(shards):05d}.safetensors"
        save_tensors(shard, folder / file, metadata=metadata)
        weight_map.update(dict.fromkeys(shard, file))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    _write_json(folder / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": weight_map})


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
                raise CheckpointError(f"to_hf: tokenizer {source} is neither a folder nor a {TOKENIZER_FILE} file.")
            tokenizer = Tokenizer.from_file(str(source))
        _write_bare_tokenizer(tokenizer, folder)
    loaded = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    if loaded.get_vocab_size() > vocab_size:
        raise CheckpointError(f"to_hf: the tokenizer has {loaded.get_vocab_size()} tokens but the model only "
                              f"{vocab_size} (model.vocab_size); its ids beyond that have no embedding.")
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
