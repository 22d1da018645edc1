"""What a stage=workflow run submits: for each language, the stages from its first one that is not done, as job
arrays whose task for language i waits for language i's previous stage (`aftercorr`).

A stage that is done is skipped, unless an earlier stage runs again (its inputs will change). A stage whose task
from an earlier submission is still queued or running is not submitted again: the next stage waits for that task
instead (aftercorr on the old array works because every array's task ids are the languages' table indices).
Languages that wait for the same array are grouped into one array, so a fresh sweep is one array per stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional, Union

from pipeline.workflow.progress import Cell


@dataclass(frozen=True)
class Existing:
    """An array submitted earlier whose task for the language is still queued or running."""

    job_id: str


@dataclass(eq=False)
class Planned:
    """One array to submit: `stage` for `languages`, each task after its language's task of `after`."""

    stage: str
    after: Union[Existing, "Planned", None]
    name: str = ""
    languages: list[str] = field(default_factory=list)


def plan(languages: list[str], stages: tuple[str, ...], cells: dict[tuple[str, str], Cell]) -> list[Planned]:
    """The arrays to submit, each after the one it waits for."""
    arrays: dict[tuple, Planned] = {}
    for code in languages:
        after: Union[Existing, Planned, None] = None
        rerun = False  # an earlier stage of this language runs (or is queued to): the rest must follow it
        for stage in stages:
            cell = cells[code, stage]
            if cell.status == "done" and not rerun:
                continue
            rerun = True
            if cell.active:
                after = Existing(cell.task.job_id)
                continue
            key = (stage, after.job_id if isinstance(after, Existing) else id(after))
            array = arrays.setdefault(key, Planned(stage, after))
            array.languages.append(code)
            after = array
    planned = list(arrays.values())  # in creation order: every array comes after the one it waits for
    for stage in stages:
        of_stage = [array for array in planned if array.stage == stage]
        for number, array in enumerate(of_stage, start=1):
            array.name = stage if len(of_stage) == 1 else f"{stage}.{number}"
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


def dependency(planned: Planned, job_ids: dict[int, str]) -> Optional[str]:
    """The --dependency value, with the job ids of arrays submitted in this run (`id(array)` -> job id)."""
    if planned.after is None:
        return None
    job = planned.after.job_id if isinstance(planned.after, Existing) else job_ids[id(planned.after)]
    return f"aftercorr:{job}"
