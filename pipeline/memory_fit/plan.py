"""A layout's plan: every pipeline stage's memory against the device, and LUMI's rules of thumb.

The smallest layout that fits, for a plan that does not: of those with as few model-parallel ranks,
the one the measured efficiencies of tensor and pipeline parallelism expect to train fastest."""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Optional

from pipeline.memory_fit.devices import Device
from pipeline.memory_fit.layout import Layout
from pipeline.memory_fit.memory import Numerics, StageMemory, stage_memory
from pipeline.model.model_config import ModelConfig, uneven_for_tensor_parallel


@dataclass(frozen=True)
class Rule:
    kept: bool
    text: str


@dataclass(frozen=True)
class Plan:
    model: ModelConfig
    layout: Layout
    numerics: Numerics
    device: Device
    usable_fraction: float
    stages: tuple[StageMemory, ...]

    @property
    def alternative_interval(self) -> int:
        """Activation checkpointing switched: off if it is on, every block if it is off."""
        return 0 if self.layout.checkpoint_interval else 1

    @functools.cached_property
    def alternative(self) -> tuple[StageMemory, ...]:
        """The stages with `alternative_interval`."""
        return _stages(self.model, self.layout, self.numerics, self.alternative_interval)

    @property
    def capacity(self) -> Optional[float]:
        """Bytes a rank may fill (None: the device's memory is not known)."""
        memory = self.device.memory_per_rank(self.layout.ranks)
        return None if memory is None else memory * self.usable_fraction

    @property
    def largest(self) -> StageMemory:
        return max(self.stages, key=lambda stage: stage.peak)

    @property
    def fits(self) -> bool:
        return self.capacity is None or self.largest.peak <= self.capacity

    def rules(self) -> list[Rule]:
        layout, device, hidden = self.layout, self.device, self.model.hidden_size
        rules = []
        if device.accelerator:
            per_node = f"{device.per_node} {device.label}s per node"
            within = device.per_node % layout.tp == 0
            rules.append(
                Rule(
                    within,
                    f"tp={layout.tp} within a node ({per_node})"
                    if within
                    else f"tp={layout.tp} spans nodes ({per_node}): its all-reduces in every layer "
                    "would cross "
                    f"the network; choose a tp that divides {device.per_node} and add pp",
                )
            )
        if device.min_hidden_per_tp:
            share, least = hidden // layout.tp, device.min_hidden_per_tp
            kept = share >= least
            rules.append(
                Rule(
                    kept,
                    f"hidden / tp = {hidden} / {layout.tp} = {share} {'>=' if kept else '<'} "
                    f"{least} "
                    f"on {device.label}"
                    + (
                        ""
                        if kept
                        else ": its matrix products are too small to keep the device busy; lower tp"
                    ),
                )
            )
        rules.append(
            Rule(
                True,
                f"dp x micro x accumulation = {layout.dp} x {layout.micro_batch} x "
                f"{layout.accumulation} = {layout.global_batch} = train.global_batch_size",
            )
        )
        return rules

    def keeps_rules(self) -> bool:
        return all(rule.kept for rule in self.rules())


def numerics_for(device: Device, precision: str, kernels: str) -> Numerics:
    """What the engine runs on `device` for train.precision and kernels (both `auto`: bf16 and
    Triton on a GPU, fp32 and the PyTorch references on a CPU)."""
    bf16 = precision == "bf16" or (precision == "auto" and device.accelerator)
    flash = kernels == "triton" or (kernels == "auto" and device.accelerator)
    return Numerics(value_bytes=2 if bf16 else 4, flash=flash, host=not device.accelerator)


def _stages(
    model: ModelConfig, layout: Layout, numerics: Numerics, interval: Optional[int] = None
) -> tuple[StageMemory, ...]:
    return tuple(
        stage_memory(model, layout, numerics, stage, interval) for stage in range(layout.pp)
    )


def make_plan(
    model: ModelConfig, layout: Layout, numerics: Numerics, device: Device, usable_fraction: float
) -> Plan:
    return Plan(
        model=model,
        layout=layout,
        numerics=numerics,
        device=device,
        usable_fraction=usable_fraction,
        stages=_stages(model, layout, numerics),
    )


def with_layout(plan: Plan, **changes) -> Plan:
    return make_plan(
        plan.model,
        dataclasses.replace(plan.layout, **changes),
        plan.numerics,
        plan.device,
        plan.usable_fraction,
    )


def tensor_parallel_choices(model: ModelConfig, device: Device) -> list[int]:
    """tp values that cut the heads, key/value heads and FFN evenly and, on GPUs, tile a node (a
    tensor-parallel group never straddles two nodes)."""
    return [
        tp
        for tp in range(1, model.num_kv_heads + 1)
        if not uneven_for_tensor_parallel(model, tp)
        and (not device.accelerator or device.per_node % tp == 0)
    ]


