"""The planner on a pipeline config: `stage=plan` prints it, `check_layout` refuses a pretrain
layout that cannot fit before any rank starts.

The plan as text: one row per pipeline stage (every rank of a stage holds the same), the step's
arithmetic, the verdict and the rules of thumb.
"""

from __future__ import annotations

import dataclasses
import logging

from pipeline.errors import StageError
from pipeline.memory_fit.devices import GIB, resolve_device
from pipeline.memory_fit.layout import Layout
from pipeline.memory_fit.plan import (
    PIPELINE_BOUNDARY_EFFICIENCY,
    Plan,
    expected_efficiency,
    make_plan,
    measured_width,
    numerics_for,
    smallest_fitting,
    tensor_parallel_efficiency,
    with_layout,
)
from pipeline.model.model_config import (
    ModelConfig,
    parameter_count,
    training_seq_len,
    uneven_for_tensor_parallel,
)
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.training.train_config import TrainConfig

log = logging.getLogger(__name__)


# The widest head the Triton attention kernels run (pipeline/kernels/launch_configs.py).
TRITON_HEAD_DIM = 128


class LayoutError(StageError):
    """A layout that cannot run: it does not fit the device, or does not fit the model's shape. The
    message says what to change."""


def _refuse_what_cannot_run(model: ModelConfig, tp: int, pp: int) -> None:
    uneven = uneven_for_tensor_parallel(model, tp)
    if uneven:
        raise LayoutError(
            f"parallel.tp={tp} does not divide the model's {', '.join(uneven)} "
            f"({', '.join(str(getattr(model, key)) for key in uneven)}): tensor parallelism gives "
            "each rank an equal share; choose a tp that divides them."
        )
    if pp > model.num_layers:
        raise LayoutError(
            f"parallel.pp={pp} is more pipeline stages than the model has blocks "
            f"({model.num_layers}): choose parallel.pp <= {model.num_layers}."
        )


def plan_for_config(
    cfg, model: ModelConfig | None = None, train: TrainConfig | None = None
) -> Plan:
    """The plan of a training section (default: pretrain's `cfg.train`; its micro-batch set) with
    cfg's parallel and kernels sections, for `model` (default: cfg.model)."""
    model = model or cfg.model
    train, parallel = train or cfg.train, cfg.parallel
    seq_len = training_seq_len(model, train.seq_len)
    _refuse_what_cannot_run(model, parallel.tp, parallel.pp)
    layout = Layout(
        tp=parallel.tp,
        pp=parallel.pp,
        dp=parallel.dp,
        micro_batch=train.micro_batch_size,
        accumulation=train.global_batch_size // (train.micro_batch_size * parallel.dp),
        seq_len=seq_len,
        checkpoint_interval=train.activation_checkpoint_interval,
    )
    device = resolve_device(cfg.plan, cfg.cluster.name, cfg.cluster.gpus_per_node)
    numerics = numerics_for(device, train.precision, cfg.kernels)
    if numerics.flash and model.head_dim > TRITON_HEAD_DIM:
        raise LayoutError(
            f"The model's heads are {model.head_dim} wide (model.head_size; Gemma's are 256), and "
            f"the Triton attention kernels take heads of up to {TRITON_HEAD_DIM} values: set "
            "kernels=reference (PyTorch attention: slower, and it holds each layer's scores)."
        )
    return make_plan(model, layout, numerics, device, cfg.plan.usable_fraction)


# A pipeline of pp stages idles (pp - 1) / (m + pp - 1) of its step with m micro-batches: a planned
# micro-batch keeps m >= 4 pp (a bubble of at most a fifth) where the global batch allows.
MICRO_BATCHES_PER_STAGE = 4
# The micro-batch where the device's memory is unknown.
UNKNOWN_MEMORY_MICRO_BATCH = 8


