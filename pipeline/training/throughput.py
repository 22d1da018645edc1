"""Model TFLOP/s per device and MFU, against a table of peak bf16 dense TFLOP/s per device."""

from __future__ import annotations

from typing import Optional

import torch

# Peak dense bf16 TFLOP/s of one device as torch sees it: an MI250X module (383) shows as two GCDs of 191.5.
PEAK_TFLOPS = {"MI250X": 191.5, "H100": 989.0, "H200": 989.0, "A100": 312.0}


def device_peak_tflops() -> Optional[float]:
    """The peak of this process's GPU, None on a CPU or an unknown GPU (then MFU is not reported)."""
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    gcn = getattr(torch.cuda.get_device_properties(0), "gcnArchName", "")
    if "gfx90a" in gcn:
        return PEAK_TFLOPS["MI250X"]
    return next((peak for key, peak in PEAK_TFLOPS.items() if key in name), None)


def tflops_per_device(flops_per_token: int, tokens_per_s: float, devices: int) -> float:
    return flops_per_token * tokens_per_s / devices / 1e12
