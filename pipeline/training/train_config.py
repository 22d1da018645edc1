"""The typed `train` section (torch-free, so the command line checks them quickly).

Learning-rate schedules: a linear warm-up, then constant, cosine, linear or warmup-stable-decay."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.evaluation.eval_config import TEXT_SET_LAYOUTS, TaskConfig, task_name
from pipeline.parallel.parallel_config import ParallelConfig

PRECISIONS = ("auto", "bf16", "fp32")


@dataclass
class TrainConfig:
    """pretrain's budget and optimizer. The defaults are the recipe of continued pretraining from a
    real base (`model.base`), measured on SmolLM2-135M (docs/own-base-model.md, "Why these
    defaults"); without a base the demo recipe sets CPU-sized budgets
    (pipeline/conf/scale/demo.yaml)."""

    # Optimizer steps; null: what the mix planned, one pass of the pack (its tokens /
    # (global_batch_size x seq_len)). More than the plan is refused: raise the plan itself
    # (mix.tokens, mix.max_epochs) to train longer.
    steps: Optional[int] = None
    # Sequences per optimizer step over all data-parallel ranks, and per rank and forward pass;
    # gradient accumulation is global / (micro x dp). micro_batch_size null: the largest that fits
    # the device (the memory planner, pipeline/memory_fit: fitting_micro_batch), chosen when the
    # stage starts.
    global_batch_size: int = 64
    micro_batch_size: Optional[int] = None
    # Tokens per sequence; null: the model's context, at most 2048 (pipeline/model/model_config.py:
    # training_seq_len).
    seq_len: Optional[int] = None
    lr: float = 3e-4
    schedule: str = "cosine"
    # Steps of linear learning-rate warm-up; null: 2% of the steps (at least 1).
    warmup_steps: Optional[int] = None
    # The lowest learning rate of the decaying schedules, as a fraction of `lr`.
    min_lr_ratio: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    # On matrices only; norms and biases are never decayed.
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    # `auto`: bf16 on a GPU, fp32 on a CPU.
    precision: str = "auto"
    # Recompute the activations of every this many pipeline layers in the backward instead of
    # keeping them (less memory, about a third more compute); 0: keep them all.
    activation_checkpoint_interval: int = 0
    # The order of the training sequences (the pack sampler's seed) and of random initialisation.
    seed: int = 1
    log_every: int = 10
    # Held-out bits per byte every this many steps (and before the first and after the last); 0:
    # only those two.
    eval_every: int = 0
    # Cap on the held-out tokens scored each time.
    eval_tokens: int = 65536
    # Downstream tasks scored with the held-out text (eval.tasks entries by name, as the report names
    # them): multiple choice as stage=evaluate scores it, classification by its k-shot prompting;
    # their accuracies go to metrics.jsonl and the stage's report.
    eval_tasks: list[str] = field(default_factory=list)
    # A checkpoint every this many steps (0: only when Slurm signals), of which the newest
    # `keep_checkpoints` stay.
    checkpoint_every: int = 1000
    keep_checkpoints: int = 2
    # pretrain: keep the training state of the last step (the model, the optimizer's fp32 master
    # weights and moments, the data position: about 14 bytes per parameter) in final_state/ once it
    # is done, for a run that continues it (init=continue:<run>); false: removed with the other
    # checkpoints.
    keep_final_state: bool = True
    # Steps in a row with a non-finite loss or gradient (each skipped) before the run stops.
    max_bad_steps: int = 10
    # The run also stops when more than this fraction of the last `skipped_window` steps were
    # skipped.
    max_skipped_fraction: float = 0.1
    skipped_window: int = 100


def use_bf16(train: TrainConfig) -> bool:
    """Whether the engine holds the model in bf16 (with fp32 master weights of what it trains)."""
    import torch  # only when a run starts: the command line checks this section without torch

    return train.precision == "bf16" or (train.precision == "auto" and torch.cuda.is_available())


def validate_training(train: TrainConfig, parallel: ParallelConfig, prefix: str = "train") -> None:
    if train.steps is not None and train.steps < 1:
        raise ConfigError(
            f"{prefix}.steps", train.steps, ["null (one pass of the mix plan)", "an integer >= 1"]
        )
    for key in (
        "global_batch_size",
        "log_every",
        "eval_tokens",
        "keep_checkpoints",
        "max_bad_steps",
        "skipped_window",
    ):
        if getattr(train, key) < 1:
            raise ConfigError(f"{prefix}.{key}", getattr(train, key), ["an integer >= 1"])
    if train.micro_batch_size is None:
        if train.global_batch_size % parallel.dp:
            raise ConfigError(
                f"{prefix}.global_batch_size",
                train.global_batch_size,
                [f"a multiple of parallel.dp = {parallel.dp}"],
            )
    elif train.micro_batch_size < 1:
        raise ConfigError(
            f"{prefix}.micro_batch_size",
            train.micro_batch_size,
            ["null (the largest that fits the device)", "an integer >= 1"],
        )
    elif train.global_batch_size % (train.micro_batch_size * parallel.dp):
        per_step = train.micro_batch_size * parallel.dp
        raise ConfigError(
            f"{prefix}.global_batch_size",
            train.global_batch_size,
            [
                f"a multiple of {prefix}.micro_batch_size x parallel.dp = {train.micro_batch_size} "
                f"x {parallel.dp} = {per_step}"
            ],
        )
    if train.seq_len is not None and train.seq_len < 1:
        raise ConfigError(
            f"{prefix}.seq_len",
            train.seq_len,
            ["null (the model's context, at most 2048)", "an integer >= 1"],
        )
    if train.schedule not in SCHEDULES:
        raise ConfigError(f"{prefix}.schedule", train.schedule, SCHEDULES)
    if train.precision not in PRECISIONS:
        raise ConfigError(f"{prefix}.precision", train.precision, PRECISIONS)
    if not train.lr > 0:
        raise ConfigError(f"{prefix}.lr", train.lr, ["a positive number, e.g. 1e-4"])
    if not 0 <= train.max_skipped_fraction <= 1:
        raise ConfigError(
            f"{prefix}.max_skipped_fraction",
            train.max_skipped_fraction,
            ["a number in [0, 1], e.g. 0.1 (0: the first skipped step stops the run)"],
        )
    if not 0 <= train.min_lr_ratio <= 1:
        raise ConfigError(f"{prefix}.min_lr_ratio", train.min_lr_ratio, ["a number in [0, 1]"])
    if not (0 <= train.beta1 < 1 and 0 <= train.beta2 < 1):
        raise ConfigError(
            f"{prefix}.beta2" if train.beta1 < 1 else f"{prefix}.beta1",
            train.beta2 if train.beta1 < 1 else train.beta1,
            ["a number in [0, 1)"],
        )
    if train.warmup_steps is not None and train.warmup_steps < 0:
        raise ConfigError(
            f"{prefix}.warmup_steps",
            train.warmup_steps,
            ["null (2% of the steps)", "an integer >= 0"],
        )
    for key in ("eval_every", "checkpoint_every", "activation_checkpoint_interval"):
        if getattr(train, key) < 0:
            raise ConfigError(f"{prefix}.{key}", getattr(train, key), ["an integer >= 0"])


def validate_eval_tasks(names: list[str], tasks: list[TaskConfig], prefix: str = "train") -> None:
    """Each of `names` (train.eval_tasks) names a task of `tasks` (eval.tasks), once; a held-out set
    (flores200) is refused: the loop scores held-out bits per byte already."""
    configured = {task_name(task): task for task in tasks}
    for name in names:
        task = configured.get(name)
        if task is None:
            raise ConfigError(
                f"{prefix}.eval_tasks",
                name,
                [f"a task of eval.tasks by its name: {', '.join(configured) or 'none is set'}"],
            )
        if task.layout in TEXT_SET_LAYOUTS:
            raise ConfigError(
                f"{prefix}.eval_tasks",
                name,
                [
                    f"a downstream task: {name} ({task.layout}) is a held-out set scored in bits "
                    f"per byte, and {prefix} logs held-out bits per byte already (heldout_bpb)"
                ],
            )
    if len(set(names)) != len(names):
        raise ConfigError(f"{prefix}.eval_tasks", list(names), ["each task once"])


SCHEDULES = ("constant", "cosine", "linear", "wsd")


def lr_factor(
    step: int,
    schedule: str,
    steps: int,
    warmup_steps: int,
    min_lr_ratio: float,
    decay_fraction: float = 0.1,
) -> float:
    """The multiplier of the peak learning rate at `step` (0-based; step 0 is the first update)."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    span = max(1, steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))
    if schedule == "linear":
        return 1.0 - (1 - min_lr_ratio) * progress
    # wsd: stable at the peak, then a linear decay over the last `decay_fraction` of the steps.
    decay_start = steps - max(1, round(decay_fraction * steps))
    if step < decay_start:
        return 1.0
    return 1.0 - (1 - min_lr_ratio) * min(1.0, (step - decay_start) / max(1, steps - decay_start))
