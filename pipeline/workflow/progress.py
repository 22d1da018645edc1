"""Where each (language, stage) of a workflow stands, from the markers, the workflow's record and Slurm.

- done: the stage's marker matches its config and inputs (contract.is_current), and so do the earlier stages';
- running / queued: the latest task submitted for it is running / waiting in Slurm;
- failed: that task ended without a matching marker and left a log (the reason is in it);
- not started: never submitted, or its task ended before it ran (cancelled, or its predecessor failed), or
  it is stuck: queued behind a predecessor that is neither done nor queued nor running, so it can never start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from pipeline.contract import is_current
from pipeline.stages import STAGES
from pipeline.workflow.slurm import TaskState
from pipeline.workflow.state import Task

DONE, RUNNING, QUEUED, FAILED, NOT_STARTED = "done", "running", "queued", "failed", "not started"


@dataclass(frozen=True)
class Cell:
    status: str
    task: Optional[Task] = None  # the latest task submitted for it
    slurm: Optional[TaskState] = None  # that task's state, where Slurm still knows it
    # Queued but never to start (stage=workflow cancels it before submitting the stage again).
    stuck: bool = False

    @property
    def active(self) -> bool:
        return self.status in (RUNNING, QUEUED)


def observe(configs: dict, stages: tuple[str, ...], tasks: dict[tuple[str, str], Task],
            states: dict[tuple[str, int], TaskState]) -> dict[tuple[str, str], Cell]:
    """(language, stage) -> Cell for every language of `configs` and every stage of the chain."""

    cells = {}
    for code, cfg in configs.items():
        previous: Optional[Cell] = None
        for stage in stages:
            task = tasks.get((code, stage))
            slurm = states.get((task.job_id, task.index)) if task else None
            done = (previous is None or previous.status == DONE) and is_current(STAGES[stage], cfg)
            # Slurm flags a task whose predecessor failed only when it next looks at it (and forgets a cancelled
            # pending task at once): a queued task whose predecessor will not run is as good as dead.
            stuck = slurm is not None and (slurm.stuck or slurm.queued and previous is not None and
                                           not (previous.status == DONE or previous.active))
            previous = cells[code, stage] = Cell(_status(done, task, slurm, stuck), task, slurm, stuck)
    return cells


def _status(done: bool, task: Optional[Task], slurm: Optional[TaskState], stuck: bool) -> str:
    if done:
        return DONE
    if slurm is not None and slurm.running:
        return RUNNING
    if slurm is not None and slurm.queued and not stuck:
        return QUEUED
    # Finished without a matching marker, or forgotten by Slurm: the log tells whether it ever ran.
    if task is not None and task.log.is_file() and (slurm is None or slurm.state != "COMPLETED"):
        return FAILED
    return NOT_STARTED
