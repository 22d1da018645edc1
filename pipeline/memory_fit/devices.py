"""The devices a layout is planned against: memory per rank, devices per node, and how the engine
runs there.

A rank of the training stages runs on one GPU (one MI250X GCD on LUMI) in bf16 with the Triton
kernels, or, on a machine without GPU, as a CPU process in float32 with the PyTorch reference
kernels; CPU ranks share the host's memory. `resolve_device` reads nothing but small files of the
driver and the kernel, so that the command line needs no torch to answer.
"""

from __future__ import annotations

import dataclasses
import glob
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

GIB = 2**30


@dataclass(frozen=True)
class Device:
    name: str
    # For people: "MI250X GCD".
    label: str
    # What one device holds, in GiB; None where it is not known (an unlisted GPU).
    memory_gib: Optional[float]
    # False: the ranks are CPU processes that share `memory_gib` (the host's memory).
    accelerator: bool = True
    # Devices per node: tensor parallelism stays within one (its all-reduces run in every layer).
    per_node: int = 8
    # LUMI's rule of thumb for MI250X: below this hidden size per tensor-parallel rank, the matrix
    # multiplications are too small to keep a GCD busy.
    min_hidden_per_tp: Optional[int] = None

    def memory_per_rank(self, ranks: int) -> Optional[float]:
        """Bytes one of `ranks` ranks may use: a whole GPU, or its share of the host's memory."""
        if self.memory_gib is None:
            return None
        return self.memory_gib * GIB / (1 if self.accelerator else ranks)


DEVICES = {
    # 64 GB of HBM2e per GCD; a LUMI-G node has 4 MI250X modules = 8 GCDs (and 512 GB of host
    # memory).
    "mi250x": Device("mi250x", "MI250X GCD", 64.0, min_hidden_per_tp=1280),
    # nvidia-smi's memory.total: 81559 MiB for an H100 80GB HBM3, 143771 MiB for an H200 (141 GB
    # HBM3e).
    "h100": Device("h100", "H100 80GB", 81559 / 1024),
    "h200": Device("h200", "H200", 143771 / 1024),
}
DEVICE_CHOICES = ("auto", *DEVICES, "cpu")
# The device of a cluster preset's GPU partition (pipeline/conf/cluster/).
CLUSTER_DEVICES = {"lumi": "mi250x"}
_NVIDIA_INFO = "/proc/driver/nvidia/gpus/*/information"


def resolve_device(plan, cluster_name: str, gpus_per_node: int) -> Device:
    """The device of `plan.device` (see PlanConfig), with `plan.memory_gib` and the cluster's GPUs
    per node (`cluster.gpus_per_node`, when set) applied."""
    name = plan.device
    if name == "auto":
        name = CLUSTER_DEVICES.get(cluster_name) or _visible_nvidia_gpu() or "cpu"
    device = DEVICES.get(name) or (host_device() if name == "cpu" else Device(name, name, None))
    if plan.memory_gib is not None:
        device = dataclasses.replace(device, memory_gib=plan.memory_gib)
    if gpus_per_node > 0 and device.accelerator:
        device = dataclasses.replace(device, per_node=gpus_per_node)
    return device


def host_device() -> Device:
    """This machine's memory as the device of CPU ranks, which all run on it."""
    total_kib = None
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        found = re.search(r"^MemTotal:\s+(\d+) kB", meminfo.read_text(), re.MULTILINE)
        total_kib = int(found.group(1)) if found else None
    memory = total_kib / 2**20 if total_kib else None
    return Device("cpu", "CPU host", memory, accelerator=False, per_node=1 << 30)


def _visible_nvidia_gpu() -> Optional[str]:
    """The table name of the NVIDIA GPU the driver lists (its model name when the table lacks it),
    or None."""
    for path in sorted(glob.glob(_NVIDIA_INFO)):
        found = re.search(r"^Model:\s*(.+)$", Path(path).read_text(errors="replace"), re.MULTILINE)
        if found:
            model = found.group(1).strip()
            return next((name for name in DEVICES if name.upper() in model.upper()), model)
    return None
