"""The DeepSpeed pipeline engine for a training stage: layout, frozen parts, optimizer, precision.

Parameters that a stage does not train get `requires_grad=False` and stay out of the optimizer. A
pipeline stage that trains nothing at all (a frozen body in the middle of the pipeline) would give
DeepSpeed's optimizer an empty parameter list, which it refuses (DeepSpeed #5071), and ZeRO's
collectives need every rank (#1522): such a stage holds one unused scalar, `idle_anchor`, that the
optimizer owns; its gradient stays zero, so it never moves and the stage takes part in every
collective like the others. It is not part of the model and is never saved.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Callable

import deepspeed
import torch
from deepspeed.accelerator import get_accelerator
from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

from pipeline.model.model_config import ModelConfig
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.parallel.deepspeed_internals import (
    broadcast_eval_loss_in_one_shape,
    grad_norm_in_few_launches,
    holds_first_layer,
    import_muon_uncompiled,
    leave_out_overflow_scan,
    pipeline_messages_in_their_own_group,
    scale_leading_row_steps,
    skip_cpu_shared_memory_collective,
)
from pipeline.parallel.pipeline_model import local_layers, pipeline_module
from pipeline.parallel.ranks import bound_collectives
from pipeline.training.train_config import TrainConfig, lr_factor, use_bf16
from pipeline.training.job import VOCABULARY_MATRICES
from pipeline.training.weights import load_layers

log = logging.getLogger(__name__)


def init_distributed(collective_timeout_s: float) -> None:
    """This rank's process group; a collective that waits longer than `collective_timeout_s` fails
    with an error naming the rank and the operation (parallel.collective_timeout_s), in every group
    DeepSpeed makes from it."""
    device = None
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        skip_cpu_shared_memory_collective()
    timeout = bound_collectives(collective_timeout_s)
    # gloo on a CPU; NCCL (RCCL on ROCm) on GPUs.
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if int(os.environ.get("WORLD_SIZE", "1")) == 1:
        # One rank meets no other: an in-memory store, where a TCP one on a port picked beforehand
        # can lose that port to another stage starting on the same machine (EADDRINUSE). DeepSpeed
        # adopts the group. Its GPU named, so that NCCL need not guess it from the rank (and says so
        # in every log).
        torch.distributed.init_process_group(
            backend,
            store=torch.distributed.HashStore(),
            rank=0,
            world_size=1,
            timeout=timeout,
            device_id=device,
        )
    deepspeed.init_distributed(dist_backend=backend, timeout=timeout)


@dataclass
class Engine:
    engine: deepspeed.runtime.pipe.engine.PipelineEngine
    layers: list  # this stage's (transformer prefix, module)
    dp_rank: int
    dp_world: int


def build_engine(
    model_cfg: ModelConfig,
    train: TrainConfig,
    parallel: ParallelConfig,
    init_file,
    trainable: Callable[[str], bool],
    leading_rows: int = 0,
    leading_rows_step: float = 1.0,
    schedule_start: int = 0,
) -> Engine:
    """The engine over this rank's stage, its weights loaded from `init_file` (single-model names);
    the vocabulary rows below `leading_rows` of the trained embedding and head take optimizer steps
    `leading_rows_step` times the ones the learning rate gives, and with 0 no gradient at all: they
    stay as they are. The learning-rate schedule starts at step `schedule_start` (a continued run's
    first step) and ends at `train.steps`."""
    module, layers = _loaded_stage(model_cfg, train, parallel, init_file)
    trained = _trained_parameters(module, layers, trainable)
    vocabulary = (
        [
            parameter
            for prefix, layer in layers
            for name, parameter in layer.named_parameters()
            if parameter.requires_grad and prefix + name in VOCABULARY_MATRICES
        ]
        if leading_rows
        else []
    )
    optimizer, scheduler = _optimizer(train, trained, vocabulary, schedule_start)
    import_muon_uncompiled()
    if parallel.pp > 1:
        pipeline_messages_in_their_own_group()
    engine, *_ = deepspeed.initialize(
        model=module,
        optimizer=optimizer,
        lr_scheduler=scheduler,
        config=_deepspeed_config(train, parallel),
    )
    broadcast_eval_loss_in_one_shape(engine)
    leave_out_overflow_scan(engine)
    grad_norm_in_few_launches(engine)
    if vocabulary and leading_rows_step == 0:
        freeze_leading_rows(vocabulary, leading_rows)
    elif vocabulary and leading_rows_step != 1.0:
        scale_leading_row_steps(engine, vocabulary, leading_rows, leading_rows_step)
    grid = engine.grid
    return Engine(
        engine=engine,
        layers=layers,
        dp_rank=grid.get_data_parallel_rank(),
        dp_world=grid.get_data_parallel_world_size(),
    )


def _loaded_stage(model_cfg: ModelConfig, train: TrainConfig, parallel: ParallelConfig, init_file):
    """This rank's pipeline module and its (transformer prefix, module) layers, their weights read
    from `init_file`."""
    topology = PipeModelDataParallelTopology(
        num_pp=parallel.pp, num_mp=parallel.tp, num_dp=parallel.dp
    )
    torch.manual_seed(train.seed)
    # Tensor-parallel layers and loss when parallel.tp > 1 (pipeline/parallel/tensor_parallel.py).
    module = pipeline_module(
        model_cfg,
        parallel.pp,
        topology=topology,
        checkpoint_interval=train.activation_checkpoint_interval,
        sequence_parallel=parallel.sequence_parallel,
    )
    layers = local_layers(module, model_cfg)
    # Built on the meta device: only this rank's share (its stage, its tensor-parallel slices) is
    # ever allocated, then read from the file slice by slice.
    module.materialise(torch.device(get_accelerator().device_name(module.local_rank)))
    load_layers(layers, init_file)
    return module, layers


def _trained_parameters(
    module, layers: list, trainable: Callable[[str], bool]
) -> list[torch.nn.Parameter]:
    """Marks what trains (`requires_grad`) and returns it: what the optimizer owns (the idle anchor
    on a stage that trains nothing)."""
    first = holds_first_layer(module)
    for prefix, layer in layers:
        for name, parameter in layer.named_parameters():
            # The last stage's copy of a tied embedding trains only the shared matrix.
            shared_copy = prefix == "embedding." and not first and name != "tokens.weight"
            parameter.requires_grad_(trainable(prefix + name) and not shared_copy)
    trained = [p for p in module.parameters() if p.requires_grad]
    stage = module.stage_id
    if not trained:
        log.info(
            "pipeline stage %d trains no parameter (frozen body); it holds an idle anchor for the "
            "optimizer",
            stage,
        )
        module.idle_anchor = torch.nn.Parameter(torch.zeros(1))
        return [module.idle_anchor]
    log.info(
        "pipeline stage %d trains %s parameters", stage, f"{sum(p.numel() for p in trained):,}"
    )
    return trained


def _optimizer(train: TrainConfig, trained: list, undecayed: list, schedule_start: int):
    """AdamW over `trained`, weight decay on its matrices but `undecayed`, and the learning-rate
    schedule from step `schedule_start` to `train.steps`."""
    # A matrix with leading rows of their own has no weight decay: decay would shrink those rows at
    # every step, whatever their step size.
    left_out = {id(p) for p in undecayed}
    decay = [p for p in trained if p.dim() >= 2 and id(p) not in left_out]
    no_decay = [p for p in trained if p.dim() < 2 or id(p) in left_out]
    # Empty groups left out: ZeRO drops them, and the scheduler would then see fewer groups than it
    # made.
    groups = [
        group
        for group in (
            {"params": decay, "weight_decay": train.weight_decay},
            {"params": no_decay, "weight_decay": 0.0},
        )
        if group["params"]
    ]
    # fused: one kernel for the whole update on a GPU (CUDA or ROCm). The parameters are still on
    # the CPU here; DeepSpeed moves the module to the GPU and hands the optimizer its fp32 ZeRO
    # partitions there, and torch checks the devices only at the first step.
    optimizer = torch.optim.AdamW(
        groups,
        lr=train.lr,
        betas=(train.beta1, train.beta2),
        eps=train.eps,
        fused=True if torch.cuda.is_available() else None,
    )
    start, steps = schedule_start, train.steps
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: lr_factor(
            max(0, step - start),
            train.schedule,
            steps - start,
            train.warmup_steps,
            train.min_lr_ratio,
        ),
    )
    return optimizer, scheduler


def _deepspeed_config(train: TrainConfig, parallel: ParallelConfig) -> dict:
    return {
        "train_batch_size": train.global_batch_size,
        "train_micro_batch_size_per_gpu": train.micro_batch_size,
        "gradient_clipping": train.grad_clip,
        "zero_optimization": {"stage": 1},
        # check_grad_overflow: a non-finite gradient skips the step in bf16 too (fp32 always does).
        "bf16": {"enabled": use_bf16(train), "check_grad_overflow": True},
        "steps_per_print": 10**9,
        # DeepSpeed sends each tensor-parallel rank a tp-th of an activation between pipeline stages
        # and gathers the rest within the group, which takes the activation to be the same on every
        # rank of the group; with sequence parallelism each rank holds its own part of the sequence,
        # already a tp-th, sent whole.
        "pipeline": {
            "pipe_partitioned": not parallel.sequence_parallel,
            "grad_partitioned": not parallel.sequence_parallel,
        },
        "zero_allow_untested_optimizer": True,
    }


def freeze_leading_rows(matrices: list[torch.nn.Parameter], rows: int) -> None:
    """The rows below the global id `rows` of `matrices` (a tensor-parallel shard counts from its
    `tp_shard.start`) take no gradient: Adam, without weight decay on these matrices, leaves them as
    they are, bit for bit, and the global gradient norm does not count them. On every copy of a tied
    matrix, so that their sum is zero too."""
    for matrix in matrices:
        shard_start = matrix.tp_shard.start if hasattr(matrix, "tp_shard") else 0
        end = min(max(rows - shard_start, 0), matrix.shape[0])
        if end:
            matrix.register_hook(
                lambda grad, end=end: torch.cat([torch.zeros_like(grad[:end]), grad[end:]])
            )
