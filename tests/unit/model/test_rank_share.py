"""A rank loads and joins only its share: shards read from the stored tensor by slice, stage parts
joined into one file a tensor at a time (the multi-rank runs of
tests/unit/parallel/test_tensor_parallel.py check the training around them); a random model drawn a
tensor at a time, and the transformers export written in shards a tensor at a time
(tests/e2e/test_rank_memory.py measures the memory of whole runs)."""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from pipeline.errors import ConfigError
from pipeline.model.model_config import ExportConfig, ModelConfig, shard_bytes
from pipeline.model.files import load_checkpoint
from pipeline.model.hf_export import NonFiniteWeights, to_hf
from pipeline.model.model_tensors import (
    CheckpointTensors,
    ScratchTensors,
    model_shapes,
    write_checkpoint,
)
from pipeline.model.transformer import Transformer
from pipeline.tensor_files import TensorFileReader, join_tensor_files, save_tensors
from pipeline.training.weights import _load_shard


def test_joined_file_holds_every_tensor_of_the_parts_once_bit_for_bit(tmp_path):
    first = {
        "embedding.tokens.weight": torch.randn(7, 3),
        "blocks.0.norm.weight": torch.randn(3).bfloat16(),
        "steps": torch.arange(5),
    }
    last = {"embedding.tokens.weight": torch.randn(7, 3), "head.weight": torch.randn(7, 3).half()}
    save_tensors(first, tmp_path / "stage000.safetensors")
    save_tensors(last, tmp_path / "stage001.safetensors")
    previous = os.umask(0o027)
    try:
        join_tensor_files(
            [tmp_path / "stage000.safetensors", tmp_path / "stage001.safetensors"],
            tmp_path / "model.safetensors",
        )
    finally:
        os.umask(previous)
    joined = load_file(str(tmp_path / "model.safetensors"))
    # A name in two parts (the tied embedding of the first and the last stage) comes from the first.
    expected = {**last, **first}
    assert sorted(joined) == sorted(expected)
    for name, tensor in expected.items():
        assert joined[name].dtype == tensor.dtype and torch.equal(joined[name], tensor), name
    assert stat.S_IMODE((tmp_path / "model.safetensors").stat().st_mode) == 0o640
    assert not list(tmp_path.glob(".*tmp"))


def test_a_truncated_part_is_named(tmp_path):
    save_tensors({"w": torch.randn(64, 64)}, tmp_path / "part.safetensors")
    data = (tmp_path / "part.safetensors").read_bytes()
    (tmp_path / "part.safetensors").write_bytes(data[:-100])
    try:
        join_tensor_files([tmp_path / "part.safetensors"], tmp_path / "model.safetensors")
    except OSError as error:
        assert "part.safetensors ends inside tensor w" in str(error)
    else:
        raise AssertionError("a truncated part was joined")
    assert not (tmp_path / "model.safetensors").exists() and not list(tmp_path.glob(".*tmp"))


def test_a_shard_reads_its_rows_or_columns_and_zero_pads_past_the_full_size(tmp_path):
    full = torch.randn(10, 6)
    save_tensors({"w": full}, tmp_path / "w.safetensors")
    with TensorFileReader(tmp_path / "w.safetensors") as stored:
        # rows cut in 3 parts of 4 (10 rows padded to 12): the last part holds rows 8-9 and two zero
        # rows
        for start in (0, 4, 8):
            local = torch.full((4, 6), float("nan"))
            _load_shard(
                local, stored, "w", SimpleNamespace(dim=0, start=start, size=4, full_size=10)
            )
            expected = torch.cat([full, torch.zeros(2, 6)])[start : start + 4]
            assert torch.equal(local, expected), start
        # columns cut in 2 parts of 3
        local = torch.empty(10, 3)
        _load_shard(local, stored, "w", SimpleNamespace(dim=1, start=3, size=3, full_size=6))
        assert torch.equal(local, full[:, 3:])


