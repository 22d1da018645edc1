"""A rank loads and joins only its share: shards read from the stored tensor by slice, stage parts joined into one
file a tensor at a time (the multi-rank runs of tests/test_tensor_parallel.py check the training around them)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from pipeline.tensor_files import join_tensor_files, save_tensors
from pipeline.training.weights import _load_shard


def test_joined_file_holds_every_tensor_of_the_parts_once_bit_for_bit(tmp_path):
    first = {"embedding.tokens.weight": torch.randn(7, 3), "blocks.0.norm.weight": torch.randn(3).bfloat16(),
             "steps": torch.arange(5)}
    last = {"embedding.tokens.weight": torch.randn(7, 3), "head.weight": torch.randn(7, 3).half()}
    save_tensors(first, tmp_path / "stage000.safetensors")
    save_tensors(last, tmp_path / "stage001.safetensors")
    previous = os.umask(0o027)
    try:
        join_tensor_files([tmp_path / "stage000.safetensors", tmp_path / "stage001.safetensors"],
                          tmp_path / "model.safetensors")
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
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as handle:
        stored = handle.get_slice("w")
        # rows cut in 3 parts of 4 (10 rows padded to 12): the last part holds rows 8-9 and two zero rows
        for start in (0, 4, 8):
            local = torch.full((4, 6), float("nan"))
            _load_shard(local, stored, SimpleNamespace(dim=0, start=start, size=4, full_size=10))
            expected = torch.cat([full, torch.zeros(2, 6)])[start:start + 4]
            assert torch.equal(local, expected), start
        # columns cut in 2 parts of 3
        local = torch.empty(10, 3)
        _load_shard(local, stored, SimpleNamespace(dim=1, start=3, size=3, full_size=6))
        assert torch.equal(local, full[:, 3:])
