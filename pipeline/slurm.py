"""Slurm's commands, for every part of the pipeline that talks to Slurm: sbatch, squeue, scancel and
sacct (where accounting exists) for the workflow (pipeline/workflow/), squeue for the clean stage's
datatrove jobs, and the `srun` command line that starts a training stage's ranks
(pipeline/parallel/ranks.py). The ground floor: it imports nothing of the project but its errors.

Arguments go to the commands as lists, never through a shell; the values that end up in a batch
script are checked by the `cluster` section (pipeline/cluster.py) and quoted by the workflow's
script (pipeline/workflow/jobs.py). squeue shows a finished job for MinJobAge (300 s by default)
only; older ones are found with sacct when the cluster keeps accounting, and otherwise not at all
(the workflow then goes by the markers and the logs).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from dataclasses import dataclass
from typing import Iterable

from pipeline.errors import StageError

log = logging.getLogger(__name__)

_RUNNING = {
    "RUNNING",
    "COMPLETING",
    "CONFIGURING",
    "SIGNALING",
    "STAGE_OUT",
    "RESIZING",
    "SUSPENDED",
    "STOPPED",
}
_FINISHED = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "BOOT_FAIL",
    "DEADLINE",
    "PREEMPTED",
    "REVOKED",
}


@dataclass(frozen=True)
class TaskState:
    state: str  # Slurm's name, e.g. PENDING, RUNNING, COMPLETED, CANCELLED
    reason: str = ""

    @property
    def running(self) -> bool:
        return self.state in _RUNNING

    @property
    def finished(self) -> bool:
        return self.state in _FINISHED

    @property
    def stuck(self) -> bool:
        """Pending for a predecessor that failed or was cancelled: it can never start."""
        return self.state == "PENDING" and self.reason == "DependencyNeverSatisfied"

    @property
    def queued(self) -> bool:
        return not (self.running or self.finished or self.stuck)


def available() -> bool:
    return shutil.which("sbatch") is not None and shutil.which("squeue") is not None


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=120)
    except FileNotFoundError:
        raise StageError(
            f"`{argv[0]}` is not installed here: stage=workflow runs where Slurm's commands work "
            f"(a login node), or add workflow.dry_run=true to only print the scripts."
        ) from None


def submit(argv: list[str]) -> str:
    """Run `sbatch --parsable ...`; returns the job id."""
    result = _run(argv)
    if result.returncode != 0:
        raise StageError(
            f"sbatch failed ({result.returncode}): "
            f"{result.stderr.strip() or result.stdout.strip()}\n"
            f"command: {' '.join(argv)}"
        )
    return result.stdout.strip().split(";")[0]


def task_states(job_ids: Iterable[str]) -> dict[tuple[str, int], TaskState]:
    """(array job id, index) -> state, for the tasks of `job_ids` that Slurm still knows."""
    wanted = set(job_ids)
    if not wanted:
        return {}
    # All of this user's jobs, filtered here: naming a purged job id makes squeue fail.
    result = _run(
        ["squeue", "--me", "--noheader", "--array", "--states=all", "--format=%F|%K|%T|%r"]
    )
    if result.returncode != 0:
        raise StageError(
            f"squeue failed ({result.returncode}): {result.stderr.strip()}. Is Slurm up (scontrol "
            "ping)?"
        )
    states = {}
    for line in result.stdout.splitlines():
        job_id, index, state, reason = (line.split("|", 3) + ["", "", "", ""])[:4]
        if job_id in wanted and index.isdigit():
            states[job_id, int(index)] = TaskState(state.strip(), reason.strip())
    return {**_accounting_states(wanted, states), **states}


def _accounting_states(job_ids: set[str], known: dict) -> dict[tuple[str, int], TaskState]:
    """States of finished tasks that squeue no longer shows, from sacct; {} without accounting."""
    if shutil.which("sacct") is None:
        return {}
    result = _run(
        [
            "sacct",
            "--noheader",
            "--parsable2",
            "--allocations",
            "--format=JobID,State",
            f"--jobs={','.join(sorted(job_ids))}",
        ]
    )
    if (
        result.returncode != 0
    ):  # "Slurm accounting storage is disabled": markers and logs will have to do
        log.debug(
            "sacct is not available (%s); going by the markers and logs", result.stderr.strip()
        )
        return {}
    states = {}
    for line in result.stdout.splitlines():
        task, _, state = line.partition("|")
        job_id, _, index = task.partition("_")
        if index.isdigit() and (job_id, int(index)) not in known:
            states[job_id, int(index)] = TaskState(state.split()[0] if state.strip() else "UNKNOWN")
    return states


def cancel(slurm_ids: list[str]) -> None:
    if slurm_ids:
        _run(["scancel", *slurm_ids])


def live_jobs(job_ids: Iterable[str]) -> list[str]:
    """Those of `job_ids` that are still queued or running; none where Slurm is not installed
    (nothing of it runs here either) or does not answer in time."""
    ids = [str(job) for job in job_ids]
    if not ids:
        return []
    try:
        queue = subprocess.run(
            ["squeue", "-h", "-o", "%i", "-j", ",".join(ids)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return queue.stdout.split()  # empty also when Slurm no longer knows them (finished)


def srun_command(
    ntasks: int, srun_args: Iterable, container: str | None, command: list[str]
) -> list[str]:
    """`srun` with one task per rank, the cluster's srun options and container (`cluster.container`,
    split as a shell would, but run without one), then `command`; a rank that fails ends the step."""
    wrapper = shlex.split(container) if container else []
    return [
        "srun",
        f"--ntasks={ntasks}",
        "--kill-on-bad-exit=1",
        *map(str, srun_args),
        *wrapper,
        *command,
    ]


def inside_allocation() -> bool:
    """Whether this process runs inside a Slurm allocation (a batch job or salloc)."""
    return "SLURM_JOB_ID" in os.environ


def task_ranks() -> dict[str, str]:
    """Under srun, torch.distributed's rank variables from Slurm's task ids; {} outside srun."""
    if "SLURM_PROCID" not in os.environ:
        return {}
    return {
        "RANK": os.environ["SLURM_PROCID"],
        "LOCAL_RANK": os.environ["SLURM_LOCALID"],
        "WORLD_SIZE": os.environ["SLURM_NTASKS"],
    }
