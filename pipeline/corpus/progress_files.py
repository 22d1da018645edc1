"""Progress of work done in other processes (datatrove's local workers, or Slurm jobs): each task
writes what it has done so far to a file of its own, and the main process sums the files into the
log lines of pipeline/progress.py while it waits for the tasks.
"""

from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from pipeline.json_files import write_json_atomic
from pipeline.progress import Progress

# Seconds between two writes of a task's file, and two reads of them all.
POLL_S = 2.0


class TaskProgressFile:
    """One task's work done so far, in `path`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._written = 0.0
        path.parent.mkdir(parents=True, exist_ok=True)

    def report(self, done: float, now: bool = False) -> None:
        """Record `done`, at once if `now`, else at most every POLL_S seconds."""
        clock = time.monotonic()
        if now or clock - self._written >= POLL_S:
            self._written = clock
            write_json_atomic(self.path, {"done": done})


def _summed(folder: Path, ranks: list[int]) -> float:
    done = 0.0
    for rank in ranks:
        try:
            done += json.loads((folder / f"{rank:05d}.json").read_text(encoding="utf-8"))["done"]
        except FileNotFoundError:  # a task that has not started yet
            pass
    return done


@contextmanager
def watched(progress: Progress, folder: Path, ranks: list[int]) -> Iterator[None]:
    """While the block runs, `progress` follows the sum of the files of tasks `ranks` in `folder`
    (those of an earlier try are removed first: these tasks start again)."""
    for rank in ranks:
        (folder / f"{rank:05d}.json").unlink(missing_ok=True)
    stop = threading.Event()

    def follow() -> None:
        while not stop.wait(POLL_S):
            progress.update(max(0.0, _summed(folder, ranks) - progress.done))

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    try:
        yield
    finally:
        stop.set()
        follower.join()
    progress.update(max(0.0, _summed(folder, ranks) - progress.done))
