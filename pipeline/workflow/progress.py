"""Where each (language, stage) of a workflow stands, from the markers, the workflow's record and
Slurm.

- done: the stage's marker matches its config and inputs (contract.is_current), and so do those of
  the steps it needs (its language's earlier stages, and for a mix the base language's clean and
  replay);
- running / queued: the latest task submitted for it is running / waiting in Slurm;
- failed: that task ended without a matching marker and left a log (the reason is in it);
- not started: never submitted, or its task ended before it ran (cancelled, or its predecessor
  failed), or it is stuck: queued behind a predecessor that is neither done nor queued nor running,
  so it can never start.

The workflow's record under `${work_dir}/.workflow/`: which Slurm array task runs which (language,
stage).

Slurm knows a task by its array job id and index only; `state.json` maps them back to languages and
keeps each submission's script and log paths, so that a later stage=workflow waits for tasks already
queued instead of submitting them again, and stage=status finds a failed task's log. Scripts are in
`scripts/`, logs in `logs/`.

stage=status: a table languages x stages of a workflow (done, running, queued, failed, not started),
the base language's row (its clean and replay) first; then the runs of each language (`run=`,
pipeline/run_folders.py): what each has done, shares and continued. A named run's workflow keeps its
own record, `${work_dir}/.workflow/runs/<run>/`.

The markers are checked against the options of this command line, or, when it gives none besides the
languages, against those of the last stage=workflow command in this work folder (recorded in
.workflow/state.json), so that `stage=status langs=...` alone answers for the workflow that was
submitted. Where no workflow was submitted, the recipe is `stage=all`'s: without `model.base`, the
demo's base is the base.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Optional

from pipeline import slurm
from pipeline.config import STAGE_NAMES, PipelineConfig
from pipeline.contract import is_current
from pipeline.json_files import write_json_atomic
from pipeline.run_folders import current_marker, language_runs, shared_stages
from pipeline.languages import LANGUAGES
from pipeline.slurm import TaskState
from pipeline.stages import RECIPE_STAGES, STAGES, Key, Step
from pipeline.workflow import selection
from pipeline.workflow.jobs import passed_on, run_override, work_dir_override
from pipeline.work_folder import DEFAULT_RUN, RUNS_FOLDER, run_dir

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


def observe(
    steps: list[Step], tasks: dict[Key, Task], states: dict[tuple[str, int], TaskState]
) -> dict[Key, Cell]:
    """(language, stage) -> Cell for every step of the recipe (in its order: a step after the steps
    it needs)."""

    cells: dict[Key, Cell] = {}
    for step in steps:
        task = tasks.get(step.key)
        queue = states.get((task.job_id, task.index)) if task else None
        # A step outside `workflow.stages` is not observed: its output is there or the step fails.
        needed = [cells[key] for key in step.needs if key in cells]
        done = all(cell.status == DONE for cell in needed) and is_current(
            STAGES[step.stage], step.cfg
        )
        # Slurm flags a task whose predecessor failed only when it next looks at it (and forgets a
        # cancelled pending task at once): a queued task whose predecessor will not run is as good
        # as dead.
        stuck = queue is not None and (
            queue.stuck
            or queue.queued
            and any(not (cell.status == DONE or cell.active) for cell in needed)
        )
        cells[step.key] = Cell(_status(done, task, queue, stuck), task, queue, stuck)
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


STATE_DIR = ".workflow"
STATE_FILE = "state.json"


def state_dir(work_dir: Path, run: str = DEFAULT_RUN) -> Path:
    """The record of the workflow of run `run` (a named run's workflow keeps its own)."""
    folder = Path(work_dir) / STATE_DIR
    return folder if run == DEFAULT_RUN else folder / RUNS_FOLDER / run


@dataclass(frozen=True)
class Task:
    """One array task: a (language, stage) of one submission."""

    job_id: str
    index: int
    log: Path

    @property
    def slurm_id(self) -> str:
        return f"{self.job_id}_{self.index}"


@dataclass
class Submission:
    job_id: str
    stage: str
    tasks: dict[int, str]  # array index -> language code
    script: str
    # sbatch's --output pattern: %A is the array's job id, %a the task's index.
    log: str
    dependency: str | None
    submitted_at: str = field(
        default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds")
    )

    def task(self, index: int) -> Task:
        return Task(
            self.job_id, index, Path(self.log.replace("%A", self.job_id).replace("%a", str(index)))
        )


@dataclass
class WorkflowState:
    path: Path
    submissions: list[Submission] = field(default_factory=list)
    # The overrides of the last stage=workflow command, which stage=status checks the markers with
    # by default.
    overrides: list[str] | None = None

    @classmethod
    def load(cls, work_dir: Path, run: str = DEFAULT_RUN) -> "WorkflowState":
        path = state_dir(work_dir, run) / STATE_FILE
        if not path.is_file():
            return cls(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        submissions = [
            Submission(**{**entry, "tasks": {int(i): code for i, code in entry["tasks"].items()}})
            for entry in data["submissions"]
        ]
        return cls(path, submissions, data.get("overrides"))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(
            self.path,
            {
                "overrides": self.overrides,
                "submissions": [asdict(submission) for submission in self.submissions],
            },
        )

    def latest_tasks(self) -> dict[tuple[str, str], Task]:
        """(language, stage) -> the task of its latest submission."""
        latest = {}
        for submission in self.submissions:
            for index, code in submission.tasks.items():
                latest[code, submission.stage] = submission.task(index)
        return latest

    def job_ids(self) -> list[str]:
        return [submission.job_id for submission in self.submissions]


@contextlib.contextmanager
def locked(work_dir: Path, run: str = DEFAULT_RUN):
    """One stage=workflow at a time per work folder and run: two would both submit what neither sees
    queued yet."""
    folder = state_dir(work_dir, run)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


log = logging.getLogger(__name__)

# Short words, so that 75 languages x 7 stages stay one screen wide.
_SHOWN = {DONE: "done", RUNNING: "running", QUEUED: "queued", FAILED: "FAILED", NOT_STARTED: "-"}


def print_status(cfg: PipelineConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    work = Path(cfg.work_dir).absolute()
    codes = selection.languages(cfg)
    state = WorkflowState.load(work, cfg.run)
    overrides = passed_on(list(HydraConfig.get().overrides.task))
    if not overrides and state.overrides:
        overrides = state.overrides
        log.info(
            "Checking the markers with the options of the last stage=workflow here: %s",
            " ".join(overrides),
        )
    job_overrides = [*overrides, *run_override(cfg), work_dir_override(work)]
    configs = selection.language_configs(cfg, job_overrides, codes)
    steps = selection.steps(cfg, configs)
    states = slurm.task_states(state.job_ids()) if slurm.available() else {}
    cells = observe(steps, state.latest_tasks(), states)
    print(table(steps, cells, work, cfg.run))
    print(runs_section(work, codes))


def table(steps: list[Step], cells: dict[Key, Cell], work: Path, run: str = DEFAULT_RUN) -> str:
    """Languages x stages; the base language's row (what every language's mix replays) first,
    marked."""
    codes = list(dict.fromkeys(step.lang for step in steps))
    stages = [stage for stage in RECIPE_STAGES if any(step.stage == stage for step in steps)]
    base = steps[0].cfg.model.base_lang
    names = {
        code: LANGUAGES[code]["name"][:14] + (" (base)" if code == base else "") for code in codes
    }
    shown = {key: _SHOWN[cell.status] for key, cell in cells.items()}
    header = ["language", *stages]
    rows = [
        [f"{code} {names[code]}", *(shown.get((code, stage), "") for stage in stages)]
        for code in codes
    ]
    rows.append(
        [
            "done",
            *(
                f"{sum(cells[code, stage].status == DONE for code in codes if (code, stage) in cells)}/"
                f"{sum((code, stage) in cells for code in codes)}"
                for stage in stages
            ),
        ]
    )
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    of_run = "" if run == DEFAULT_RUN else f" of run {run}"
    lines = [
        f"Workflow{of_run} in {work}: {len(codes)} language(s), {len(steps)} step(s); - = not "
        "started",
        "",
    ]
    for row in [header, *rows[:-1], ["-" * w for w in widths], rows[-1]]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    counts = {status: sum(cell.status == status for cell in cells.values()) for status in _SHOWN}
    lines += ["", ", ".join(f"{counts[status]} {status}" for status in _SHOWN)]
    failed = [step.key for step in steps if cells[step.key].status == FAILED]
    if failed:
        lines += [
            "",
            "Failed (the log says why; fix it, then run the same stage=workflow command again):",
        ]
        for code, stage in failed:
            cell = cells[code, stage]
            slurm_state = f" (Slurm: {cell.slurm.state})" if cell.slurm else ""
            lines.append(f"  {code} {stage}: {cell.task.log}{slurm_state}")
    return "\n".join(lines)


def runs_section(work: Path, codes: list[str]) -> str:
    """The runs of each language (`run=`, pipeline/run_folders.py): the stages each has done, which
    of them it shares with another run, and the run it continued."""
    lines = ["", "Runs (done stages; shared: the run whose output it reads):"]
    for code in codes:
        for run in language_runs(work, code, STAGE_NAMES):
            folders = {stage: run_dir(work, code, run) / stage for stage in STAGE_NAMES}
            markers = {stage: current_marker(folder) for stage, folder in folders.items()}
            done = [stage for stage, marker in markers.items() if marker is not None]
            shared = shared_stages(work, code, run, STAGE_NAMES)
            about = [", ".join(done) or "nothing done"]
            if shared:
                about.append("shared: " + ", ".join(f"{s} ({r})" for s, r in shared.items()))
            lineage = ((markers["pretrain"] or {}).get("metrics") or {}).get("continued_from")
            if lineage:
                about.append(f"continues {lineage['run']} from step {lineage['step']}")
            lines.append(f"  {code} {run}: {'; '.join(about)}")
    return "\n".join(lines if len(lines) > 2 else [*lines, "  none"])
