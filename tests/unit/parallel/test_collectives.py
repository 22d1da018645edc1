"""Collectives of tensor-parallel ranks on real gloo process groups: two ranks,
TORCH_DISTRIBUTED_DEBUG=DETAIL (every collective's kind and shapes checked against the other rank's)
and a short process-group timeout, so that a mismatch fails here within seconds instead of hanging.

The vocabulary-parallel training loss (pipeline_model.token_loss, the LM head fused with the
cross-entropy) must cut the tokens into the same chunks on every rank, although the last shard holds
fewer real vocabulary rows than the others, or none: each chunk's statistics are all-reduced, and
ranks that cut differently would wait on each other forever (issue 28: TP2 hung on NCCL with
vocabulary 50,304). The chunks are made small here through the constant the training loss reads, so
that several chunks run; losses and gradients must match one rank's. A block must start one
all-reduce per input of its column-parallel layers in the backward (attention, MLP), not one per
layer; with sequence parallelism an all-gather and a reduce-scatter instead.

A collective that does not match, or that one rank never joins, must fail loudly, naming the rank,
within `parallel.collective_timeout_s`, also in a group made without a timeout of its own, as
DeepSpeed makes its groups (pipeline/parallel/ranks.py).
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pipeline.errors import ConfigError
from pipeline.model.model_config import ModelConfig
from pipeline.parallel.parallel_config import ParallelConfig, validate_parallel
from pipeline.parallel.ranks import free_port, rank_environment
from tests.conftest import REPO, ranks_from_server, repo_pythonpath

# With tp=2 and model.pad_vocab_multiple=128, vocabulary 300 is cut into shards of 256 rows holding
# 256 and 44 real ids; vocabulary 100 into shards of 128 holding 100 and none (the second rank holds
# padding only).
VOCABULARIES = (300, 100)
# The fused head's logits per chunk (pipeline.kernels.fused_head.CHUNK_LOGIT_ELEMENTS, 128M in
# training): 4 rows of a 128-row shard, 2 of a 256-row one, so that the 18 tokens below take 5 to 9
# chunks.
CHUNK_LOGIT_ELEMENTS = 512
HIDDEN = 16
SEQUENCE = 6  # of the blocks whose collectives are counted
RESULTS_FILE = "results.json"
RANK_TIMEOUT_S = (
    20  # the process group's; the launch below gives the ranks a little longer to start and fail
)
# parallel.collective_timeout_s of the mismatch test: short, yet long enough for two loaded ranks to
# start.
STUCK_TIMEOUT_S = 8


# ---- in the ranks
# -------------------------------------------------------------------------------------------

# Blocks whose all-reduces are counted: GELU and SwiGLU MLPs (gate and up), plain and grouped-query
# attention.
BLOCKS = {
    "alibi": ModelConfig(
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=4,
        num_kv_heads=4,
        ffn_size=32,
        position="alibi",
        norm="layernorm",
        activation="gelu",
        bias=True,
    ),
    "rope": ModelConfig(
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        ffn_size=32,
        position="rope",
        norm="rmsnorm",
        activation="swiglu",
    ),
}


def _model(vocab: int, tied: bool) -> ModelConfig:
    return ModelConfig(
        hidden_size=HIDDEN,
        num_layers=1,
        num_heads=2,
        num_kv_heads=2,
        ffn_size=32,
        vocab_size=vocab,
        tie_embeddings=tied,
        max_seq_len=16,
    )


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-6)).item()


def _loss_errors() -> dict[str, float]:
    """The tensor-parallel loss of each vocabulary, tied and untied head, against one rank's: loss,
    the hidden states' gradient and this rank's rows of the head's gradient."""
    import torch.distributed as dist

    from pipeline.kernels import fused_head
    from pipeline.parallel.pipeline_model import (
        EmbeddingLayer,
        HeadLayer,
        ParallelHeadLayer,
        _tied_head,
        token_loss,
    )
    from pipeline.parallel.tensor_parallel import apply_tensor_parallel

    fused_head.CHUNK_LOGIT_ELEMENTS = CHUNK_LOGIT_ELEMENTS
    group = dist.group.WORLD
    errors = {}
    for vocab in VOCABULARIES:
        for tied in (True, False):
            cfg = _model(vocab, tied)
            torch.manual_seed(vocab)  # the same on both ranks
            full = EmbeddingLayer(cfg) if tied else HeadLayer(cfg)
            hidden = torch.randn(2, 9, HIDDEN)
            targets = torch.randint(0, vocab, (2, 9))
            targets[0, :2] = torch.tensor([0, vocab - 1])  # the first and the last real id
            targets[1, 4] = -100

            full_hidden = hidden.clone().requires_grad_()
            outputs = _tied_head(full, full_hidden) if tied else full(full_hidden)
            expected = token_loss(vocab)(outputs, targets)
            expected.backward()
            full_weight = outputs[1]

            if tied:
                parallel = apply_tensor_parallel(copy.deepcopy(full), cfg, group)
                head = lambda h, parallel=parallel: _tied_head(parallel, h)  # noqa: E731
            else:
                head = parallel = ParallelHeadLayer(
                    copy.deepcopy(full), group, cfg.pad_vocab_multiple
                )
            local_hidden = hidden.clone().requires_grad_()
            outputs = head(local_hidden)
            loss = token_loss(vocab, group)(outputs, targets)
            loss.backward()
            weight = outputs[1]
            name = f"vocabulary {vocab} {'tied' if tied else 'untied'}"
            errors[f"{name} loss"] = _max_error(loss.detach(), expected.detach())
            errors[f"{name} hidden grad"] = _max_error(local_hidden.grad, full_hidden.grad)
            errors[f"{name} weight grad"] = _max_error(
                weight.grad, weight.tp_shard.take(full_weight.grad)
            )
    return errors