def test_a_reader_gives_any_slice_of_any_tensor_reading_a_chunk_of_rows_at_a_time(tmp_path):
    tensors = {
        "matrix": torch.randn(6, 10),
        "cube": torch.randn(4, 3, 5).bfloat16(),
        "vector": torch.randn(7),
    }
    save_tensors(tensors, tmp_path / "x.safetensors")
    with TensorFileReader(tmp_path / "x.safetensors") as reader:
        for name, tensor in tensors.items():
            assert torch.equal(reader.read(name), tensor)
            for dim, size in enumerate(tensor.shape):
                for start, stop in ((0, size), (1, size - 1), (size // 2, size)):
                    assert torch.equal(
                        reader.read_slice(name, dim, start, stop),
                        tensor.narrow(dim, start, stop - start),
                    )
    (tmp_path / "cut.safetensors").write_bytes((tmp_path / "x.safetensors").read_bytes()[:-8])
    with pytest.raises(OSError, match="cut.safetensors is truncated"):
        TensorFileReader(tmp_path / "cut.safetensors")


def test_a_random_model_is_the_same_whichever_tensors_are_drawn_in_whatever_order():
    cfg = ModelConfig(
        hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_size=64, vocab_size=100
    )
    names = list(model_shapes(cfg))
    forward = {name: ScratchTensors(cfg, seed=3).read(name) for name in names}
    backward = {name: ScratchTensors(cfg, seed=3).read(name) for name in reversed(names)}
    assert all(torch.equal(forward[name], backward[name]) for name in names)
    assert not torch.equal(
        forward["blocks.0.attn.q.weight"],
        ScratchTensors(cfg, seed=4).read("blocks.0.attn.q.weight"),
    )
    embedding = forward["embedding.tokens.weight"]
    assert (
        embedding[100:].abs().sum() == 0 and 0.015 < embedding[:100].std() < 0.025
    )  # init_std 0.02, padding zero
    assert torch.equal(forward["final_norm.weight"], torch.ones(32))


@pytest.mark.parametrize("family", ["llama", "bloom"])
def test_a_checkpoint_exports_in_shards_a_tensor_at_a_time_as_the_model_in_memory_does(
    tmp_path, family
):
    shape = (
        dict(
            position="alibi",
            norm="layernorm",
            activation="gelu",
            embedding_norm=True,
            bias=True,
            num_kv_heads=4,
        )
        if family == "bloom"
        else dict(num_kv_heads=2, tie_embeddings=False)
    )
    cfg = ModelConfig(
        hidden_size=32, num_layers=2, num_heads=4, ffn_size=128, vocab_size=100, **shape
    )
    assert not write_checkpoint(ScratchTensors(cfg, seed=0), tmp_path / "checkpoint")
    model = load_checkpoint(tmp_path / "checkpoint")
    whole = to_hf(model, tmp_path / "whole")
    sharded = to_hf(
        CheckpointTensors(tmp_path / "checkpoint"), tmp_path / "sharded", max_shard_bytes=20_000
    )
    files = sorted(path.name for path in sharded.glob("*.safetensors"))
    assert len(files) > 2 and files[-1] == f"model-{len(files):05d}-of-{len(files):05d}.safetensors"
    index = json.loads((sharded / "model.safetensors.index.json").read_text(encoding="utf-8"))
    single = load_file(str(whole / "model.safetensors"))
    assert set(index["weight_map"]) == set(single)
    for file in files:
        shard = load_file(str(sharded / file))
        assert (
            sum(t.numel() * t.element_size() for t in shard.values()) <= 20_000 or len(shard) == 1
        )
        assert all(
            torch.equal(tensor, single[name]) and index["weight_map"][name] == file
            for name, tensor in shard.items()
        )
    assert json.loads((sharded / "config.json").read_text()) == json.loads(
        (whole / "config.json").read_text()
    )


def test_an_export_with_a_non_finite_weight_leaves_no_weights(tmp_path):
    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, ffn_size=64, vocab_size=100
    )
    model = Transformer(cfg)
    with torch.no_grad():
        model.blocks[0].mlp.up.weight[0, 0] = float("nan")
    with pytest.raises(NonFiniteWeights) as error:
        to_hf(model, tmp_path / "hf", max_shard_bytes=10_000)
    assert error.value.names == ["blocks.0.mlp.up.weight"]
    assert not list((tmp_path / "hf").glob("*.safetensors"))


@pytest.mark.parametrize(
    "size, expected",
    [
        ("5GB", 5 * 10**9),
        ("500MB", 5 * 10**8),
        ("2GiB", 2 * 2**30),
        ("123", 123),
        ("1.5 GB", 1.5 * 10**9),
    ],
)
def test_shard_sizes_read_like_save_pretrained(size, expected):
    assert shard_bytes(ExportConfig(max_shard_size=size)) == expected


@pytest.mark.parametrize("size", ["5 parsecs", "", "0MB", "-1GB"])
def test_a_bad_shard_size_names_the_key(size):
    with pytest.raises(ConfigError, match="export.max_shard_size"):
        shard_bytes(ExportConfig(max_shard_size=size))
