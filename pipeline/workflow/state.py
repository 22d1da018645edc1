"""The workflow's record under `${work_dir}/.workflow/`: which Slurm array task runs which (language, stage).

Slurm knows a task by its array job id and index only; `state.json` maps them back to languages and keeps each
submission's script and log paths, so that a later stage=workflow waits for tasks already queued instead of
submitting them again, and stage=status finds a failed task's log. Scripts are in `scripts/`, logs in `logs/`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipeline.contract import write_json_atomic

STATE_DIR = ".workflow"
STATE_FILE = "state.json"


def state_dir(work_dir: Path) -> Path:
    return Path(work_dir) / STATE_DIR


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
    submitted_at: str = field(default_factory=lambda: dt.datetime.now().isoformat(timespec="seconds"))

    def task(self, index: int) -> Task:
        return Task(self.job_id, index, Path(self.log.replace("%A", self.job_id).replace("%a", str(index))))


@dataclass
class WorkflowState:
    path: Path
    submissions: list[Submission] = field(default_factory=list)
    # The overrides of the last stage=workflow command, which stage=status checks the markers with by default.
    overrides: list[str] | None = None

    @classmethod
    def load(cls, work_dir: Path) -> "WorkflowState":
        path = state_dir(work_dir) / STATE_FILE
        if not path.is_file():
            return cls(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        submissions = [Submission(**{**entry, "tasks": {int(i): code for i, code in entry["tasks"].items()}})
                       for entry in data["submissions"]]
        return cls(path, submissions, data.get("overrides"))

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(self.path, {"overrides": self.overrides,
                                      "submissions": [asdict(submission) for submission in self.submissions]})

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
def locked(work_dir: Path):
    """One stage=workflow at a time per work folder: two would both submit what neither sees queued yet."""
    folder = state_dir(work_dir)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
