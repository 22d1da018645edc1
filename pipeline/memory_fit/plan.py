"""A layout's plan: every pipeline stage's memory against the device, and LUMI's rules of thumb."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Optional

from pipeline.model.config import ModelConfig
from pipeline.memory_fit.devices import Device
from pipeline.memory_fit.layout import Layout
from pipeline.memory_fit.memory import Numerics, StageMemory, stage_memory


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
            rules.append(Rule(within, f"tp={layout.tp} within a node ({per_node})" if within else
                              f"tp={layout.tp} spans nodes ({per_node}): its all-reduces in every layer would cross "
                              f"the network; choose a tp that divides {device.per_node} and add pp"))
        if device.min_hidden_per_tp:
            share, least = hidden // layout.tp, device.min_hidden_per_tp
            kept = share >= least
            rules.append(Rule(kept, f"hidden / tp = {hidden} / {layout.tp} = {share} {'>=' if kept else '<'} {least} "
                                    f"on {device.label}" + ("" if kept else
                                    ": its matrix products are too small to keep the device busy; lower tp")))
        rules.append(Rule(True, f"dp x micro x accumulation = {layout.dp} x {layout.micro_batch} x "
                                f"{layout.accumulation} = {layout.global_batch} = train.global_batch_size"))
        return rules

    def keeps_rules(self) -> bool:
        return all(rule.kept for rule in self.rules())


def numerics_for(device: Device, precision: str, kernels: str) -> Numerics:
    """What the engine runs on `device` for train.precision and kernels (both `auto`: bf16 and Triton on a GPU,
    fp32 and the PyTorch references on a CPU)."""
    bf16 = precision == "bf16" or (precision == "auto" and device.accelerator)
    flash = kernels == "triton" or (kernels == "auto" and device.accelerator)
    return Numerics(value_bytes=2 if bf16 else 4, flash=flash, host=not device.accelerator)


def _stages(model: ModelConfig, layout: Layout, numerics: Numerics,
            interval: Optional[int] = None) -> tuple[StageMemory, ...]:
    return tuple(stage_memory(model, layout, numerics, stage, interval) for stage in range(layout.pp))


def make_plan(model: ModelConfig, layout: Layout, numerics: Numerics, device: Device,
              usable_fraction: float) -> Plan:
    return Plan(model=model, layout=layout, numerics=numerics, device=device, usable_fraction=usable_fraction,
                stages=_stages(model, layout, numerics))


def with_layout(plan: Plan, **changes) -> Plan:
    return make_plan(plan.model, dataclasses.replace(plan.layout, **changes), plan.numerics, plan.device,
                     plan.usable_fraction)
