"""The typed `cluster` and `workflow` sections: where jobs run (local processes, Slurm) and how
stage=workflow submits them, and the checks of every value that goes into a Slurm batch script.

sbatch reads `#SBATCH` lines without a shell, but a newline in a value would start a new script line
and a space would end the option: every such value is one plain token. Paths that datatrove's Slurm
executor writes into the script body (its logging folders, under work_dir) are not quoted there:
they may hold only characters that mean nothing to the shell (`check_script_word`).
cluster.env_command is shell code by design.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import List, Optional

from pipeline.errors import ConfigError

_TOKEN = re.compile(r"[A-Za-z0-9_.,:=@%+/|&!*\[\]-]+")
_OPTION = re.compile(r"[a-z][a-z0-9-]*")
# Slurm's time formats: minutes, minutes:seconds, hours:minutes:seconds,
# days-hours[:minutes[:seconds]].
_TIME = re.compile(r"\d+(:\d{1,2}){0,2}|\d+-\d{1,2}(:\d{1,2}){0,2}")
# Besides letters and digits, what a path or name written unquoted into a batch script may hold.
_SCRIPT_WORD_CHARACTERS = "_.,+-/@:=~"


@dataclass
class ClusterConfig:
    name: str = "local"
    # `local` runs datatrove's LocalPipelineExecutor; `slurm` submits datatrove's Slurm jobs.
    executor: str = "local"
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    cpu_time: str = "12:00:00"
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    # Extra `#SBATCH` options, e.g. {"qos": "normal"}.
    sbatch_args: dict = field(default_factory=dict)
    # Shell lines run before the job's Python command (module loads, container setup).
    env_command: Optional[str] = None
    # Training stages inside a Slurm allocation start their ranks with `srun` (one task per
    # GPU/GCD): extra srun options (e.g. LUMI's CPU binding per GCD), a command the Python command
    # runs in (a container: `singularity exec ... image.sif`), and environment variables for the
    # ranks ($VARS expanded).
    srun_args: list = field(default_factory=list)
    container: Optional[str] = None
    env: dict = field(default_factory=dict)
    # stage=workflow runs each CPU stage of a language as one job on this many CPUs (its `workers`;
    # datatrove runs locally inside the job); null: cpus_per_task.
    workflow_cpus: Optional[int] = None
    # stage=workflow's GPU stages (warmup, pretrain): their partition (null: `partition`), GPUs per
    # node (GCDs on LUMI; 0: a CPU-only cluster, whose ranks are CPU processes on one node), CPUs
    # per rank, time limit and memory per node (null: the partition's default). Nodes = parallel.tp
    # x pp x dp / gpus_per_node.
    gpu_partition: Optional[str] = None
    gpus_per_node: int = 0
    gpu_cpus_per_task: int = 1
    gpu_time: str = "12:00:00"
    gpu_mem_per_node_gb: Optional[int] = None
    # Whether gpu_partition gives whole nodes only (LUMI's standard-g): then the training stages
    # fill their nodes, with the data-parallel ranks that the fewest tensor x pipeline ranks that
    # fit leave room for, unless the command line sets parallel.tp, .pp or .dp.
    gpu_whole_nodes: bool = False
    # The partition of the jobs that use one GPU (replay; evaluate of a model large enough to need
    # one); null: gpu_partition. On a cluster whose GPU partition gives whole nodes, one that shares
    # nodes (LUMI: small-g).
    one_gpu_partition: Optional[str] = None


@dataclass
class WorkflowConfig:
    """stage=workflow and stage=status (pipeline/workflow/): every stage as a Slurm job array, one
    task per language."""

    # Print the scripts and the dependency graph; submit nothing.
    dry_run: bool = False
    # The stages to chain (in the pipeline's order); null: all of them. Stages left out are neither
    # checked nor run.
    stages: Optional[List[str]] = None
    # GPU stages get SIGUSR1 this many seconds before their time limit: they checkpoint and requeue
    # themselves.
    signal_seconds: int = 300
    # A training task that stops again within signal_seconds of its start (it gains nothing: a time
    # limit shorter than the warning, preemption after preemption) is requeued at most this many
    # times in a row, then fails.
    max_requeues: int = 3
    # The jobs' Python; null: the interpreter that runs stage=workflow (right for a virtual
    # environment on a shared file system). With cluster.container, the container's (e.g.
    # `python3`).
    python: Optional[str] = None


def validate_cluster(cluster: ClusterConfig) -> None:
    if cluster.executor not in ("local", "slurm"):
        raise ConfigError("cluster.executor", cluster.executor, ["local", "slurm"])
    for key in ("cpu_time", "gpu_time"):
        if not _TIME.fullmatch(getattr(cluster, key)):
            raise ConfigError(
                f"cluster.{key}",
                getattr(cluster, key),
                ["a Slurm time limit: minutes, HH:MM:SS or D-HH:MM:SS, e.g. 24:00:00"],
            )
    for key in ("partition", "gpu_partition", "one_gpu_partition", "account", "qos"):
        value = getattr(cluster, key)
        if value is not None and not _TOKEN.fullmatch(value):
            raise ConfigError(
                f"cluster.{key}", value, ["null", "one word of letters, digits and _.-"]
            )
    for key, value in cluster.sbatch_args.items():
        if not _OPTION.fullmatch(str(key)):
            raise ConfigError(
                "cluster.sbatch_args", key, ["sbatch's long option names without `--`, e.g. qos"]
            )
        if value is not True and (isinstance(value, bool) or not _TOKEN.fullmatch(str(value))):
            raise ConfigError(
                f"cluster.sbatch_args.{key}",
                value,
                [
                    "true (a flag)",
                    "one token of letters, digits and _.,:=@%+/|&!*[]- (no spaces, quotes or "
                    "newlines)",
                ],
            )


def check_script_word(key: str, value) -> None:
    """Refuse a value (a path, a job name) that would be shell syntax, or split, where a batch
    script holds it unquoted; `key` names the config key it comes from."""
    bad = sorted({ch for ch in str(value) if not (ch.isalnum() or ch in _SCRIPT_WORD_CHARACTERS)})
    if bad:
        raise ConfigError(
            key,
            str(value),
            [
                f"letters, digits and {_SCRIPT_WORD_CHARACTERS} only: datatrove's Slurm executor "
                "writes it unquoted into "
                f"its batch script, where {' '.join(repr(ch) for ch in bad)} would be shell syntax "
                "or split it (a relative "
                f"work_dir counts from the current folder)"
            ],
        )
