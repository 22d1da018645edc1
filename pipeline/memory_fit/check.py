"""The planner on a pipeline config: `stage=plan` prints it, `check_layout` refuses a pretrain layout that cannot
fit before any rank starts."""

from __future__ import annotations

import logging

from pipeline.errors import StageError
from pipeline.model.config import ModelConfig, training_seq_len
from pipeline.memory_fit.devices import GIB, resolve_device
from pipeline.memory_fit.layout import Layout
from pipeline.memory_fit.plan import Plan, make_plan, numerics_for
from pipeline.memory_fit.report import describe_layout, render
from pipeline.memory_fit.search import smallest_fitting

log = logging.getLogger(__name__)


class LayoutError(StageError):
    """A layout that cannot run: it does not fit the device, or does not fit the model's shape. The message says
    what to change."""


def _refuse_what_cannot_run(model: ModelConfig, tp: int, pp: int, seq_len: int, seq_len_given: bool) -> None:
    if model.sliding_window is not None and seq_len > model.sliding_window:
        source = (f"train.seq_len={seq_len}" if seq_len_given
                  else f"train.seq_len=null takes {seq_len}")
        raise LayoutError(f"{source}, longer than the model's attention window (model.sliding_window="
                          f"{model.sliding_window}), which the attention kernels do not implement: set "
                          f"train.seq_len={model.sliding_window} or less.")
    uneven = [key for key in ("num_heads", "num_kv_heads", "ffn_size") if getattr(model, key) % tp]
    if uneven:
        raise LayoutError(f"parallel.tp={tp} does not divide the model's {', '.join(uneven)} "
                          f"({', '.join(str(getattr(model, key)) for key in uneven)}): tensor parallelism gives each "
                          f"rank an equal share; choose a tp that divides them.")
    if pp > model.num_layers:
        raise LayoutError(f"parallel.pp={pp} is more pipeline stages than the model has blocks ({model.num_layers}): "
                          f"choose parallel.pp <= {model.num_layers}.")


def plan_for_config(cfg, model: ModelConfig | None = None) -> Plan:
    """The plan of the `pretrain` training section (train, parallel, kernels) for `model` (default: cfg.model)."""
    model = model or cfg.model
    train, parallel = cfg.train, cfg.parallel
    seq_len = training_seq_len(model, train.seq_len)
    _refuse_what_cannot_run(model, parallel.tp, parallel.pp, seq_len, train.seq_len is not None)
    layout = Layout(tp=parallel.tp, pp=parallel.pp, dp=parallel.dp, micro_batch=train.micro_batch_size,
                    accumulation=train.global_batch_size // (train.micro_batch_size * parallel.dp), seq_len=seq_len,
                    checkpoint_interval=train.activation_checkpoint_interval)
    device = resolve_device(cfg.plan, cfg.cluster.name, cfg.cluster.gpus_per_node)
    return make_plan(model, layout, numerics_for(device, train.precision, cfg.kernels), device,
                     cfg.plan.usable_fraction)


def refusal(plan: Plan) -> str:
    """Why `plan` does not fit, and the smallest layout that does (or what to change when none does)."""
    largest, capacity = plan.largest, plan.capacity
    message = (f"The layout {describe_layout(plan)} does not fit: pipeline stage {largest.stage} needs "
               f"{largest.peak / GIB:.1f} GiB per rank ({largest.phase}), more than the {capacity / GIB:.1f} GiB "
               f"usable ({plan.usable_fraction:.0%} of the {plan.device.label}'s memory).")
    found = smallest_fitting(plan)
    if found is None:
        return (f"{message} No layout with tp <= {plan.device.per_node} and pp <= {plan.model.num_layers} fits at "
                f"this dp, micro-batch and sequence length, even with activation checkpointing: lower "
                f"train.micro_batch_size or train.seq_len, or raise parallel.dp (ZeRO-1 divides the optimizer "
                f"state by it).")
    layout = found.layout
    checkpointing = (f" train.activation_checkpoint_interval={layout.checkpoint_interval}"
                     if layout.checkpoint_interval != plan.layout.checkpoint_interval else "")
    return (f"{message} The smallest layout that fits with the same dp, micro-batch and global batch: "
            f"parallel.tp={layout.tp} parallel.pp={layout.pp}{checkpointing} ({layout.ranks} ranks; peak "
            f"{found.largest.peak / GIB:.1f} GiB on stage {found.largest.stage}). "
            f"`python -m pipeline stage=plan ...` with the same options prints the table.")


def check_layout(cfg) -> Plan:
    """Refuse (LayoutError) a pretrain layout that does not fit the device, naming the smallest one that does.
    An unknown device memory is not refused: it is logged."""
    plan = plan_for_config(cfg)
    for rule in plan.rules():
        if not rule.kept:
            log.warning("Layout rule of thumb: %s", rule.text)
    if plan.capacity is None:
        log.warning("Memory of %s unknown: the layout is not checked (set plan.device or plan.memory_gib).",
                    plan.device.label)
    elif not plan.fits:
        raise LayoutError(refusal(plan))
    else:
        log.info("Layout %s: peak %.1f GiB per rank of %.1f GiB usable.", describe_layout(plan),
                 plan.largest.peak / GIB, plan.capacity / GIB)
    return plan


def print_plan(cfg) -> None:
    """`stage=plan`: the table for the configured layout (with model.base, the command line has already given the
    model the base's shape); a layout that does not fit ends with the smallest that does, and a non-zero exit."""
    plan = plan_for_config(cfg)
    print(render(plan))
    if plan.capacity is None:
        raise LayoutError(f"The memory of {plan.device.label} is unknown: give plan.device (mi250x, h100, h200, cpu) "
                          f"or plan.memory_gib=<GiB per device>.")
    if not plan.fits:
        raise LayoutError(refusal(plan))