def _collectives_per_block() -> dict[str, dict[str, list]]:
    """Each collective a tensor-parallel block starts in its forward and in its backward, with the
    elements of the whole activation it moves and whether it was started to run beside what follows
    (async_op); plain and sequence-parallel."""
    import torch.distributed as dist

    from pipeline.model.transformer import Block
    from pipeline.parallel.tensor_parallel import apply_tensor_parallel

    counted = []
    originals = {
        name: getattr(dist, name)
        for name in ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
    }

    def counting(name: str, whole: int):
        def collective(*args, **kwargs):
            counted.append([name, args[whole].numel(), bool(kwargs.get("async_op"))])
            return originals[name](*args, **kwargs)

        return collective

    found = {}
    for model, cfg in BLOCKS.items():
        for sequence_parallel in (False, True):
            torch.manual_seed(0)
            block = apply_tensor_parallel(Block(cfg), cfg, dist.group.WORLD, sequence_parallel)
            x = torch.randn(
                2, SEQUENCE // (2 if sequence_parallel else 1), cfg.hidden_size, requires_grad=True
            )
            # all_reduce(tensor), all_gather_into_tensor(whole, part), reduce_scatter_tensor(part,
            # whole)
            for name, whole in (
                ("all_reduce", 0),
                ("all_gather_into_tensor", 0),
                ("reduce_scatter_tensor", 1),
            ):
                setattr(dist, name, counting(name, whole))
            try:
                output = block(x)
                forward, counted[:] = counted[:], []
                output.sum().backward()
                found[f"{model}{' sequence-parallel' if sequence_parallel else ''}"] = {
                    "forward": sorted(forward),
                    "backward": sorted(counted),
                }
                counted.clear()
            finally:
                for name, collective in originals.items():
                    setattr(dist, name, collective)
    return found


