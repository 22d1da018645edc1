"""Tensor parallelism (pipeline/parallel/tensor_parallel.py) on real gloo process groups and
DeepSpeed's engine.

Two ranks check every parallel layer against the full layer it was cut from (forward and gradients);
then the tiny ALiBi (BLOOM-style: tied head, biases, embedding LayerNorm) and RoPE (Llama-style:
GQA, untied head) models train 5 steps on the real engine with every parameter trainable and
gradient clipping active, as one process and as TP-only, PP-only, DP-only (2 ranks) and TP=2 x PP=2
x DP=2 (8 ranks), the tensor-parallel layouts also with sequence parallelism, the fused head's
tokens cut into several chunks: losses, global gradient norms and the saved full weights must agree
(on one stage a block leaves its MLP's output to the next layer to add; a stage's last layer adds
its own), and each gradient norm must be the one DeepSpeed's own loop takes; in bf16 over two
data-parallel ranks, a non-finite gradient on one rank skips the step on both. The rank entries
below run in the ranks that `pipeline.parallel.ranks` starts; each launch runs all of its layouts
one after the other, to start as few processes as possible.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from pipeline.cluster import ClusterConfig
from pipeline.errors import ConfigError
from pipeline.model.model_config import ModelConfig
from pipeline.model.files import save_checkpoint
from pipeline.model.model_tensors import CHECKPOINT_WEIGHTS
from pipeline.model.transformer import Transformer
from pipeline.parallel.parallel_config import ParallelConfig, check_tensor_parallel
from pipeline.parallel.ranks import run_ranks
from pipeline.training.train_config import TrainConfig
from tests.conftest import ranks_from_server, repo_pythonpath

# The vocabulary (300) is padded to 384 (3 x 128) alone and to 512 (2 x 2 x 128) under TP=2: rank
# 1's shard holds real ids, the model's padding rows and the extra tensor-parallel padding.
MODELS = {
    "alibi": ModelConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=4,
        ffn_size=64,
        vocab_size=300,
        position="alibi",
        norm="layernorm",
        activation="gelu",
        embedding_norm=True,
        bias=True,
        tie_embeddings=True,
        max_seq_len=32,
    ),
    "rope": ModelConfig(
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        ffn_size=64,
        vocab_size=300,
        position="rope",
        norm="rmsnorm",
        activation="swiglu",
        tie_embeddings=False,
        max_seq_len=32,
    ),
}
# grad_clip far below the gradients' norm (asserted), so every step is clipped with the global norm.
# Leading rows of the embedding in the tensor-parallel checks: more than the first shard's 256 of
# the 300 rows (padded to 512).
LEADING_ROWS = 280
TRAIN = TrainConfig(
    steps=5,
    global_batch_size=4,
    micro_batch_size=1,
    seq_len=16,
    lr=1e-2,
    schedule="cosine",
    warmup_steps=1,
    grad_clip=0.05,
    precision="fp32",
    seed=3,
)
# (tp, pp, dp, sequence parallelism)
SINGLE = (1, 1, 1, False)
LAYOUTS_OF_TWO = ((2, 1, 1, False), (1, 2, 1, False), (1, 1, 2, False), (2, 1, 1, True))
LAYOUTS_OF_EIGHT = ((2, 2, 2, False), (2, 2, 2, True))
# Runs that save a checkpoint after SAVED_STEPS steps in the first layout and resume it in the
# second: tensor, pipeline and data parallelism each changed (a tied embedding on two stages, then
# on one; a vocabulary padded for two shards, then for one), on the launches of 2 and 8 ranks.
SAVED_STEPS = 2
RESUMED_OF_TWO = {
    "alibi": ((1, 2, 1, False), (2, 1, 1, False)),
    "rope": ((2, 1, 1, False), (1, 1, 2, False)),
}
RESUMED_OF_EIGHT = {
    "alibi": ((2, 2, 2, False), (2, 1, 4, False)),
    "rope": ((2, 2, 2, False), (1, 2, 4, False)),
}
# The fused head's logits per chunk (128M in training): 4 rows of a 256-row vocabulary shard, so
# that each micro-batch's 16 tokens take several chunks, which every tensor-parallel rank must cut
# alike although rank 1's shard holds fewer real ids (issue 28).
CHUNK_LOGIT_ELEMENTS = 1024
# Far above what any collective here waits (seconds), far below the suite's patience: a hang fails
# the launch.
COLLECTIVE_TIMEOUT_S = 120
JOB_FILE = "job.json"


# ---- in the ranks
# -------------------------------------------------------------------------------------------


def _max_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The largest difference relative to the expected tensor's largest value, or to 1e-3 when that
    is smaller (the key bias's gradient is zero up to rounding: softmax ignores what it adds to a
    query's every score)."""
    return ((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-3)).item()


