"""The fault-injection harness: a stage killed (SIGKILL) at each of its commit steps in turn, then
the same command, must leave what an uninterrupted run leaves (pipeline/commit_steps.py;
docs/safety.md).

`kill_at_each_step` runs the command once uninterrupted, listing the steps it takes; then, for each
step, in the starting folder made afresh, runs it with the kill at that step, checks it died there,
runs it again and compares `outputs` with the uninterrupted run's. `outputs` says what a run leaves:
`folder_outputs` reads a folder's files (gzip shards by their lines, JSON by its content less what
differs from run to run), and each stage's test adds what it knows (a training stage's weights, its
report less its timings).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import signal
from pathlib import Path
from typing import Callable

from pipeline.commit_steps import KILL_AT_STEP, STEPS_FILE
from tests.conftest import run_cli

# What differs between two uninterrupted runs: when and how fast, and the memory a process held.
RUN_DEPENDENT = frozenset(
    {
        "finished_at",
        "seconds",
        "tokens_per_s",
        "peak_memory_per_rank",
        "peak_memory_stage_process",
        "peak_rss_mib",
        "peak_added_mib",
    }
)


def _without_run_dependent(value):
    if isinstance(value, dict):
        return {
            key: _without_run_dependent(item)
            for key, item in value.items()
            if key not in RUN_DEPENDENT
        }
    if isinstance(value, list):
        return [_without_run_dependent(item) for item in value]
    return value


def folder_outputs(
    folder: Path, skip: Callable[[Path], bool] = lambda path: False
) -> dict[str, object]:
    """Every file below `folder` (but those `skip` names, by their path relative to it): gzip files
    as their sorted lines, JSON files as their content less RUN_DEPENDENT keys, others as a SHA-256."""
    found = {}
    for path in sorted(folder.rglob("*")):
        relative = path.relative_to(folder)
        if path.is_dir() or skip(relative):
            continue
        if path.name.endswith(".gz"):  # gzip's header holds the time it was written
            with gzip.open(path, "rb") as handle:
                found[str(relative)] = sorted(handle.read().splitlines())
        elif path.suffix == ".json":
            found[str(relative)] = _without_run_dependent(
                json.loads(path.read_text(encoding="utf-8"))
            )
        else:
            found[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def entries(folder: Path) -> list[str]:
    """The names in `folder`, hidden ones included: partial, set-aside and replaced folders left
    behind show."""
    return sorted(path.name for path in folder.iterdir())


def kill_at_each_step(
    overrides: tuple[str, ...], start: Callable[[], Path], outputs: Callable[[Path], object]
) -> list[str]:
    """Kill `python -m pipeline <overrides>` at each of its commit steps in the folder `start()`
    makes afresh (the same one each time: outputs may name files by their absolute paths), run it
    again, and compare `outputs(folder)` with an uninterrupted run's; returns the steps. The folder
    is left as the last rerun left it."""
    folder = start()
    listing = folder.parent / f"{folder.name}-steps.txt"
    run_cli(*overrides, cwd=folder, env={STEPS_FILE: str(listing)})
    steps = listing.read_text(encoding="utf-8").splitlines()
    expected = outputs(folder)
    assert steps and expected
    for number, step in enumerate(steps, start=1):
        listing.unlink()
        assert start() == folder
        killed = run_cli(
            *overrides,
            cwd=folder,
            check=False,
            env={KILL_AT_STEP: str(number), STEPS_FILE: str(listing)},
        )
        assert killed.returncode == -signal.SIGKILL, (
            number,
            step,
            killed.returncode,
            killed.stderr[-3000:],
        )
        # Killed where intended: the same steps as the uninterrupted run up to this one.
        assert listing.read_text(encoding="utf-8").splitlines() == steps[:number]
        run_cli(*overrides, cwd=folder)
        assert outputs(folder) == expected, f"killed at step {number} ({step}), then run again"
    listing.unlink()
    return steps
