"""A user's own base model decides the shape (issue 18): random BLOOM and Llama (grouped-query)
bases made with transformers go through warmup, pretrain init=hf and evaluate with no model
override, on the Norwegian chain of tests/conftest.py, and the exported folders keep the base's
shape and load in transformers. Random Qwen2, Qwen3, OLMo 2, Phi-3, Gemma 2 and Gemma 3 bases
(issue 54) take a warmup and a pretrain step each and come back in their own architecture."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
import transformers

from pipeline.tokenization.tokenizer_config import SpecialTokens, TokenizerConfig
from pipeline.tokenization.folder import write_tokenizer_folder
from pipeline.tokenization.training import train_tokenizer
from tests.conftest import CHAIN_OPTIONS, marker, run_cli
from tests.english_base_model import english_texts

VOCAB = 512
# The base's sizes as config.json keys, per architecture.
SHAPES = {
    "bloom": (transformers.BloomConfig, {"hidden_size": 64, "n_layer": 2, "n_head": 4}),
    "llama": (
        transformers.LlamaConfig,
        {
            "hidden_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "intermediate_size": 160,
            "max_position_embeddings": 256,
            "tie_word_embeddings": False,
        },
    ),
}
# The architectures of issue 54, each with what sets it apart: Qwen2's q/k/v biases and tied head,
# Qwen3's per-head q/k norms and its own head size, OLMo 2's norms after the sublayers, Phi-3's fused
# projections, Gemma's four norms a block, GeGLU, soft caps and windowed layers (shorter than the
# training sequences) with Gemma 3's own RoPE base. Special ids within the tokenizer's (OLMo 2's and
# Phi-3's defaults lie beyond it).
SIZES = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
SPECIAL_IDS = {"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}
NEW_SHAPES = {
    "qwen2": (
        transformers.Qwen2Config,
        {**SIZES, "num_key_value_heads": 2, "intermediate_size": 160, "tie_word_embeddings": True},
    ),
    "qwen3": (
        transformers.Qwen3Config,
        {**SIZES, "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 160},
    ),
    "olmo2": (transformers.Olmo2Config, {**SIZES, "intermediate_size": 160, **SPECIAL_IDS}),
    "phi3": (
        transformers.Phi3Config,
        {**SIZES, "num_key_value_heads": 2, "intermediate_size": 160, **SPECIAL_IDS},
    ),
    "gemma2": (
        transformers.Gemma2Config,
        {**SIZES, "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 160},
    ),
    "gemma3": (
        transformers.Gemma3TextConfig,
        {
            **SIZES,
            "num_key_value_heads": 1,
            "head_dim": 16,
            "intermediate_size": 160,
            "sliding_window": 16,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
}
# Budgets cut to seconds; none of them is a model override.
SMALL = (
    "warmup.train.steps=2",
    "warmup.train.seq_len=64",
    "warmup.train.eval_tokens=1024",
    "train.steps=1",
    "train.seq_len=64",
    "train.eval_tokens=1024",
    "eval.seq_len=64",
    "eval.max_bytes=4000",
)


@pytest.fixture(scope="module")
def english_tokenizer(tmp_path_factory):
    """A small English tokenizer for the random bases (the warm start maps its rows to the new
    vocabulary)."""
    folder = tmp_path_factory.mktemp("english-tokenizer")
    trained = train_tokenizer(english_texts()[:300], TokenizerConfig(vocab_size=VOCAB))
    write_tokenizer_folder(folder, trained, SpecialTokens())
    return folder


def random_base(family: str, folder, tokenizer_dir):
    config_class, sizes = {**SHAPES, **NEW_SHAPES}[family]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_class(vocab_size=VOCAB, **sizes))
    model.save_pretrained(folder, safe_serialization=True)
    for file in tokenizer_dir.iterdir():
        shutil.copy(file, folder / file.name)
    return folder


def shape(folder) -> dict:
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    keys = ("architectures", *SHAPES["bloom" if "n_layer" in config else "llama"][1])
    return {
        key: config.get(key)
        for key in keys
        if key not in ("max_position_embeddings", "tie_word_embeddings")
    }


@pytest.mark.parametrize("family", sorted(SHAPES))
def test_acceptance_the_base_model_shapes_warmup_pretrain_and_evaluate(
    family, nob_packed, english_tokenizer, tmp_path
):
    base = random_base(family, tmp_path / family, english_tokenizer)
    work = tmp_path / "work"
    for stage in ("clean", "mix", "tokenizer", "pack"):
        shutil.copytree(nob_packed / "work" / "nob" / stage, work / "nob" / stage)
    common = (*CHAIN_OPTIONS, f"work_dir={work}", *SMALL)

    warmup = run_cli("stage=warmup", *common, f"model.base={base}", cwd=tmp_path)
    exported = work / "nob" / "warmup" / "hf"
    assert shape(exported) == shape(base)
    model = transformers.AutoModelForCausalLM.from_pretrained(exported)
    assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all()
    assert (
        marker(work, "nob", "warmup")["config"]["model"]["hidden_size"] == 64
    )  # not the tiny preset's 128
    # Training says what it starts within seconds, and DeepSpeed builds no C++ collective on a CPU.
    assert "warmup: starting DeepSpeed on 1 rank(s)" in warmup.stderr
    assert "shm_comm" not in warmup.stdout + warmup.stderr

    run_cli("stage=pretrain", *common, "init=hf", f"model.base={exported}", cwd=tmp_path)
    assert shape(work / "nob" / "pretrain" / "hf") == shape(base)

    run_cli("stage=evaluate", *common, f"model.base={base}", cwd=tmp_path)
    scores = marker(work, "nob", "evaluate")["metrics"]["bits_per_byte"]
    assert list(scores) == ["base", "warmup", "pretrain"]
    report = (work / "nob" / "evaluate" / "report.md").read_text(encoding="utf-8")
    assert (
        "`train.eval_tokens`" in report and "`eval.max_bytes`" in report
    )  # why the training logs' numbers differ


@pytest.mark.parametrize("family", sorted(NEW_SHAPES))
def test_a_qwen_olmo_phi_or_gemma_base_warms_up_and_pretrains_in_its_own_architecture(
    family, nob_packed, english_tokenizer, tmp_path
):
    base = random_base(family, tmp_path / family, english_tokenizer)
    work = tmp_path / "work"
    for stage in ("clean", "mix", "tokenizer", "pack"):
        shutil.copytree(nob_packed / "work" / "nob" / stage, work / "nob" / stage)
    common = (*CHAIN_OPTIONS, f"work_dir={work}", *SMALL, "warmup.train.steps=1")
    base_config = json.loads((base / "config.json").read_text(encoding="utf-8"))

    run_cli("stage=warmup", *common, f"model.base={base}", cwd=tmp_path)
    run_cli("stage=pretrain", *common, f"model.base={base}", cwd=tmp_path)
    for stage in ("warmup", "pretrain"):
        exported = work / "nob" / stage / "hf"
        config = json.loads((exported / "config.json").read_text(encoding="utf-8"))
        sizes = {k: v for k, v in NEW_SHAPES[family][1].items() if k not in SPECIAL_IDS}
        assert config["architectures"] == base_config["architectures"], stage
        assert {key: config[key] for key in sizes} == sizes, stage
        model = transformers.AutoModelForCausalLM.from_pretrained(exported)
        assert type(model).__name__ == base_config["architectures"][0]
        assert torch.isfinite(model(torch.tensor([[5, 6, 7, 8]])).logits).all(), stage