def matching_rank_entry(work_dir: Path) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=RANK_TIMEOUT_S))
    results = {"loss errors": _loss_errors(), "collectives per block": _collectives_per_block()}
    if dist.get_rank() == 0:
        (work_dir / RESULTS_FILE).write_text(json.dumps(results), encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def mismatch_rank_entry(work_dir: Path) -> None:
    """Through the training's own start (init_distributed), on groups made as DeepSpeed makes its
    tensor, pipeline and data-parallel groups (no timeout of their own): rank 0 all-reduces where
    rank 1 broadcasts, then rank 0 all-reduces where rank 1 never arrives. Each rank writes the
    errors it met and when."""
    import os
    import traceback

    import deepspeed.comm
    import torch.distributed as dist

    from pipeline.training.engine import init_distributed

    init_distributed(STUCK_TIMEOUT_S)
    rank = dist.get_rank()
    mismatched, stuck = deepspeed.comm.new_group([0, 1]), deepspeed.comm.new_group([0, 1])
    errors = {}
    started = time.monotonic()
    try:
        if rank == 0:
            dist.all_reduce(torch.ones(3), group=mismatched)
        else:
            dist.broadcast(torch.ones(3), src=0, group=mismatched)
    except RuntimeError as error:
        errors["mismatch"] = {
            "error": str(error),
            "seconds": time.monotonic() - started,
            "traceback": traceback.format_exc(),
        }
    if rank == 0:
        started = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=stuck)
        except RuntimeError as error:
            errors["stuck"] = {
                "error": str(error),
                "seconds": time.monotonic() - started,
                "traceback": traceback.format_exc(),
            }
    (work_dir / f"errors{rank}.json").write_text(json.dumps(errors), encoding="utf-8")
    if rank == 1:  # alive but elsewhere until rank 0 has failed (or long past the timeout)
        deadline = time.monotonic() + 4 * STUCK_TIMEOUT_S
        while not (work_dir / "errors0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
    os._exit(0)  # the groups are broken: no teardown


# ---- in the test process
# -------------------------------------------------------------------------------------


def _run_two_ranks(entry: str, work_dir: Path, limit_s: float) -> tuple[list[int], list[str]]:
    """`entry(work_dir)` of this module in two gloo ranks with collectives checked; their exit codes
    and outputs. Ranks still running after `limit_s` are killed (exit code None): a hang fails the
    test instead of stalling it."""
    code = f"from pathlib import Path; from tests.unit.parallel.test_collectives import {entry}; {entry}(Path({str(work_dir)!r}))"
    port = free_port()
    logs = [work_dir / f"rank{rank}.log" for rank in range(2)]
    processes = []
    for rank, log in enumerate(logs):
        env = {
            **rank_environment(rank, 2, port, threads=1),
            "TORCH_DISTRIBUTED_DEBUG": "DETAIL",
            "PYTHONPATH": repo_pythonpath(),
        }
        with open(log, "w", encoding="utf-8") as output, ranks_from_server():
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", code],
                    env=env,
                    cwd=REPO,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
            )
    deadline = time.monotonic() + limit_s
    codes = []
    for process in processes:
        try:
            codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            codes.append(None)
    return codes, [log.read_text(encoding="utf-8", errors="replace") for log in logs]


@pytest.fixture(scope="module")
def matching(tmp_path_factory) -> dict:
    work_dir = tmp_path_factory.mktemp("matching")
    codes, outputs = _run_two_ranks("matching_rank_entry", work_dir, limit_s=RANK_TIMEOUT_S + 60)
    assert codes == [0, 0], "\n\n".join(
        f"rank {rank} (exit {code}):\n{text[-4000:]}"
        for rank, (code, text) in enumerate(zip(codes, outputs))
    )
    return json.loads((work_dir / RESULTS_FILE).read_text(encoding="utf-8"))


def test_vocabulary_parallel_loss_matches_one_rank_with_uneven_shards_in_several_chunks(matching):
    errors = matching["loss errors"]
    assert len(errors) == 3 * 2 * len(VOCABULARIES)
    assert {name: error for name, error in errors.items() if not error < 1e-5} == {}


@pytest.mark.parametrize("model", sorted(BLOCKS))
def test_a_block_all_reduces_once_per_input_of_its_column_parallel_layers(matching, model):
    """Forward: the attention's and the MLP's row-parallel outputs; backward: the gradient of the
    attention's input (q, k and v together) and of the MLP's (gate and up together), each left
    running while the layers compute their weights' gradients. Each the size of the block's
    activations."""
    activations = 2 * SEQUENCE * HIDDEN
    assert matching["collectives per block"][model] == {
        "forward": [["all_reduce", activations, False]] * 2,
        "backward": [["all_reduce", activations, True]] * 2,
    }


