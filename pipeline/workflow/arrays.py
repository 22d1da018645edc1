"""What a stage=workflow run submits: the recipe's steps (pipeline/stages/) that are not done, as
job arrays whose task for language i waits for language i's previous step (`aftercorr`) and for the
base language's steps that every language's mix reads (`afterok` on those tasks: one replay serves
every language).

A step that is done is skipped, unless a step it needs runs again (its inputs will change). A step
whose task from an earlier submission is still queued or running is not submitted again: the steps
after it wait for that task instead (aftercorr on the old array works because every array's task ids
are the languages' table indices). Languages that wait for the same tasks are grouped into one
array, so a fresh sweep is one array per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Union

from pipeline.stages import Key, Step
from pipeline.workflow.progress import DONE, Cell


@dataclass(frozen=True)
class Existing:
    """An array submitted earlier whose task for the language is still queued or running."""

    job_id: str


@dataclass(eq=False)
class Planned:
    """One array to submit: `stage` for `languages`, each task after its language's task of `after`
    and after the tasks `also_after` (an array and the table index of the task waited for)."""

    stage: str
    after: Union[Existing, "Planned", None]
    also_after: tuple[tuple[Union[Existing, "Planned"], int], ...] = ()
    # The base language's step, which the run does not name (Step.for_base): a script of its own.
    for_base: bool = False
    name: str = ""
    languages: list[str] = field(default_factory=list)

    @property
    def script(self) -> tuple[str, bool]:
        """Which script its tasks run."""
        return self.stage, self.for_base


def _identity(array: Union[Existing, Planned, None]):
    return array.job_id if isinstance(array, Existing) else id(array)


def plan(steps: list[Step], cells: Mapping[Key, Cell], index: Mapping[str, int]) -> list[Planned]:
    """The arrays to submit, each after the ones it waits for; `index`: a language's array index."""
    arrays: dict[tuple, Planned] = {}
    waits: dict[
        Key, Union[Existing, Planned]
    ] = {}  # the steps that run or are queued: what waits for them waits here
    for step in steps:
        cell = cells[step.key]
        if cell.status == DONE and not any(key in waits for key in step.needs):
            continue
        if cell.active:
            waits[step.key] = Existing(cell.task.job_id)
            continue
        after = waits.get(step.previous) if step.previous else None
        # The base language's own mix waits for its clean twice (aftercorr and afterok): one array
        # with the others.
        also = tuple((waits[key], index[key[0]]) for key in step.shared if key in waits)
        group = (
            step.stage,
            step.for_base,
            _identity(after),
            tuple((_identity(array), task) for array, task in also),
        )
        array = arrays.setdefault(group, Planned(step.stage, after, also, step.for_base))
        array.languages.append(step.lang)
        waits[step.key] = array
    planned = list(
        arrays.values()
    )  # in creation order: every array comes after the ones it waits for
    for script in dict.fromkeys(array.script for array in planned):
        alike = [array for array in planned if array.script == script]
        for number, array in enumerate(alike, start=1):
            name = f"{array.stage}.base" if array.for_base else array.stage
            array.name = name if len(alike) == 1 else f"{name}.{number}"
    return planned


def array_spec(indices: list[int]) -> str:
    """Slurm's --array value for `indices`, with runs as ranges: [0, 1, 2, 5] -> "0-2,5"."""
    runs: list[list[int]] = []
    for index in sorted(indices):
        if runs and index == runs[-1][1] + 1:
            runs[-1][1] = index
        else:
            runs.append([index, index])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def dependency(planned: Planned, job_ids: Mapping[int, str]) -> Optional[str]:
    """The --dependency value, with the job ids of arrays submitted in this run (`id(array)` -> job
    id)."""

    def job(array: Union[Existing, Planned]) -> str:
        return array.job_id if isinstance(array, Existing) else job_ids[id(array)]

    parts = [f"aftercorr:{job(planned.after)}"] if planned.after is not None else []
    parts += [f"afterok:{job(array)}_{task}" for array, task in planned.also_after]
    return ",".join(parts) or None
