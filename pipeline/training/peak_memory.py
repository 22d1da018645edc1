"""The peak memory of a training rank: host resident set and accelerator memory, as the run reports
them."""

from __future__ import annotations

import ctypes
import ctypes.util
import resource
import sys
from pathlib import Path

import torch
import torch.distributed as dist

GIB = 2**30
# glibc's mallopt parameter, and the size from which each allocation gets its own mapping.
_M_MMAP_THRESHOLD = -3
_OWN_MAPPING_FROM = 2**20


def return_large_blocks_to_the_system() -> None:
    """Give every host allocation of 1 MiB or more its own mapping, returned to the system when
    freed (glibc only).

    The training stages stream the model a tensor at a time (reading, gathering, writing); by
    default glibc serves blocks up to 32 MiB from its heap and keeps them when freed, so that those
    passing tensors pile up in the resident set. Smaller blocks (a CPU run's activations) stay on
    the heap, where they are fast."""
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_MMAP_THRESHOLD, _OWN_MAPPING_FROM)


def _peak_resident_bytes() -> int:
    """VmHWM, the peak of this process's own memory. Not getrusage's ru_maxrss: Linux carries that
    across exec, so a process started by a large one (a test or a notebook holding a model) would
    report its parent's peak."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # in kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (
        1 if sys.platform == "darwin" else 1024
    )  # KiB on Linux


def peak_memory() -> dict:
    """This process's peak resident set (VmHWM, GiB) and its peak device memory allocated by torch
    (GiB; None on a CPU)."""
    host = _peak_resident_bytes() / GIB
    device = torch.cuda.max_memory_allocated() / GIB if torch.cuda.is_available() else None
    return {
        "host_rss_gib": round(host, 3),
        "device_gib": None if device is None else round(device, 3),
    }


def peaks_of_all_ranks(grid) -> list[dict]:
    """Every rank's peak memory with its place in the layout (a collective: every rank calls it), in
    rank order."""
    mine = {
        "rank": dist.get_rank(),
        "pp": grid.get_pipe_parallel_rank(),
        "tp": grid.get_slice_parallel_rank(),
        "dp": grid.get_data_parallel_rank(),
        **peak_memory(),
    }
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, mine)
    return gathered
