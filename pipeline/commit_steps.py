"""The commit steps of the stages: where a stage makes its work durable (its marker, the rename into
place, a checkpoint's state file, a rewritten shard). A kill -9 at any of them, then the same
command, leaves exactly what an uninterrupted run leaves (docs/safety.md); the tests check it by
killing each stage at each of its steps in turn (tests/fault_injection.py).

A stage calls `commit_step(name)` just before each step. With PIPELINE_KILL_AT_STEP=N in its
environment, a process kills itself (SIGKILL: no handler runs, nothing is flushed) on reaching its
Nth step; with PIPELINE_STEPS_FILE=path it appends each step's name to that file. A run without them
pays one look at the environment per step.
"""

from __future__ import annotations

import os
import signal

KILL_AT_STEP = "PIPELINE_KILL_AT_STEP"
STEPS_FILE = "PIPELINE_STEPS_FILE"

_reached = 0


def commit_step(name: str) -> None:
    """Mark that the process is about to take the commit step `name`."""
    global _reached
    _reached += 1
    listing = os.environ.get(STEPS_FILE)
    if listing:
        with open(listing, "a", encoding="utf-8") as handle:
            handle.write(f"{name}\n")
    if os.environ.get(KILL_AT_STEP) == str(_reached):
        os.kill(os.getpid(), signal.SIGKILL)
