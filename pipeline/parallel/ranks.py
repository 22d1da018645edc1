"""Starting the ranks of a distributed job: `python <argv>` once per rank, the job's own command
line.

- on a machine of its own: local processes with torch.distributed's environment (RANK, LOCAL_RANK,
  WORLD_SIZE, MASTER_ADDR, MASTER_PORT), gloo on a CPU and NCCL/RCCL with one process per GPU;
- inside a Slurm allocation with `cluster.executor=slurm`: `srun` (pipeline/slurm.py) with one task
  per rank (one per GPU/GCD), the cluster's srun options, container and environment; each rank reads
  Slurm's task ids (`slurm_ranks`). A rank that fails stops the others; SIGUSR1/SIGTERM are passed
  on, so that every rank can checkpoint. No shell is involved: every argument goes to srun or Python
  as it is.

Bounded collectives: a collective of the training ranks that waits longer than
`parallel.collective_timeout_s` fails with an error naming the rank and the operation, instead of
holding every rank (and the Slurm allocation) forever; the launcher then stops the other ranks.

`bound_collectives` runs in each rank before its process group starts, and returns the timeout to
start it with:
- `init_process_group(timeout=...)` bounds the world group only. A group made later by `new_group`
  without a timeout of its own, as DeepSpeed makes the tensor, pipeline and data-parallel groups,
  gets torch's default instead (10 minutes on NCCL, 30 on gloo), which torch reads from two
  attributes of `torch.distributed.distributed_c10d` when the group is made: they are set to the
  same timeout (private names, checked on torch 2.13; tests/unit/parallel/test_collectives.py fails
  if they move).
- NCCL: with TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (torch's default, set unless the user chose another),
  a collective past its timeout aborts the rank after the watchdog logs `[Rank N] Watchdog caught
  collective operation timeout: WorkNCCL(SeqNum=.., OpType=ALLREDUCE, NumelIn=..) ran for ..
  milliseconds before timing out`.
- gloo raises the timeout in the waiting rank's collective, whose traceback names it.
- TORCH_DISTRIBUTED_DEBUG=DETAIL, which the tests set and a user may set for a run: before each
  collective, the ranks of its group check that they all run the same one (kind, shapes, dtypes). A
  mismatch then fails at once, naming what each rank runs ("Detected mismatch between collectives on
  ranks. Rank 1 is running collective: CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[5349]
  ..."), and a rank that does not arrive is named within the timeout ("Rank 1 failed to pass
  monitoredBarrier"). It costs a gloo round trip per collective, so runs that are timed go without
  it.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch.distributed.distributed_c10d as c10d

from pipeline import slurm
from pipeline.errors import StageError, StageInterrupted

log = logging.getLogger(__name__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def distributed_environment(rank: int, world_size: int, port: int) -> dict[str, str]:
    return {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }


def rank_environment(rank: int, world_size: int, port: int, threads: int) -> dict[str, str]:
    # Ranks share the machine's cores: without OMP_NUM_THREADS each would start one thread per core.
    return {
        **os.environ,
        **distributed_environment(rank, world_size, port),
        "OMP_NUM_THREADS": str(threads),
    }


def run_ranks(argv: list[str], world_size: int, cluster, logs: Path) -> None:
    """Run `python <argv>` as `world_size` ranks; ranks 1.. log to `logs/rank<N>.log`, rank 0 to
    this console."""
    command = [sys.executable, *argv]
    if cluster.executor == "slurm":
        if not slurm.inside_allocation():
            raise StageError(
                f"cluster.executor=slurm starts the {world_size} ranks with srun inside a Slurm "
                f"allocation, and this process is not in one. Submit the command as a job (e.g. "
                f"sbatch --ntasks={world_size} --gpus-per-task=1 --wrap 'python -m pipeline ...'), "
                "or "
                f"run it here with cluster=local."
            )
        _run_srun(command, cluster, world_size, logs)
        return
    logs.mkdir(parents=True, exist_ok=True)
    port, threads = free_port(), _threads(world_size)
    log.info(
        "Starting %d ranks (%d threads each); logs of ranks 1.. in %s", world_size, threads, logs
    )
    processes = []
    for rank in range(world_size):
        # Rank 0 talks to the console (progress, metrics); the others write to files.
        output = None if rank == 0 else open(logs / f"rank{rank}.log", "w", encoding="utf-8")
        processes.append(
            subprocess.Popen(
                command,
                env=rank_environment(rank, world_size, port, threads),
                stdout=output,
                stderr=subprocess.STDOUT if output else None,
            )
        )
    _wait_all(processes, logs)


def slurm_ranks() -> None:
    """Under srun, torch.distributed's rank variables from Slurm's task ids (each rank calls it
    first)."""
    if "RANK" not in os.environ:
        os.environ.update(slurm.task_ranks())


def _run_srun(command: list[str], cluster, world_size: int, logs: Path) -> None:
    command = slurm.srun_command(world_size, cluster.srun_args, cluster.container, command)
    # Rank 0 may be on another node than this batch step, but the first node of the allocation is
    # this one.
    env = {
        **os.environ,
        "MASTER_ADDR": socket.gethostname(),
        "MASTER_PORT": str(free_port()),
        **{key: os.path.expandvars(str(value)) for key, value in cluster.env.items()},
    }
    log.info("Starting %d ranks: %s", world_size, shlex.join(command))
    _wait_all([subprocess.Popen(command, env=env)], logs)


def _threads(world_size: int) -> int:
    """Each rank's share of the cores this process was given: OMP_NUM_THREADS where it is set (a
    Slurm job's script sets it to the task's CPUs; the tests to their process's share), else the
    machine's cores."""
    given = os.environ.get("OMP_NUM_THREADS", "")
    cores = int(given) if given.isdigit() and int(given) > 0 else (os.cpu_count() or 1)
    return max(1, cores // world_size)


def _forward_signals(processes: list[subprocess.Popen]) -> dict:
    """Pass SIGUSR1/SIGTERM on to the ranks (they checkpoint and stop); returns the handlers to
    restore."""

    def forward(number, frame):
        for process in processes:
            if process.poll() is None:
                process.send_signal(number)

    return {number: signal.signal(number, forward) for number in (signal.SIGUSR1, signal.SIGTERM)}


def _wait_all(processes: list[subprocess.Popen], logs: Path) -> None:
    """Wait for every rank; when one fails, stop the others (they would wait for it forever)."""
    previous = _forward_signals(processes)
    interrupted = StageInterrupted.exit_code
    try:
        while True:
            codes = [p.poll() for p in processes]
            if (
                all(code is not None for code in codes)
                and interrupted in codes
                and set(codes) <= {0, interrupted}
            ):
                raise StageInterrupted(
                    f"the ranks stopped on a signal after saving a checkpoint (logs: {logs}); "
                    f"run the same command again to resume."
                )
            failed = [rank for rank, code in enumerate(codes) if code not in (None, 0, interrupted)]
            if failed:
                rank = failed[0]
                where = "above" if rank == 0 else str(logs / f"rank{rank}.log")
                raise StageError(
                    f"rank {rank} of {len(processes)} failed with exit code {codes[rank]}; "
                    f"its log is {where}."
                )
            if all(code == 0 for code in codes):
                return
            time.sleep(0.2)
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()


# torch's defaults for a group made without a timeout (see above).
_GROUP_DEFAULT_TIMEOUTS = ("default_pg_timeout", "default_pg_nccl_timeout")


def bound_collectives(timeout_s: float) -> timedelta:
    """Every process group this rank makes from now on, the world's included, times out after
    `timeout_s`; the timeout for `init_process_group` (or deepspeed.init_distributed) is returned."""
    timeout = timedelta(seconds=timeout_s)
    missing = [name for name in _GROUP_DEFAULT_TIMEOUTS if not hasattr(c10d, name)]
    if missing:
        raise RuntimeError(
            f"torch.distributed.distributed_c10d has no {', '.join(missing)} in this torch "
            "version: "
            f"parallel.collective_timeout_s cannot bound the process groups DeepSpeed makes. "
            f"Update pipeline/parallel/ranks.py for torch's new name."
        )
    for name in _GROUP_DEFAULT_TIMEOUTS:
        # None where torch was built without NCCL (its default is then never read).
        if getattr(c10d, name) is not None:
            setattr(c10d, name, timeout)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    return timeout
