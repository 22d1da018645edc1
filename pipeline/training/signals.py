"""Stop requests from Slurm (SIGUSR1 before the time limit, SIGTERM on preemption or scancel).

A signal only sets a flag; the loop asks every rank at the end of each step (one all-reduce), so that all
ranks write the same checkpoint and stop together.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist

SIGNALS = (signal.SIGUSR1, signal.SIGTERM)


class StopRequest:
    def __init__(self) -> None:
        self.received: str | None = None
        for number in SIGNALS:
            signal.signal(number, self._handle)

    def _handle(self, number, frame) -> None:
        self.received = signal.Signals(number).name

    def agreed(self, device) -> bool:
        """True on every rank if any rank received a signal."""
        flag = torch.tensor([1.0 if self.received else 0.0], device=device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def restore(self) -> None:
        for number in SIGNALS:
            signal.signal(number, signal.SIG_DFL)
