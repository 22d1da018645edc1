"""Tensor, pipeline and data parallelism on real GPUs (NCCL, bf16, the Triton kernels): each layout
trains like one GPU. Skipped unless 2 CUDA devices or more are present; the CPU suite checks the
same layouts on gloo ranks in fp32 (tests/unit/parallel/test_tensor_parallel.py).

A small model with a realistic vocabulary (50,257 ids, GPT-2's: under tp=2 the two shards of 25,216
rows hold 25,216 and 25,041 real ids, so the fused head's chunks must be cut alike on ranks of
unequal use) trains a few steps on the same global batches from the same initial weights through the
training stages' engine (`pipeline.training.engine.build_engine`): as one GPU and in every layout of
as many ranks as there are GPUs or fewer (TP2, PP2, DP2; on 4 GPUs TP4, TP2 x DP2, TP2 x PP2, PP2 x
DP2; on 8 TP2 x PP2 x DP2, DP8, TP2 x DP4, PP2 x DP4, TP4 x PP2), for the ALiBi model with a tied
head and the RoPE model with
grouped-query attention and an untied head. Every step's loss must agree with one GPU's within bf16
rounding. Collectives are checked (TORCH_DISTRIBUTED_DEBUG=DETAIL, set by tests/conftest.py) and
bounded (parallel.collective_timeout_s), so that a hang fails the launch.

    PARALLEL_GPU_RESULTS=bench/results/parallel_gpu python -m pytest -q -n 0 tests/gpu/test_parallel_gpu.py

writes each layout's losses, gradient norms and step times to `$PARALLEL_GPU_RESULTS/layouts.json`
and a table to `layouts.md` there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.cluster import ClusterConfig
from pipeline.model.model_config import ModelConfig
from pipeline.model.files import save_checkpoint
from pipeline.model.model_tensors import CHECKPOINT_WEIGHTS
from pipeline.model.transformer import Transformer
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.parallel.ranks import free_port, rank_environment, run_ranks
from pipeline.training.train_config import TrainConfig
from tests.conftest import REPO, repo_pythonpath

GPUS = torch.cuda.device_count()
pytestmark = pytest.mark.skipif(GPUS < 2, reason="needs 2 CUDA GPUs or more")

VOCAB = 50257
SHAPES = {
    "alibi": dict(
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=8,
        ffn_size=2048,
        vocab_size=VOCAB,
        position="alibi",
        norm="layernorm",
        activation="gelu",
        embedding_norm=True,
        bias=True,
        tie_embeddings=True,
        max_seq_len=1024,
    ),
    "rope": dict(
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        num_kv_heads=4,
        ffn_size=1536,
        vocab_size=VOCAB,
        position="rope",
        norm="rmsnorm",
        activation="swiglu",
        tie_embeddings=False,
        max_seq_len=1024,
    ),
}
# bf16 (the engine's GPU precision); lr high enough that the loss moves in a few steps. A
# micro-batch's 8,192 tokens take two chunks of the fused head (5,322 rows each at 25,216 rows per
# vocabulary shard), as in training.
TRAIN = dict(
    steps=4,
    global_batch_size=64,
    micro_batch_size=8,
    seq_len=1024,
    lr=1e-3,
    schedule="constant",
    warmup_steps=0,
    grad_clip=1.0,
    precision="auto",
    seed=5,
)
# By the ranks they take; each runs where there are as many GPUs.
LAYOUTS = {
    2: ((2, 1, 1), (1, 2, 1), (1, 1, 2)),
    4: ((4, 1, 1), (2, 1, 2), (2, 2, 1), (1, 2, 2)),
    8: ((2, 2, 2), (1, 1, 8), (2, 1, 4), (1, 2, 4), (4, 2, 1)),
}
COLLECTIVE_TIMEOUT_S = 300
# bf16 rounding: the first step's loss agrees to a few 1e-4 (issue 28 measured 3e-6 for TP2 at
# 1.3B), later steps drift by the different order of the sums; a wrong cut, a lost gradient or a
# mismatched chunk is off by far more.
FIRST_STEP_TOLERANCE = 2e-3
TOLERANCE = 1e-2
JOB_FILE = "job.json"


# ---- in the ranks
# -------------------------------------------------------------------------------------------


def _batches(
    vocab: int, train: TrainConfig, dp_rank: int, dp_world: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each step's sequences of this data-parallel rank: the same global batches for every layout,
    with a document boundary in every sequence. Ids of Zipf-distributed frequency spread over the
    whole vocabulary (the frequent ones a prime stride apart), so that a few steps lower the loss,
    every shard holds targets, and so do the first and the last real id."""
    generator = np.random.default_rng(train.seed)
    share = train.global_batch_size // dp_world
    steps = []
    for _ in range(train.steps):
        ranks = generator.zipf(1.3, (train.global_batch_size, train.seq_len + 1))
        tokens = (ranks * 7919) % vocab
        tokens[:, 1], tokens[:, 2] = 0, vocab - 1
        cut = generator.integers(1, train.seq_len, train.global_batch_size)
        segments = (np.arange(train.seq_len + 1)[None, :] >= cut[:, None]).astype(np.int64)
        part = slice(dp_rank * share, (dp_rank + 1) * share)
        steps.append((tokens[part], segments[part]))
    return steps