def _layer_errors() -> dict[str, float]:
    """Each parallel layer against the full layer it was built from, on the world group (2 ranks)."""
    import torch.distributed as dist

    from pipeline.parallel.pipeline_model import token_loss
    from pipeline.parallel.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        apply_tensor_parallel,
        copy_to_tensor_parallel,
        parameter_shards,
    )

    group, rank = dist.group.WORLD, dist.get_rank()
    errors = {}

    def compare(
        name: str,
        full: torch.nn.Module,
        parallel: torch.nn.Module,
        inputs: tuple,
        cut_input=lambda t: t,
        cut_output=lambda t: t,
    ) -> None:
        """This rank's part of the full output, of the input gradients and of every parameter
        gradient; the full tensors gathered back. Every rank draws the same random numbers, so
        `weights` agree."""
        full_inputs = [t.clone().requires_grad_() if t.is_floating_point() else t for t in inputs]
        local_inputs = [
            cut_input(t).clone().requires_grad_() if t.is_floating_point() else t for t in inputs
        ]
        expected = full(*full_inputs)
        weights = torch.randn_like(expected)
        (expected * weights).sum().backward()
        output = parallel(*local_inputs)
        (output * cut_output(weights)).sum().backward()
        errors[f"{name} forward"] = _max_error(output, cut_output(expected))
        for index, (whole, local) in enumerate(zip(full_inputs, local_inputs)):
            if whole.is_floating_point():
                errors[f"{name} input {index} grad"] = _max_error(local.grad, cut_input(whole.grad))
        full_parameters, shards = dict(full.named_parameters()), parameter_shards(parallel)
        for parameter_name, parameter in parallel.named_parameters():
            if not parameter.requires_grad:
                continue
            grad = full_parameters[parameter_name].grad
            errors[f"{name} {parameter_name} grad"] = _max_error(
                parameter.grad,
                shards[parameter_name].take(grad) if parameter_name in shards else grad,
            )
        gathered = {
            key: shards[key].gather(tensor) if key in shards else tensor  # as saving gathers them
            for key, tensor in parallel.state_dict().items()
        }
        for parameter_name, tensor in full.state_dict().items():
            errors[f"{name} {parameter_name} gathered"] = _max_error(
                gathered[parameter_name], tensor
            )

    class Entered(torch.nn.Module):
        """A layer whose input entered the tensor-parallel region first, as the attention's and the
        MLP's do."""

        def __init__(self, layer: torch.nn.Module, enter) -> None:
            super().__init__()
            self.layer, self.enter = layer, enter

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.layer(self.enter(x))

    torch.manual_seed(0)
    x = torch.randn(2, 5, 32)
    half = slice(rank * 24, (rank + 1) * 24)
    linear = torch.nn.Linear(32, 48)
    compare(
        "column-parallel",
        Entered(linear, lambda t: t),
        Entered(
            ColumnParallelLinear(copy.deepcopy(linear), group),
            lambda t: copy_to_tensor_parallel(t, group),
        ),
        (x,),
        cut_output=lambda t: t[..., half],
    )
    linear = torch.nn.Linear(48, 32)
    compare(
        "row-parallel",
        linear,
        RowParallelLinear(copy.deepcopy(linear), group),
        (torch.randn(2, 5, 48),),
        cut_input=lambda t: t[..., half],
    )
    ids = torch.tensor([[0, 5, 299, 150, 7], [298, 1, 2, 3, 200]])
    segments = torch.tensor([[0, 0, 0, 1, 1], [0, 1, 1, 1, 1]])
    shard = 256  # the vocabulary padded to 512 under TP=2
    vocab_shard = lambda t: F.pad(t, (0, 2 * shard - t.shape[-1]))[
        ..., rank * shard : (rank + 1) * shard
    ]
    for model, cfg in MODELS.items():
        torch.manual_seed(1)
        reference = Transformer(cfg)
        for index, block in enumerate(reference.blocks):
            compare(
                f"{model} block {index}",
                block,
                apply_tensor_parallel(copy.deepcopy(block), cfg, group),
                (x, segments),
            )
        frozen = copy.deepcopy(reference.blocks[0]).requires_grad_(
            False
        )  # as warmup trains: input gradients only
        compare(
            f"{model} frozen block",
            frozen,
            apply_tensor_parallel(copy.deepcopy(frozen), cfg, group),
            (x, segments),
        )
        compare(
            f"{model} embedding",
            reference.embedding,
            apply_tensor_parallel(copy.deepcopy(reference.embedding), cfg, group),
            (ids,),
        )
        if not cfg.tie_embeddings:
            padded_head = torch.nn.Linear(
                32, cfg.padded_vocab_size, bias=False
            )  # Head without its cut to vocab_size
            padded_head.weight = reference.head.weight
            compare(
                f"{model} head",
                padded_head,
                apply_tensor_parallel(copy.deepcopy(reference.head), cfg, group),
                (x,),
                cut_output=vocab_shard,
            )

    # Sequence parallelism: the same layers with this rank's half of the tokens in and out of the
    # tensor-parallel ones (all but the head's output, which is cut by vocabulary): its run of 6 of
    # the 3 x 4 tokens in (batch, position) order, which crosses from one sequence into the next, as
    # a (3, 2, ...) tensor.
    x = torch.randn(3, 4, 32)
    ids = torch.tensor([[0, 5, 299, 150], [7, 256, 298, 1], [2, 3, 200, 255]])
    segments = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])
    # noqa: E731
    sequence_part = lambda t: t.flatten(0, 1)[rank * 6 : (rank + 1) * 6].view(3, 2, *t.shape[2:])
    for model, cfg in MODELS.items():
        torch.manual_seed(1)
        reference = Transformer(cfg)
        for index, block in enumerate(reference.blocks):
            compare(
                f"{model} block {index} sequence-parallel",
                block,
                apply_tensor_parallel(copy.deepcopy(block), cfg, group, sequence_parallel=True),
                (x, segments),
                cut_input=sequence_part,
                cut_output=sequence_part,
            )
        compare(
            f"{model} embedding sequence-parallel",
            reference.embedding,
            apply_tensor_parallel(
                copy.deepcopy(reference.embedding), cfg, group, sequence_parallel=True
            ),
            (ids,),
            cut_output=sequence_part,
        )
        if not cfg.tie_embeddings:
            padded_head = torch.nn.Linear(32, cfg.padded_vocab_size, bias=False)
            padded_head.weight = reference.head.weight
            compare(
                f"{model} head sequence-parallel",
                padded_head,
                apply_tensor_parallel(
                    copy.deepcopy(reference.head), cfg, group, sequence_parallel=True
                ),
                (x,),
                cut_input=sequence_part,
                cut_output=vocab_shard,
            )

    # The fused head + cross-entropy from vocabulary shards (the training loss): padding ids in both
    # shards, targets on both, one ignored; chunks of 4 rows.
    vocab = 300
    hidden = torch.randn(2, 3, 32)
    weight = torch.randn(2 * shard, 32)
    weight[vocab:] = 0.0  # the padding rows
    targets = torch.tensor([[0, 255, 256], [299, -100, 17]])
    full_hidden, full_weight = (
        hidden.clone().requires_grad_(),
        weight[:vocab].clone().requires_grad_(),
    )
    expected = (
        F.cross_entropy(
            (full_hidden @ full_weight.t()).flatten(0, 1), targets.flatten(), reduction="sum"
        )
        / 6
    )
    expected.backward()
    local_hidden = hidden.clone().requires_grad_()
    local_weight = weight[rank * shard : (rank + 1) * shard].clone().requires_grad_()
    loss = token_loss(vocab, group)(
        (copy_to_tensor_parallel(local_hidden, group), local_weight), targets
    )
    loss.backward()
    errors["cross-entropy"] = _max_error(loss, expected)
    errors["cross-entropy hidden grad"] = _max_error(local_hidden.grad, full_hidden.grad)
    errors["cross-entropy weight grad"] = _max_error(
        local_weight.grad,
        F.pad(full_weight.grad, (0, 0, 0, 2 * shard - vocab))[rank * shard : (rank + 1) * shard],
    )
    return errors


