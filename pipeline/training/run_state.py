"""What the training loop carries across steps and checkpoints, and when skipped steps stop a run.

A step whose loss or gradient is not finite is skipped (DeepSpeed leaves the model and optimizer as they were).
A run stops when `train.max_bad_steps` steps in a row were skipped, or when more than `train.max_skipped_fraction`
of the last `train.skipped_window` steps were: scattered skips that never come in a row still mean a run that
is not learning from a good part of its data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.training.config import TrainConfig


@dataclass
class RunState:
    step: int = 0
    tokens: int = 0
    bad_in_a_row: int = 0
    skipped_steps: int = 0
    # The skipped steps among the last `train.skipped_window`.
    recent_skips: list[int] = field(default_factory=list)
    heldout_bpb_before: Optional[float] = None

    def as_dict(self) -> dict:
        return {**self.__dict__, "recent_skips": list(self.recent_skips)}

    def count_step(self, skipped: bool, train: TrainConfig) -> Optional[str]:
        """Count the step just taken (`self.step`); returns why the run must stop, or None."""
        if skipped:
            self.bad_in_a_row += 1
            self.skipped_steps += 1
            self.recent_skips.append(self.step)
        else:
            self.bad_in_a_row = 0
        self.recent_skips = [step for step in self.recent_skips if step > self.step - train.skipped_window]
        if self.bad_in_a_row >= train.max_bad_steps:
            return f"{self.bad_in_a_row} steps in a row had a non-finite loss or gradient (train.max_bad_steps)"
        # Against the whole window from the start, so that the first few steps of a run do not count double.
        if len(self.recent_skips) > train.max_skipped_fraction * train.skipped_window:
            return (f"{len(self.recent_skips)} of the last {train.skipped_window} steps had a non-finite loss or "
                    f"gradient, more than train.max_skipped_fraction={train.max_skipped_fraction}")
        return None