def _fits(plan: Plan, layout: Layout) -> bool:
    """Whether every stage of `layout` fits; the first and last stages, the usual peaks, are tried
    first."""
    capacity = plan.device.memory_per_rank(layout.ranks) * plan.usable_fraction
    order = dict.fromkeys([0, layout.pp - 1, *range(1, layout.pp - 1)])
    return all(
        stage_memory(plan.model, layout, plan.numerics, stage).peak <= capacity for stage in order
    )


# Training speed per GPU against one GPU, as measured on NVLink-connected H200s (BENCHMARKS.md,
# "Tensor parallelism at the shapes it is used for"): tensor parallelism kept 0.89 of two GPUs and
# 0.78 of four at a 7B model's width (hidden 4096, dense and packed rows alike), 0.80 of two at a
# 1.3B model's (hidden 2048). Each doubling of tp beyond those measured is taken to cost as much as
# the last one measured at that width. A pipeline of 2 kept 0.90 at 16 micro-batches (BENCHMARKS.md,
# "Several GPUs"), where its bubble alone would leave 0.94, so a stage boundary costs about 4%
# besides the bubble. These are NVLink figures, used for every device: an MI250X's links between
# GCDs are slower and were not measured, so there tensor parallelism likely keeps less.
# By the measured width (hidden size): the share kept at tp 2, 4, ...
TENSOR_PARALLEL_EFFICIENCY = {4096: (0.89, 0.78), 2048: (0.80,)}
PIPELINE_BOUNDARY_EFFICIENCY = 0.96


def measured_width(hidden_size: int) -> int:
    """The measured width whose tensor-parallel efficiency stands for this hidden size's: the widest
    one not above it (the narrowest for a narrower model)."""
    widths = sorted(TENSOR_PARALLEL_EFFICIENCY)
    return max((w for w in widths if w <= hidden_size), default=widths[0])


def tensor_parallel_efficiency(tp: int, hidden_size: int) -> float:
    """The share of `tp` single GPUs' speed that tensor parallelism of `tp` keeps at this width,
    geometric between the measured powers of two (tp=3, 6: between theirs)."""
    measured = (1.0, *TENSOR_PARALLEL_EFFICIENCY[measured_width(hidden_size)])

    def at(doublings: int) -> float:
        if doublings < len(measured):
            return measured[doublings]
        return measured[-1] * (measured[-1] / measured[-2]) ** (doublings + 1 - len(measured))

    doublings = math.log2(tp)
    below = math.floor(doublings)
    return at(below) * (at(below + 1) / at(below)) ** (doublings - below)


def expected_efficiency(layout: Layout, hidden_size: int) -> float:
    """The share of single-GPU speed per GPU that `layout` is expected to keep for a model of this
    hidden size (data parallelism kept 1.00 and is left out)."""
    tensor = tensor_parallel_efficiency(layout.tp, hidden_size)
    pipeline = (1 - layout.bubble) * (PIPELINE_BOUNDARY_EFFICIENCY if layout.pp > 1 else 1.0)
    return tensor * pipeline


def smallest_fitting(plan: Plan) -> Optional[Plan]:
    """The layout with the fewest model-parallel ranks (tp x pp) that fits, with the same dp,
    micro-batch and global batch, preferring one that keeps the rules of thumb (at any size), then,
    of as many ranks, the one expected to train fastest (expected_efficiency: a pipeline before
    tensor parallelism, as far as its bubble allows). Activation checkpointing of every block is
    tried only where nothing fits without it."""
    layout = plan.layout
    intervals = [layout.checkpoint_interval] + ([1] if layout.checkpoint_interval == 0 else [])
    choices = tensor_parallel_choices(plan.model, plan.device)
    kept = {
        tp: with_layout(plan, tp=tp, pp=1).keeps_rules() for tp in choices
    }  # the rules depend on tp alone
    for keeping_rules in (True, False):
        shapes = sorted(
            (
                (tp, pp)
                for tp in choices
                if kept[tp] or not keeping_rules
                for pp in range(1, plan.model.num_layers + 1)
            ),
            key=lambda shape: (
                shape[0] * shape[1],
                -expected_efficiency(
                    dataclasses.replace(layout, tp=shape[0], pp=shape[1]),
                    plan.model.hidden_size,
                ),
                shape[0],  # a tie goes to the pipeline
            ),
        )
        for interval in intervals:
            for tp, pp in shapes:
                candidate = dataclasses.replace(layout, tp=tp, pp=pp, checkpoint_interval=interval)
                if _fits(plan, candidate):
                    return with_layout(plan, tp=tp, pp=pp, checkpoint_interval=interval)
    return None