def _batches(vocab_size: int, dp_rank: int, dp_world: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each step's sequences of this data-parallel rank (the same global batches for every layout),
    with a document boundary in each sequence."""
    generator = np.random.default_rng(TRAIN.seed)
    share = TRAIN.global_batch_size // dp_world
    steps = []
    for _ in range(TRAIN.steps):
        tokens = generator.integers(0, vocab_size, (TRAIN.global_batch_size, TRAIN.seq_len + 1))
        cut = generator.integers(1, TRAIN.seq_len, TRAIN.global_batch_size)
        segments = (np.arange(TRAIN.seq_len + 1)[None, :] >= cut[:, None]).astype(np.int64)
        part = slice(dp_rank * share, (dp_rank + 1) * share)
        steps.append((tokens[part], segments[part]))
    return steps


def layout_name(layout: tuple, resumed_at: Optional[tuple] = None) -> str:
    tp, pp, dp, sequence_parallel = layout
    name = f"tp{tp}-pp{pp}-dp{dp}{'-sp' if sequence_parallel else ''}"
    return name if resumed_at is None else f"{name}-resumed-at-{layout_name(resumed_at)}"


def _engine(model: str, layout: tuple, work_dir: Path):
    from pipeline.training.engine import build_engine

    tp, pp, dp, sequence_parallel = layout
    return build_engine(
        MODELS[model],
        TRAIN,
        ParallelConfig(tp=tp, pp=pp, dp=dp, sequence_parallel=sequence_parallel),
        work_dir / f"init-{model}" / CHECKPOINT_WEIGHTS,
        trainable=lambda _: True,
    )


def _compare_norms_with_deepspeeds_own(optimizer, both: list) -> None:
    """The engine's gradient norm (grad_norm_in_few_launches) beside DeepSpeed's own on the same
    gradients, appended to `both` at every step."""
    ours = optimizer.get_grad_norm_direct

    def with_deepspeeds_own(gradients, params, norm_type=2):
        norm = ours(gradients, params, norm_type)
        own = type(optimizer).get_grad_norm_direct(optimizer, gradients, params, norm_type)
        both.append((float(norm), float(own)))
        return norm

    optimizer.get_grad_norm_direct = with_deepspeeds_own


def _train(model: str, layout: tuple, work_dir: Path, resumed_at: Optional[tuple] = None) -> dict:
    """5 steps of the real engine with every parameter trainable; the trained model joined into one
    file. With `resumed_at`, the run saves a checkpoint after SAVED_STEPS steps and goes on from it
    in that layout."""
    import torch.distributed as dist

    from pipeline.parallel.tensor_parallel import SequenceParallelLayerNorm, SequenceParallelRMSNorm
    from pipeline.training import checkpoint
    from pipeline.training.heldout import micro_batches
    from pipeline.training.weights import join_parts, save_part

    name = f"{model}-{layout_name(layout, resumed_at)}"
    engine = _engine(model, layout, work_dir)
    losses, norms, both = [], [], []
    _compare_norms_with_deepspeeds_own(engine.engine.optimizer, both)
    for step in range(TRAIN.steps):
        if resumed_at is not None and step == SAVED_STEPS:
            saved = checkpoint.save(engine, work_dir / f"checkpoints-{name}", step, {}, keep=1)
            engine = _engine(model, resumed_at, work_dir)
            _compare_norms_with_deepspeeds_own(engine.engine.optimizer, both)
            checkpoint.load(engine, saved)
        ds = engine.engine
        tokens, segments = _batches(MODELS[model].vocab_size, engine.dp_rank, engine.dp_world)[step]
        losses.append(
            float(
                ds.train_batch(
                    iter(micro_batches(tokens, segments, TRAIN.micro_batch_size, ds.device))
                )
            )
        )
        norms.append(float(ds.get_global_grad_norm()))
    parts = work_dir / f"parts-{name}"
    parts.mkdir(exist_ok=True)
    if engine.dp_rank == 0:
        save_part(engine.layers, parts / f"stage{ds.grid.get_pipe_parallel_rank():03d}.safetensors")
    dist.barrier()
    if dist.get_rank() == 0:
        join_parts(
            sorted(parts.glob("stage*.safetensors")), work_dir / f"trained-{name}.safetensors"
        )
    sequence_parallel_norms = sum(
        isinstance(module, (SequenceParallelLayerNorm, SequenceParallelRMSNorm))
        for module in ds.module.modules()
    )
    # blocks of rank 0's stage that leave their MLP's output to the next layer to add (not the
    # stage's last block)
    handing_on = sum(getattr(module, "hands_on_owed", False) for module in ds.module.modules())
    return {
        "losses": losses,
        "grad_norms": norms,
        "norms_beside_deepspeeds": both,
        "sequence_parallel_norms": sequence_parallel_norms,
        "blocks_handing_on": handing_on,
    }


def _non_finite_gradient_skips_the_step(work_dir: Path) -> dict:
    """bf16 (the GPU's precision, run here on the CPU) over two data-parallel ranks: a step in which
    only rank 1's gradients are not finite is skipped on both, their weights unchanged, with
    DeepSpeed's overflow scan left out (the gradient norm decides); the steps before and after
    apply."""
    import dataclasses

    from pipeline.training.engine import build_engine
    from pipeline.training.heldout import micro_batches

    engine = build_engine(
        MODELS["alibi"],
        dataclasses.replace(TRAIN, precision="bf16"),
        ParallelConfig(dp=2),
        work_dir / "init-alibi" / CHECKPOINT_WEIGHTS,
        trainable=lambda _: True,
    )
    ds = engine.engine
    weights = lambda: [parameter.detach().clone() for parameter in ds.module.parameters()]
    applied, unchanged = [], None
    for step, (tokens, segments) in enumerate(
        _batches(MODELS["alibi"].vocab_size, engine.dp_rank, engine.dp_world)[:3]
    ):
        hook, before = None, weights()
        if step == 1 and engine.dp_rank == 1:
            hook = next(ds.module.parameters()).register_hook(lambda grad: grad * float("inf"))
        ds.train_batch(iter(micro_batches(tokens, segments, TRAIN.micro_batch_size, ds.device)))
        applied.append(ds.was_step_applied())
        if step == 1:
            unchanged = all(torch.equal(a, b) for a, b in zip(before, weights()))
        if hook is not None:
            hook.remove()
    return {
        "applied": applied,
        "unchanged": unchanged,
        "scan_left_out": "check_overflow" in vars(ds.optimizer),
    }


def _frozen_rows_stay_under_tensor_parallelism(work_dir: Path) -> dict:
    """The embedding alone trains over two tensor-parallel ranks with its first LEADING_ROWS rows
    frozen (warmup with warmup.base_rows=frozen): they cross the shards' boundary, so each shard
    keeps the part below it. Every rank's count of rows that moved, below and from LEADING_ROWS on,
    in its shard (padding rows left out)."""
    import torch.distributed as dist

    from pipeline.training.engine import build_engine
    from pipeline.training.heldout import micro_batches

    engine = build_engine(
        MODELS["rope"],
        TRAIN,
        ParallelConfig(tp=2),
        work_dir / "init-rope" / CHECKPOINT_WEIGHTS,
        trainable=lambda name: name.startswith("embedding.tokens."),
        leading_rows=LEADING_ROWS,
        leading_rows_step=0.0,
    )
    ds = engine.engine
    matrix = next(p for name, p in ds.module.named_parameters() if name.endswith("tokens.weight"))
    before = matrix.detach().clone()
    for tokens, segments in _batches(MODELS["rope"].vocab_size, engine.dp_rank, engine.dp_world)[
        :2
    ]:
        ds.train_batch(iter(micro_batches(tokens, segments, TRAIN.micro_batch_size, ds.device)))
    start = matrix.tp_shard.start
    ids = torch.arange(start, start + matrix.shape[0])
    moved = (matrix.detach() != before).any(dim=1)
    real = ids < MODELS["rope"].vocab_size  # the padding rows never move
    below = ids < LEADING_ROWS
    counts = {
        "start": start,
        "moved_below": int(moved[below].sum()),
        "moved_above": int(moved[~below & real].sum()),
        "rows_above": int((~below & real).sum()),
    }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, counts)
    return gathered


def _scaled_leading_row_steps(work_dir: Path) -> dict:
    """One step from the same start, by engines whose leading rows take whole steps and half steps
    (warmup.base_rows_lr at half the learning rate), under two tensor-parallel ranks (the leading
    rows cross the shards' boundary) and two data-parallel ranks (they cross the boundary of ZeRO's
    fp32 partitions). Per layout and rank: how far the half-step engine's moves are from half the
    other's below LEADING_ROWS and from the same above it, and how many rows below moved."""
    import torch.distributed as dist

    from pipeline.training.engine import build_engine
    from pipeline.training.heldout import micro_batches

    results = {}
    for layout in (ParallelConfig(tp=2), ParallelConfig(dp=2)):
        moves = {}
        for step in (1.0, 0.5):
            engine = build_engine(
                MODELS["rope"],
                TRAIN,
                layout,
                work_dir / "init-rope" / CHECKPOINT_WEIGHTS,
                trainable=lambda name: name.startswith("embedding.tokens."),
                leading_rows=LEADING_ROWS,
                leading_rows_step=step,
            )
            ds = engine.engine
            matrix = next(
                p for name, p in ds.module.named_parameters() if name.endswith("tokens.weight")
            )
            before = matrix.detach().clone()
            tokens, segments = _batches(MODELS["rope"].vocab_size, engine.dp_rank, engine.dp_world)[
                2
            ]
            ds.train_batch(iter(micro_batches(tokens, segments, TRAIN.micro_batch_size, ds.device)))
            moves[step] = matrix.detach() - before
            start = getattr(matrix, "tp_shard", None)
            below = (
                torch.arange(matrix.shape[0]) + (start.start if start is not None else 0)
                < LEADING_ROWS
            )
        whole, half = moves[1.0], moves[0.5]
        results[f"tp={layout.tp} dp={layout.dp}"] = {
            "below_error": float((half[below] - 0.5 * whole[below]).abs().max()),
            "above_error": float((half[~below] - whole[~below]).abs().max())
            if (~below).any()
            else 0.0,
            "moved_below": int((whole[below] != 0).any(dim=1).sum()),
        }
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, results)
    return gathered


def rank_entry(work_dir: Path) -> None:
    """Run the job of `job.json` (layer checks and/or layouts) on this launch's ranks; rank 0 writes
    results."""
    import torch.distributed as dist

    from pipeline.kernels import fused_head
    from pipeline.training.engine import init_distributed

    fused_head.CHUNK_LOGIT_ELEMENTS = CHUNK_LOGIT_ELEMENTS
    init_distributed(COLLECTIVE_TIMEOUT_S)
    job = json.loads((work_dir / JOB_FILE).read_text(encoding="utf-8"))
    results = {}
    if job.get("layer_checks"):
        results["layers"] = _layer_errors()
        results["non-finite step"] = _non_finite_gradient_skips_the_step(work_dir)
        results["frozen rows"] = _frozen_rows_stay_under_tensor_parallelism(work_dir)
        results["leading row steps"] = _scaled_leading_row_steps(work_dir)
    for model, layout, *resumed in job["runs"]:
        resumed_at = tuple(resumed[0]) if resumed else None
        results[f"{model} {layout_name(tuple(layout), resumed_at)}"] = _train(
            model, tuple(layout), work_dir, resumed_at
        )
    if dist.get_rank() == 0:
        (work_dir / f"results-{dist.get_world_size()}.json").write_text(
            json.dumps(results), encoding="utf-8"
        )
    dist.barrier()
    dist.destroy_process_group()
    # As pipeline/training/rank.py leaves: without the interpreter's teardown, seconds of 8 ranks on
    # 2 cores.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ---- in the test process
# -------------------------------------------------------------------------------------


def _launch(work_dir: Path, world_size: int, runs: list, layer_checks: bool = False) -> dict:
    (work_dir / JOB_FILE).write_text(
        json.dumps({"runs": runs, "layer_checks": layer_checks}), encoding="utf-8"
    )
    argv = [
        "-c",
        "from pathlib import Path; from tests.unit.parallel.test_tensor_parallel import "
        "rank_entry; "
        f"rank_entry(Path({str(work_dir)!r}))",
    ]
    with ranks_from_server():
        run_ranks(argv, world_size, ClusterConfig(), work_dir / "rank_logs")
    return json.loads((work_dir / f"results-{world_size}.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Every layout's losses, gradient norms and trained weights, from three launches (1, 2 and 8
    ranks)."""
    work_dir = tmp_path_factory.mktemp("tensor_parallel")
    for model, cfg in MODELS.items():
        torch.manual_seed(7)
        save_checkpoint(Transformer(cfg), work_dir / f"init-{model}")
    results = {}
    with pytest.MonkeyPatch.context() as patch:  # the ranks import this module
        patch.setenv("PYTHONPATH", repo_pythonpath())
        results.update(_launch(work_dir, 1, [(model, SINGLE) for model in MODELS]))
        results.update(
            _launch(
                work_dir,
                2,
                [(model, layout) for model in MODELS for layout in LAYOUTS_OF_TWO]
                + [(model, *layouts) for model, layouts in RESUMED_OF_TWO.items()],
                layer_checks=True,
            )
        )
        results.update(
            _launch(
                work_dir,
                8,
                [(model, layout) for model in MODELS for layout in LAYOUTS_OF_EIGHT]
                + [(model, *layouts) for model, layouts in RESUMED_OF_EIGHT.items()],
            )
        )
    return work_dir, results


def test_parallel_layers_match_the_full_layers_they_were_cut_from(trained):
    _, results = trained
    errors = results["layers"]
    assert len(errors) > 40
    assert {name: error for name, error in errors.items() if not error < 1e-5} == {}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_acceptance_every_layout_trains_like_one_process(trained, model):
    work_dir, results = trained
    single = results[f"{model} {layout_name(SINGLE)}"]
    assert len(single["losses"]) == TRAIN.steps
    assert min(single["grad_norms"]) > 10 * TRAIN.grad_clip  # clipping acts on every step
    reference = load_file(str(work_dir / f"trained-{model}-{layout_name(SINGLE)}.safetensors"))
    initial = load_file(str(work_dir / f"init-{model}" / CHECKPOINT_WEIGHTS))
    assert reference.keys() == initial.keys()
    for name, tensor in reference.items():
        assert not torch.equal(tensor, initial[name]), f"{name} did not train"
    parallel = [(layout, None) for layout in (*LAYOUTS_OF_TWO, *LAYOUTS_OF_EIGHT)]
    parallel += [RESUMED_OF_TWO[model], RESUMED_OF_EIGHT[model]]
    for layout, resumed_at in [(SINGLE, None), *parallel]:
        name, last = layout_name(layout, resumed_at), resumed_at or layout
        # every step's norm of each parameter group as DeepSpeed's own per-tensor loop takes it
        # (each stage, the replicated tied copy)
        run = results[f"{model} {name}"]
        # two blocks: on one stage each hands its MLP's output on (the second to the final norm);
        # over two stages the first stage's block adds its own
        assert run["blocks_handing_on"] == (2 if last[1] == 1 else 0), name
        pairs = run["norms_beside_deepspeeds"]
        assert len(pairs) >= TRAIN.steps and all(
            ours == pytest.approx(own, rel=1e-6) for ours, own in pairs
        ), pairs
    for layout, resumed_at in parallel:
        name, last = layout_name(layout, resumed_at), resumed_at or layout
        run = results[f"{model} {name}"]
        # rank 0's stage: at least the first block's norms (and the embedding's) work on sequence
        # parts
        assert (run["sequence_parallel_norms"] > 0) == last[3], name
        # A resumed run's steps after the checkpoint take the saved weights, Adam's moments and the
        # schedule's place: the losses and norms of the run that never stopped.
        assert run["losses"] == pytest.approx(single["losses"], rel=1e-5), name
        assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-5), name
        weights = load_file(str(work_dir / f"trained-{model}-{name}.safetensors"))
        assert weights.keys() == reference.keys()
        for key, tensor in weights.items():
            assert tensor.shape == reference[key].shape
            if key.endswith("attn.k.bias"):
                # its gradient is rounding noise (softmax ignores it), which Adam turns into full
                # steps
                continue
            # Adam also makes full steps of a few near-zero gradient elements, so the whole tensor
            # is compared: its difference must be tiny next to how far training moved it (a wrongly
            # cut tensor gives ~1).
            moved = (reference[key] - initial[key]).norm()
            assert (tensor - reference[key]).norm() < 1e-3 * moved, f"{key} after {name}"


def test_a_non_finite_gradient_on_one_rank_skips_the_step_on_every_rank_in_bf16(trained):
    _, results = trained
    assert results["non-finite step"] == {
        "applied": [True, False, True],
        "unchanged": True,
        "scan_left_out": True,
    }


def test_the_frozen_vocabulary_rows_stay_on_each_tensor_parallel_shard_and_the_others_train(
    trained,
):
    _, results = trained
    first, second = results["frozen rows"]
    assert (
        first["start"] == 0 < LEADING_ROWS - second["start"]
    )  # the frozen rows reach into the second shard
    assert first["moved_below"] == second["moved_below"] == 0
    # the rows above train (an input row moves when its token is in a batch)
    assert (
        first["rows_above"] == 0
        and 0 < second["moved_above"] <= second["rows_above"] == 300 - LEADING_ROWS
    )


def test_leading_vocabulary_rows_take_scaled_steps_across_shards_and_zero_partitions(trained):
    _, results = trained
    for rank in results["leading row steps"]:
        for layout, moves in rank.items():
            assert moves["moved_below"] > 0, layout
            assert moves["below_error"] < 1e-7 and moves["above_error"] < 1e-7, (layout, moves)


def test_multi_query_attention_cannot_be_cut_across_ranks():
    mqa = ModelConfig(num_heads=4, num_kv_heads=1)
    with pytest.raises(ConfigError, match=r"model\.num_kv_heads.*parallel\.tp=2"):
        check_tensor_parallel(mqa, 2)
    with pytest.raises(ConfigError, match=r"model\.ffn_size.*parallel\.tp=4"):
        check_tensor_parallel(ModelConfig(num_heads=4, num_kv_heads=4, ffn_size=66), 4)
    check_tensor_parallel(mqa, 1)
    check_tensor_parallel(MODELS["rope"], 2)
