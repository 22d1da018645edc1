"""Model files: pipeline checkpoints, the base model folder, and their identity for the stage
contract.

`model.base` is a local Hugging Face folder (BLOOM, Llama, Mistral, Qwen2, Qwen3, OLMo 2, Phi-3;
`config.json`, safetensors and the tokenizer files) or a pipeline checkpoint (`model_config.json`, `model.safetensors`, tokenizer
files), such as the one `stage=warmup` writes for `stage=pretrain`. `check_fit` says whether a base
model fits the configured one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path
from typing import Optional

import torch
from tokenizers import Tokenizer

from pipeline.errors import StageError
from pipeline.model.base_shape import CHECKPOINT_CONFIG
from pipeline.model.model_config import ModelConfig
from pipeline.model.hf_import import HFTensors
from pipeline.model.model_tensors import (
    CheckpointTensors,
    ModelTensors,
    ModuleTensors,
    ScratchTensors,
    StartingModel,
    build_model,
    write_checkpoint,
)
from pipeline.model.transformer import Transformer
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer
from pipeline.work_folder import output_identity

# Fields that define the body: they must agree between the configured model and the base.
SHAPE_FIELDS = (
    "hidden_size",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "head_size",
    "ffn_size",
    "position",
    "norm",
    "activation",
    "embedding_norm",
    "bias",
    "qkv_bias",
    "qk_norm",
    "norm_placement",
    "tie_embeddings",
)


def folder_fingerprint(path: str) -> dict:
    """A model folder's identity by its content, wherever it is: its files' names, sizes and
    modification times, and its JSON files (without reading gigabytes of weights). A copy that does
    not keep the times (`cp -r` without `-p`) counts as another model; one that keeps them to the
    second (tar) is the same."""
    folder = Path(path)
    files = sorted(p for p in folder.glob("*") if p.is_file()) if folder.is_dir() else []
    digest = hashlib.sha256()
    for file in files:
        stat = file.stat()
        digest.update(
            f"{file.name}:{stat.st_size}:{int(stat.st_mtime)}".encode()
        )  # seconds: as tar keeps them
        if file.suffix == ".json":
            digest.update(file.read_bytes())
    return {"files": digest.hexdigest()[:16]}


def base_identity(cfg, path: str) -> dict:
    """A base model's identity for the stage contract: the hash of the stage that made it when it is
    a finished stage output of this work folder (the demo's base), else its content
    (`folder_fingerprint`)."""
    return output_identity(cfg, path) or folder_fingerprint(path)


def base_model_input(cfg) -> dict:
    """`model.base` as a stage's described input (Stage.describe_inputs), by content: another base
    reruns the stage, a moved one does not."""
    return {} if cfg.model.base is None else {"base_model": base_identity(cfg, cfg.model.base)}


def save_checkpoint(model: Transformer, folder: Path) -> None:
    """A pipeline checkpoint: the model's own tensor names and config in float32 (the tokenizer goes
    beside it)."""
    write_checkpoint(ModuleTensors(model), folder)


def refuse_non_finite(names: list[str], what: str, advice: str) -> None:
    """Refuse a model with a NaN or an infinity in the tensors `names`: it is never trained on
    (every step would be skipped), exported or scored. `what` names it in the message ("pretrain:
    the starting model (...)")."""
    if names:
        raise StageError(
            f"{what} holds non-finite values (in "
            f"{', '.join(names[:5])}{' ...' if len(names) > 5 else ''}"
            f"); {advice}"
        )


def check_finite(model: Transformer, what: str, advice: str) -> None:
    refuse_non_finite(
        [
            name
            for name, tensor in model.state_dict().items()
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
        ],
        what,
        advice,
    )


def load_checkpoint(folder: Path) -> Transformer:
    return build_model(CheckpointTensors(folder))


def base_tensors(path: str) -> ModelTensors:
    """The base model's tensors in float32 (the warm start's arithmetic and the CPU path want it),
    read one at a time: a pipeline checkpoint or a Hugging Face folder."""
    folder = Path(path)
    if not folder.is_dir():
        raise StageError(
            f"model.base={path} is not a folder. Give a local Hugging Face model folder "
            "(config.json, "
            "*.safetensors, tokenizer.json) or a pipeline checkpoint (e.g. "
            "work/<lang>/warmup/checkpoint)."
        )
    if (folder / CHECKPOINT_CONFIG).is_file():
        return CheckpointTensors(folder, torch.float32)
    return HFTensors(folder, torch.float32)


def load_base(path: str) -> Transformer:
    """The base model in memory, in float32."""
    return build_model(base_tensors(path))


def check_fit(
    configured: ModelConfig, base: ModelConfig, base_path: str, base_tokenizer: Tokenizer
) -> None:
    """The configured model (`model=`) must describe the base's body; the base tokenizer its
    vocabulary."""
    for key in SHAPE_FIELDS:
        wanted, found = getattr(configured, key), getattr(base, key)
        if wanted != found:
            raise StageError(
                f"The base model {base_path} has {key}={found}, but the configured model has "
                f"model.{key}={wanted}. The base model decides the shape: give it as model.base on "
                f"the command line and leave model.{key} out."
            )
    if base_tokenizer.get_vocab_size() > base.vocab_size:
        raise StageError(
            f"The base tokenizer ({base_path}/{TOKENIZER_FILE}) has "
            f"{base_tokenizer.get_vocab_size()} "
            f"tokens but the base model only {base.vocab_size} embedding rows: they do not belong "
            f"together. Put the model's own tokenizer in {base_path}."
        )


def pretrain_start(
    init: str,
    model: ModelConfig,
    seed: int,
    tokenizer: Tokenizer,
    *,
    base: Optional[str],
    trained: Optional[tuple[Path, ModelTensors]],
    packed_with: Path,
    lang: str,
) -> StartingModel:
    """Where continued pretraining starts (`init`): a trained checkpoint (`trained`: its path and
    tensors; the warmup stage's, or the final model of the run that init=continue:<run>
    continues), the base model (which must use the pack's tokenizer, `tokenizer`, read from
    `packed_with`), or random weights, each tensor drawn from its own seed so that every layout
    starts from the same model."""
    vocab = tokenizer.get_vocab_size(with_added_tokens=True)
    if init == "scratch":
        tensors = ScratchTensors(dataclasses.replace(model, vocab_size=vocab), seed)
        source = f"a random initialisation with model.init_std={model.init_std}"
    elif trained is not None:
        source, tensors = trained
    else:
        source = Path(base)
        tensors = base_tensors(base)
        if load_tokenizer(base).get_vocab() != tokenizer.get_vocab():
            raise StageError(
                f"pretrain init=hf: the tokenizer of {source} is not the one the data was packed "
                "with "
                f"({packed_with}). Continue from a model that uses it (the warmup stage's output: "
                f"init=warmup, or its hf/ folder), or warm-start this base model first: "
                f"python -m pipeline stage=warmup lang={lang} model.base={source}"
            )
    check_fit(model, tensors.cfg, str(source), tokenizer)
    if tensors.cfg.vocab_size != vocab:
        raise StageError(
            f"pretrain: the model of {source} has {tensors.cfg.vocab_size} vocabulary rows, the "
            "pack's "
            f"tokenizer {vocab}; they must be the same (run warmup for this tokenizer)."
        )
    return StartingModel(
        tensors,
        f"pretrain: the starting model ({source})",
        "every training step would be "
        "skipped. Start from a sound model: run the stage that made it again, or check "
        "model.init_std.",
    )


def describe_pretrain_start(cfg) -> dict:
    """Where pretraining's weights start when not from the warmup stage, for the stage contract: the
    base model's files (init=hf)."""
    if cfg.init == "hf":
        if cfg.model.base is None:
            raise StageError(
                "pretrain init=hf needs model.base=<local Hugging Face folder> whose tokenizer is "
                "the "
                "pack's (e.g. work/<lang>/warmup/hf)."
            )
        return {"base_model": base_identity(cfg, cfg.model.base)}
    return {}
