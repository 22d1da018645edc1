"""The typed `plan` section: which device a layout is planned against (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.memory_fit.devices import DEVICE_CHOICES


@dataclass
class PlanConfig:
    # `auto`: the cluster's device (cluster=lumi: an MI250X GCD), else an NVIDIA GPU the driver
    # lists, else this host's memory shared by the CPU ranks; or a name: mi250x, h100, h200, cpu.
    device: str = "auto"
    # Memory of one device in GiB, replacing the table's (another GPU, or a share of one).
    memory_gib: Optional[float] = None
    # Share of the device memory that the plan may fill. The rest is for what the planner does not
    # count: the GPU runtime's context, NCCL/RCCL buffers, and the allocator's fragmentation.
    usable_fraction: float = 0.9


def validate_plan(plan: PlanConfig) -> None:
    if plan.device not in DEVICE_CHOICES:
        raise ConfigError("plan.device", plan.device, DEVICE_CHOICES)
    if plan.memory_gib is not None and not plan.memory_gib > 0:
        raise ConfigError(
            "plan.memory_gib",
            plan.memory_gib,
            ["null (the device table's)", "a positive number of GiB"],
        )
    if not 0 < plan.usable_fraction <= 1:
        raise ConfigError(
            "plan.usable_fraction", plan.usable_fraction, ["a number in (0, 1], e.g. 0.9"]
        )
