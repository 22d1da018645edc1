"""The smallest layout that fits, for a plan that does not."""

from __future__ import annotations

import dataclasses
from typing import Optional

from pipeline.model.config import ModelConfig
from pipeline.memory_fit.devices import Device
from pipeline.memory_fit.layout import Layout
from pipeline.memory_fit.memory import stage_memory
from pipeline.memory_fit.plan import Plan, with_layout


def tensor_parallel_choices(model: ModelConfig, device: Device) -> list[int]:
    """tp values that cut the heads, key/value heads and FFN evenly and, on GPUs, tile a node (a tensor-parallel
    group never straddles two nodes)."""
    return [tp for tp in range(1, model.num_kv_heads + 1)
            if not (model.num_heads % tp or model.num_kv_heads % tp or model.ffn_size % tp)
            and (not device.accelerator or device.per_node % tp == 0)]


def _fits(plan: Plan, layout: Layout) -> bool:
    """Whether every stage of `layout` fits; the first and last stages, the usual peaks, are tried first."""
    capacity = plan.device.memory_per_rank(layout.ranks) * plan.usable_fraction
    order = dict.fromkeys([0, layout.pp - 1, *range(1, layout.pp - 1)])
    return all(stage_memory(plan.model, layout, plan.numerics, stage).peak <= capacity for stage in order)


def smallest_fitting(plan: Plan) -> Optional[Plan]:
    """The layout with the fewest model-parallel ranks (tp x pp) that fits, with the same dp, micro-batch and
    global batch, preferring one that keeps the rules of thumb (at any size), then the shorter pipeline (smaller
    bubble). Activation checkpointing of every block is tried only where nothing fits without it."""
    layout = plan.layout
    intervals = [layout.checkpoint_interval] + ([1] if layout.checkpoint_interval == 0 else [])
    choices = tensor_parallel_choices(plan.model, plan.device)
    kept = {tp: with_layout(plan, tp=tp, pp=1).keeps_rules() for tp in choices}  # the rules depend on tp alone
    for keeping_rules in (True, False):
        shapes = sorted(((tp, pp) for tp in choices if kept[tp] or not keeping_rules
                         for pp in range(1, plan.model.num_layers + 1)),
                        key=lambda shape: (shape[0] * shape[1], shape[1]))
        for interval in intervals:
            for tp, pp in shapes:
                candidate = dataclasses.replace(layout, tp=tp, pp=pp, checkpoint_interval=interval)
                if _fits(plan, candidate):
                    return with_layout(plan, tp=tp, pp=pp, checkpoint_interval=interval)
    return None