def _train(
    model: str, shape: dict, train: TrainConfig, layout: tuple[int, int, int], work_dir: Path
) -> dict:
    from pipeline.training.engine import build_engine
    from pipeline.training.heldout import micro_batches

    tp, pp, dp = layout
    built = build_engine(
        ModelConfig(**shape),
        train,
        ParallelConfig(tp=tp, pp=pp, dp=dp, collective_timeout_s=COLLECTIVE_TIMEOUT_S),
        work_dir / f"init-{model}" / CHECKPOINT_WEIGHTS,
        trainable=lambda _: True,
    )
    engine = built.engine
    losses, norms, seconds = [], [], []
    for tokens, segments in _batches(shape["vocab_size"], train, built.dp_rank, built.dp_world):
        started = time.perf_counter()
        losses.append(
            float(
                engine.train_batch(
                    iter(micro_batches(tokens, segments, train.micro_batch_size, engine.device))
                )
            )
        )
        norms.append(float(engine.get_global_grad_norm()))  # float(): the step has ended on the GPU
        seconds.append(time.perf_counter() - started)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "CPU"
    return {
        "losses": losses,
        "grad_norms": norms,
        "step_seconds": seconds,
        "device": device,
        "torch": torch.__version__,
    }


def rank_entry(work_dir: Path) -> None:
    """Train every run of `job.json` on this launch's ranks, one after the other; rank 0 writes the
    results."""
    import torch.distributed as dist

    from pipeline.training.engine import init_distributed

    init_distributed(COLLECTIVE_TIMEOUT_S)
    job = json.loads((work_dir / JOB_FILE).read_text(encoding="utf-8"))
    train = TrainConfig(**job["train"])
    results = {}
    for model, layout in job["runs"]:
        results[f"{model} {tuple(layout)}"] = _train(
            model, job["shapes"][model], train, tuple(layout), work_dir
        )
    if dist.get_rank() == 0:
        (work_dir / f"results-{dist.get_world_size()}.json").write_text(
            json.dumps(results), encoding="utf-8"
        )
    dist.barrier()
    dist.destroy_process_group()


# ---- in the test process
# -------------------------------------------------------------------------------------


def launch(work_dir: Path, world_size: int, runs: list, shapes: dict, train: dict) -> dict:
    """Run `runs` [(model, layout)] on `world_size` ranks, one per GPU; their results."""
    (work_dir / JOB_FILE).write_text(
        json.dumps({"runs": runs, "shapes": shapes, "train": train}), encoding="utf-8"
    )
    argv = [
        "-c",
        f"from pathlib import Path; from tests.gpu.test_parallel_gpu import rank_entry; "
        f"rank_entry(Path({str(work_dir)!r}))",
    ]
    if world_size == 1:
        subprocess.run(
            [sys.executable, *argv],
            env=rank_environment(0, 1, free_port(), os.cpu_count() or 1),
            check=True,
            cwd=REPO,
            timeout=1200,
        )
    else:
        run_ranks(argv, world_size, ClusterConfig(), work_dir / f"rank_logs-{world_size}")
    return json.loads((work_dir / f"results-{world_size}.json").read_text(encoding="utf-8"))


def write_initial_models(work_dir: Path, shapes: dict) -> None:
    for model, shape in shapes.items():
        torch.manual_seed(11)
        save_checkpoint(Transformer(ModelConfig(**shape)), work_dir / f"init-{model}")


def layouts_to_run(gpus: int) -> list[tuple[int, int, int]]:
    return [layout for world, layouts in LAYOUTS.items() if world <= gpus for layout in layouts]


def table(results: dict) -> str:
    lines = [
        "| model | layout (tp x pp x dp) | losses | max relative difference from 1 GPU | step time "
        "(s, last) |",
        "|---|---|---|---:|---:|",
    ]
    for key, run in results.items():
        model, layout = key.split(" ", 1)
        single = results[f"{model} (1, 1, 1)"]["losses"]
        diff = max(abs(a - b) / abs(b) for a, b in zip(run["losses"], single))
        lines.append(
            f"| {model} | {'x'.join(layout.strip('()').split(', '))} | "
            f"{', '.join(f'{loss:.5f}' for loss in run['losses'])} | {diff:.2e} | "
            f"{run['step_seconds'][-1]:.3f} |"
        )
    return "\n".join(lines)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    work_dir = tmp_path_factory.mktemp("parallel_gpu")
    write_initial_models(work_dir, SHAPES)
    results = {}
    with pytest.MonkeyPatch.context() as patch:  # the ranks import this module
        patch.setenv("PYTHONPATH", repo_pythonpath())
        results.update(launch(work_dir, 1, [(model, (1, 1, 1)) for model in SHAPES], SHAPES, TRAIN))
        for world, layouts in LAYOUTS.items():
            if world <= GPUS:
                runs = [(model, layout) for model in SHAPES for layout in layouts]
                results.update(launch(work_dir, world, runs, SHAPES, TRAIN))
    out = os.environ.get("PARALLEL_GPU_RESULTS")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "layouts.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
        (Path(out) / "layouts.md").write_text(table(results) + "\n", encoding="utf-8")
    return results


@pytest.mark.parametrize("model", sorted(SHAPES))
@pytest.mark.parametrize(
    "layout", layouts_to_run(GPUS), ids=lambda layout: "x".join(map(str, layout))
)
def test_every_layout_trains_like_one_gpu(trained, model, layout):
    single = trained[f"{model} (1, 1, 1)"]["losses"]
    assert len(single) == TRAIN["steps"] and all(np.isfinite(single))
    assert single[-1] < single[0], "one GPU's loss did not move: the comparison would say nothing"
    run = trained[f"{model} {layout}"]["losses"]
    assert run[0] == pytest.approx(single[0], rel=FIRST_STEP_TOLERANCE)
    assert run == pytest.approx(single, rel=TOLERANCE)
