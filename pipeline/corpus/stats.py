"""Reading datatrove's per-task statistics back, summed over tasks.

datatrove writes `<logging_dir>/stats/<rank>.json` for every finished task (a list with one entry per
pipeline step: its name and counters). Summing the per-task files, rather than trusting the merged
`stats.json`, gives the right totals when a run was resumed or ran as Slurm jobs.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path


def summed_stats(logging_dir: Path) -> dict[str, dict[str, float]]:
    """{step name: {counter: total over all tasks}} for one datatrove run."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for task_file in sorted(Path(logging_dir, "stats").glob("*.json")):
        for step in json.loads(task_file.read_text(encoding="utf-8")):
            for counter, value in step.get("stats", {}).items():
                totals[step["name"]][counter] += value["total"] if isinstance(value, dict) else value
    return {name: dict(counters) for name, counters in totals.items()}


def step_key(step) -> str:
    """How datatrove names a step (class or instance) in its statistics."""
    return f"{step.type}: {step.name}"


def count(stats: dict[str, dict[str, float]], step, counter: str) -> int:
    return int(stats.get(step_key(step), {}).get(counter, 0))
