"""Learning-rate schedules: a linear warm-up, then constant, cosine, linear or warmup-stable-decay."""

from __future__ import annotations

import math

SCHEDULES = ("constant", "cosine", "linear", "wsd")


def lr_factor(step: int, schedule: str, steps: int, warmup_steps: int, min_lr_ratio: float,
              decay_fraction: float = 0.1) -> float:
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