def fitting_micro_batch(
    cfg, train: TrainConfig, prefix: str = "train", model: ModelConfig | None = None
) -> TrainConfig:
    """The section with `micro_batch_size` null replaced by the largest micro-batch that fits the
    device (the planner's estimate, within plan.usable_fraction): of the divisors of
    global_batch_size / dp, the largest whose layout fits and, with pp > 1, leaves at least 4 pp
    micro-batches per step. A small model trains several times faster with a large micro-batch on a
    GPU (fewer, larger kernel launches); the result is the same model, as the micro-batch only cuts
    the global batch. A set micro-batch is returned as it is; where nothing fits, 1 (check_layout
    then refuses it with a layout that fits). `model`: as plan_for_config."""
    if train.micro_batch_size is not None:
        return train
    per_rank = train.global_batch_size // cfg.parallel.dp
    deep = [
        m
        for m in range(per_rank, 0, -1)
        if per_rank % m == 0
        and (cfg.parallel.pp == 1 or per_rank // m >= MICRO_BATCHES_PER_STAGE * cfg.parallel.pp)
    ] or [1]
    # The device, numerics and model are resolved once; each candidate changes the layout alone.
    plan = plan_for_config(cfg, model, train=dataclasses.replace(train, micro_batch_size=deep[-1]))
    if plan.capacity is None:
        micro = next(m for m in deep if m <= UNKNOWN_MEMORY_MICRO_BATCH)  # 1 is always among them
        log.warning(
            "%s.micro_batch_size=null: the memory of %s is unknown, so %d (set plan.device or "
            "plan.memory_gib to plan it, or %s.micro_batch_size).",
            prefix,
            plan.device.label,
            micro,
            prefix,
        )
        return dataclasses.replace(train, micro_batch_size=micro)
    candidates = (with_layout(plan, micro_batch=m, accumulation=per_rank // m) for m in deep)
    chosen = next((candidate for candidate in candidates if candidate.fits), None)
    if chosen is None:  # the smallest, 1: check_layout refuses it, naming a layout that fits
        return dataclasses.replace(train, micro_batch_size=deep[-1])
    micro = chosen.layout.micro_batch
    log.info(
        "%s.micro_batch_size=null: %d sequences per micro-batch, the largest of %s that fits (peak "
        "%.1f GiB "
        "per rank of %.1f GiB usable on %s).",
        prefix,
        micro,
        "/".join(map(str, deep)),
        chosen.largest.peak / GIB,
        plan.capacity / GIB,
        plan.device.label,
    )
    return dataclasses.replace(train, micro_batch_size=micro)


def node_filling_layout(cfg, per_node: int, sections: tuple[TrainConfig, ...]) -> ParallelConfig:
    """The layout that fills whole nodes of `per_node` GPUs for cfg's model (stage=workflow on a
    partition that gives whole nodes): the fewest tensor x pipeline ranks that fit the device, as
    stage=plan finds them (`smallest_fitting`, planned with micro-batches of one, at the
    data-parallel degree they leave room for), and the data-parallel ranks that fill the rest of the
    node, as many as divide every training section's global batch. A model that fits one GPU trains
    with dp = per_node; an unknown device memory leaves tp = pp = 1."""
    tp, pp = 1, 1
    while True:
        room = max(1, per_node // (tp * pp))
        dp = max(
            d
            for d in range(1, room + 1)
            if all(
                section.global_batch_size % (d * (section.micro_batch_size or 1)) == 0
                for section in sections
            )
        )
        # Planned from one rank per model at the dp that tp x pp ranks leave room for, so that the
        # layouts of as many ranks are compared at the micro-batches a step (bubble) they will run.
        one_rank = dataclasses.replace(cfg.parallel, tp=1, pp=1, dp=dp)
        trial = dataclasses.replace(cfg, parallel=one_rank)
        plan = plan_for_config(trial, train=dataclasses.replace(cfg.train, micro_batch_size=1))
        if plan.capacity is None or plan.fits:
            return one_rank
        found = smallest_fitting(plan)
        if found is None:
            # nothing fits: pretrain refuses it at start, naming what to change
            return dataclasses.replace(one_rank, tp=tp, pp=pp)
        if found.layout.tp * found.layout.pp <= tp * pp:
            return dataclasses.replace(one_rank, tp=found.layout.tp, pp=found.layout.pp)
        tp, pp = found.layout.tp, found.layout.pp


def refusal(plan: Plan) -> str:
    """Why `plan` does not fit, and the smallest layout that does (or what to change when none
    does)."""
    largest, capacity = plan.largest, plan.capacity
    message = (
        f"The layout {describe_layout(plan)} does not fit: pipeline stage {largest.stage} needs "
        f"{largest.peak / GIB:.1f} GiB per rank ({largest.phase}), more than the "
        f"{capacity / GIB:.1f} GiB "
        f"usable ({plan.usable_fraction:.0%} of the {plan.device.label}'s memory)."
    )
    found = smallest_fitting(plan)
    if found is None:
        return (
            f"{message} No layout with tp <= {plan.device.per_node} and pp <= "
            f"{plan.model.num_layers} fits at "
            f"this dp, micro-batch and sequence length, even with activation checkpointing: lower "
            "train.micro_batch_size or train.seq_len, or raise parallel.dp (ZeRO-1 divides the "
            "optimizer "
            f"state by it)."
        )
    layout = found.layout
    checkpointing = (
        f" train.activation_checkpoint_interval={layout.checkpoint_interval}"
        if layout.checkpoint_interval != plan.layout.checkpoint_interval
        else ""
    )
    return (
        f"{message} The smallest layout that fits with the same dp, micro-batch and global batch: "
        f"parallel.tp={layout.tp} parallel.pp={layout.pp}{checkpointing} ({layout.ranks} ranks, "
        f"about {expected_efficiency(layout, found.model.hidden_size):.2f} of one GPU's speed "
        f"per GPU; peak {found.largest.peak / GIB:.1f} GiB on stage {found.largest.stage}). "
        f"`python -m pipeline stage=plan ...` with the same options prints the table."
    )


def check_layout(cfg, train: TrainConfig | None = None, model: ModelConfig | None = None) -> Plan:
    """Refuse (LayoutError) a pretrain layout (`train`, default cfg.train, with its micro-batch set)
    that does not fit the device, naming the smallest one that does. An unknown device memory is not
    refused: it is logged."""
    plan = plan_for_config(cfg, model, train=train)
    for rule in plan.rules():
        if not rule.kept:
            log.warning("Layout rule of thumb: %s", rule.text)
    if plan.capacity is None:
        log.warning(
            "Memory of %s unknown: the layout is not checked (set plan.device or plan.memory_gib).",
            plan.device.label,
        )
    elif not plan.fits:
        raise LayoutError(refusal(plan))
    else:
        log.info(
            "Layout %s: peak %.1f GiB per rank of %.1f GiB usable.",
            describe_layout(plan),
            plan.largest.peak / GIB,
            plan.capacity / GIB,
        )
    return plan


def print_plan(cfg) -> None:
    """`stage=plan`: the table for the configured layout (with model.base, the command line has
    already given the model the base's shape); a layout that does not fit ends with the smallest
    that does, and a non-zero exit."""
    plan = plan_for_config(cfg, train=fitting_micro_batch(cfg, cfg.train))
    print(render(plan))
    if plan.capacity is None:
        raise LayoutError(
            f"The memory of {plan.device.label} is unknown: give plan.device (mi250x, h100, h200, "
            "cpu) "
            f"or plan.memory_gib=<GiB per device>."
        )
    if not plan.fits:
        raise LayoutError(refusal(plan))


_COLUMNS = (
    "stage",
    "blocks",
    "weights",
    "grads",
    "optimizer",
    "activations",
    "{other}",
    "head+loss",
    "buffers",
    "peak",
    "at",
    "of usable",
)


def _unit(largest: float) -> tuple[str, float]:
    return ("GiB", GIB) if largest >= GIB else ("MiB", 2**20)


def _checkpointing(interval: int) -> str:
    return (
        "no activation checkpointing"
        if interval == 0
        else f"activation checkpointing every {interval} block(s)"
    )


def describe_model(model: ModelConfig) -> str:
    heads = f"{model.num_heads} heads" + (
        f" / {model.num_kv_heads} key-value" if model.num_kv_heads != model.num_heads else ""
    )
    count = parameter_count(model)
    size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
    return (
        f"{size} parameters (hidden {model.hidden_size}, {model.num_layers} layers, {heads}, FFN "
        f"{model.ffn_size} "
        f"{model.activation}, vocabulary {model.vocab_size}, {model.position})"
    )


def describe_layout(plan: Plan) -> str:
    layout, device = plan.layout, plan.device
    where = device.label + (
        "" if device.accelerator else f" memory shared by {layout.ranks} rank(s)"
    )
    return f"{layout.describe()} = {layout.ranks} rank(s) on {where}"


# Above this share of a step (percent) the pipeline's idle time is worth more micro-batches per
# step: two H200 ran PP2 at 0.86 of two GPUs with m = 8 (bubble 11.1%) and at 0.90 with m = 16
# (5.9%) (BENCHMARKS.md, issue 28).
BUBBLE_PERCENT_WORTH_MORE_MICRO_BATCHES = 10


def _bubble_advice(layout: Layout) -> str:
    limit = BUBBLE_PERCENT_WORTH_MORE_MICRO_BATCHES
    if 100 * layout.bubble <= limit:
        return ""
    enough = -(
        -(layout.pp - 1) * (100 - limit) // limit
    )  # the least m with (pp - 1) / (m + pp - 1) <= limit
    return (
        f"; m >= {enough} micro-batches per step keep it within {limit}% (raise "
        "train.global_batch_size, or "
        f"lower train.micro_batch_size)"
    )


def _size(value: float, scale: float) -> str:
    return f"{value / scale:.2f}"


def _device_line(plan: Plan) -> str:
    """The device's memory per rank and how much of it the plan may fill."""
    device = plan.device
    memory = device.memory_per_rank(plan.layout.ranks)
    if memory is None:
        return (
            f"Device: {device.label}, memory unknown: give plan.device (mi250x, h100, h200, cpu) "
            "or "
            f"plan.memory_gib"
        )
    return (
        f"Device: {device.label}, {memory / GIB:.1f} GiB per rank; the plan may fill "
        f"{plan.usable_fraction:.0%} = {plan.capacity / GIB:.1f} GiB (plan.usable_fraction)"
    )


def _step_lines(plan: Plan) -> list[str]:
    """The step's arithmetic: its batch, the pipeline's bubble and the numerics."""
    layout, nx, hidden = plan.layout, plan.numerics, plan.model.hidden_size
    precision = "bf16" if nx.value_bytes == 2 else "fp32"
    attention = "FlashAttention (Triton)" if nx.flash else "reference attention (s x s softmax)"
    return [
        (
            f"Step: micro-batch {layout.micro_batch} x seq {layout.seq_len}; dp {layout.dp} x "
            f"micro {layout.micro_batch} "
            f"x accumulation {layout.accumulation} = global batch {layout.global_batch} = "
            f"{layout.tokens_per_step:,} "
            f"tokens"
        ),
        (
            f"Pipeline bubble: (pp - 1) / (m + pp - 1) = {layout.pp - 1} / "
            f"{layout.accumulation + layout.pp - 1} = "
            f"{layout.bubble:.1%}{_bubble_advice(layout)}"
        ),
        (
            f"Speed per GPU: about {expected_efficiency(layout, hidden):.2f} of one GPU's "
            f"(expected from what was measured at hidden {measured_width(hidden):,}: "
            f"tp={layout.tp} keeps {tensor_parallel_efficiency(layout.tp, hidden):.2f} of its "
            f"GPUs; a pipeline {PIPELINE_BOUNDARY_EFFICIENCY:.2f} besides its bubble; dp 1.00)"
        ),
        (
            f"Numerics: {precision} weights and gradients, fp32 master weights and Adam moments in "
            "ZeRO-1 partitions "
            f"over dp={layout.dp}, {attention}, {_checkpointing(layout.checkpoint_interval)}"
        ),
    ]


def _stage_table(plan: Plan, unit: str, scale: float) -> list[str]:
    """One row per pipeline stage under the unit's line, the columns aligned (the stage and the
    phase to the left, the numbers to the right)."""
    capacity = plan.capacity
    other = f"ckpt={plan.alternative_interval}" if plan.alternative_interval else "no ckpt"
    header = [column.format(other=f"act. {other}") for column in _COLUMNS]
    rows = []
    for stage, alternative in zip(plan.stages, plan.alternative):
        share = f"{stage.peak / capacity:.0%}" if capacity else "?"
        rows.append(
            [
                str(stage.stage),
                str(stage.blocks),
                _size(stage.weights, scale),
                _size(stage.gradients, scale),
                _size(stage.optimizer, scale),
                _size(stage.activations, scale),
                _size(alternative.activations, scale),
                _size(stage.loss, scale) if stage.loss else "-",
                _size(stage.buffers, scale),
                _size(stage.peak, scale),
                stage.phase,
                share,
            ]
        )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return [f"{unit} per rank"] + [
        "  ".join(
            cell.ljust(width) if i in (0, 10) else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(row, widths))
        ).rstrip()
        for row in [header, *rows]
    ]


def _verdict(plan: Plan, unit: str, scale: float) -> str:
    """Whether the largest peak fits the usable memory."""
    largest, capacity = plan.largest, plan.capacity
    peak = f"{_size(largest.peak, scale)} {unit}"
    if capacity is None:
        return (
            f"Unknown whether it fits: the largest peak is {peak} (stage {largest.stage}, "
            f"{largest.phase})."
        )
    if plan.fits:
        return (
            f"Fits: the largest peak, {peak} on stage {largest.stage} ({largest.phase}), is "
            f"{largest.peak / capacity:.0%} of the {capacity / GIB:.1f} GiB usable."
        )
    return (
        f"Does not fit: stage {largest.stage} peaks at {peak} ({largest.phase}), more than the "
        f"{capacity / GIB:.1f} GiB usable."
    )


def render(plan: Plan) -> str:
    """The plan as text: the layout, model and device, the step's arithmetic, a table of the
    stages' memory, the verdict and the rules of thumb."""
    unit, scale = _unit(max(stage.peak for stage in plan.stages))
    return "\n".join(
        [
            f"Plan: {describe_layout(plan)}",
            f"Model: {describe_model(plan.model)}",
            _device_line(plan),
            *_step_lines(plan),
            "",
            *_stage_table(plan, unit, scale),
            "",
            _verdict(plan, unit, scale),
            "Rules of thumb:",
            *(f"  {'ok' if rule.kept else '!!'}  {rule.text}" for rule in plan.rules()),
        ]
    )