@pytest.mark.parametrize("model", sorted(BLOCKS))
def test_a_sequence_parallel_block_gathers_and_scatters_instead(matching, model):
    """The same four exchanges of the block's activations as all-gathers and reduce-scatters of the
    sequence; in the backward also the gradients of the parameters applied to this rank's part of
    the sequence only, summed: the norms' weights (and biases) and the row-parallel biases."""
    activations = 2 * SEQUENCE * HIDDEN
    gathers = [["all_gather_into_tensor", activations, False]] * 2
    scatters = [["reduce_scatter_tensor", activations]] * 2
    replicated = (
        6 if BLOCKS[model].bias else 2
    )  # LayerNorm weight and bias x 2, out and down bias; RMSNorm weight x 2
    assert matching["collectives per block"][f"{model} sequence-parallel"] == {
        "forward": sorted(gathers + [[*scatter, False] for scatter in scatters]),
        # the column-parallel layers' input gradients scattered beside their weights' gradients, as
        # above
        "backward": sorted(
            [["all_reduce", HIDDEN, False]] * replicated
            + gathers
            + [[*scatter, True] for scatter in scatters]
        ),
    }


def test_a_mismatched_or_stuck_collective_fails_naming_the_rank_within_the_timeout(tmp_path):
    codes, outputs = _run_two_ranks(
        "mismatch_rank_entry", tmp_path, limit_s=6 * STUCK_TIMEOUT_S + 60
    )
    assert codes == [0, 0], "\n\n".join(
        f"rank {rank} (exit {code}):\n{text[-4000:]}"
        for rank, (code, text) in enumerate(zip(codes, outputs))
    )
    errors = [
        json.loads((tmp_path / f"errors{rank}.json").read_text(encoding="utf-8"))
        for rank in range(2)
    ]
    for rank in range(2):  # both ranks learn at once what the other runs
        mismatch = errors[rank]["mismatch"]
        assert mismatch["seconds"] < STUCK_TIMEOUT_S
        assert "Detected mismatch between collectives" in mismatch["error"]
        assert re.search(
            r"Rank 0 is running collective: CollectiveFingerPrint\(.*OpType=ALLREDUCE",
            mismatch["error"],
        )
        assert re.search(
            r"Rank 1 is running collective: CollectiveFingerPrint\(.*OpType=BROADCAST",
            mismatch["error"],
        )
    stuck = errors[0]["stuck"]
    # The rank that never came, and (in the traceback every failing rank logs) the collective left
    # waiting.
    assert re.search(
        rf"Ranks? 1 failed to pass monitoredBarrier in {STUCK_TIMEOUT_S * 1000} ms", stuck["error"]
    ), stuck["error"]
    assert "in all_reduce" in stuck["traceback"], stuck["traceback"]
    # The group's timeout is parallel.collective_timeout_s, not torch's 30 minutes for a group made
    # without one (rank 1 leaves after 4 x the timeout, which would also end the wait).
    assert STUCK_TIMEOUT_S - 1 < stuck["seconds"] < 2 * STUCK_TIMEOUT_S


def test_the_collective_timeout_is_checked():
    validate_parallel(ParallelConfig(collective_timeout_s=1))
    with pytest.raises(ConfigError, match=r"parallel\.collective_timeout_s.*seconds >= 1"):
        validate_parallel(ParallelConfig(collective_timeout_s=0))


def test_one_rank_starts_while_another_process_holds_its_port():
    """A stage of one rank needs no rendezvous: stages started side by side on one machine each pick
    a free port beforehand, and one of them lost it to another (EADDRINUSE on an H200 running four
    arms of bench/real_base.py)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = (
            "from pipeline.training.engine import init_distributed\n"
            "import deepspeed.comm as dist, torch\n"
            "init_distributed(30)\n"
            "t = torch.ones(2); dist.all_reduce(t); print('world', dist.get_world_size(), "
            "t.tolist())\n"
            # as a training rank ends (pipeline/training/rank.py): a group left alive can abort at
            # exit
            "dist.destroy_process_group()\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            env={**rank_environment(0, 1, port, 1), "PYTHONPATH": repo_pythonpath()},
        )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "world 1 [1.0, 1.0]" in result.stdout
