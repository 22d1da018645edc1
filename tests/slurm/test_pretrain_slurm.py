"""Stage `pretrain` inside a Slurm allocation (the local one-node Slurm of tests/slurm/): the ranks
start with srun."""

from __future__ import annotations

import shlex
import subprocess
import sys
import time

from tests.conftest import REPO, marker, packed_copy
from tests.stages.test_pretrain import SCRATCH


def test_inside_a_slurm_allocation_the_ranks_start_with_srun(nob_packed, slurm_cluster, tmp_path):
    work = packed_copy(nob_packed, tmp_path) / "work"
    command = shlex.join(
        [
            sys.executable,
            "-m",
            "pipeline",
            *SCRATCH,
            "train.steps=3",
            f"work_dir={work}",
            "cluster.executor=slurm",
            "parallel.dp=2",
        ]
    )
    log = tmp_path / "job.log"
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            f"--partition={slurm_cluster}",
            "--ntasks=2",
            "--cpus-per-task=1",
            f"--chdir={tmp_path}",
            f"--output={log}",
            f"--export=ALL,PYTHONPATH={REPO}",
            f"--wrap={command}",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    job = submitted.stdout.strip()
    deadline = time.time() + 300
    while subprocess.run(
        ["squeue", "-h", "-j", job], capture_output=True, text=True
    ).stdout.strip():
        assert time.time() < deadline, (
            f"job {job} still queued or running: {log.read_text()[-3000:]}"
        )
        time.sleep(1)
    text = log.read_text()
    assert "Starting 2 ranks: srun --ntasks=2" in text, text[-3000:]
    assert marker(work, "nob", "pretrain")["metrics"]["steps"] == 3
