"""The typed `cluster` and `workflow` sections: where jobs run (local processes, Slurm) and how
stage=workflow submits them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

from pipeline.errors import ConfigError

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
    # Training stages inside a Slurm allocation start their ranks with `srun` (one task per GPU/GCD):
    # extra srun options (e.g. LUMI's CPU binding per GCD), a command the Python command runs in (a
    # container: `singularity exec ... image.sif`), and environment variables for the ranks ($VARS expanded).
    srun_args: list = field(default_factory=list)
    container: Optional[str] = None
    env: dict = field(default_factory=dict)
    # stage=workflow runs each CPU stage of a language as one job on this many CPUs (its `workers`; datatrove
    # runs locally inside the job); null: cpus_per_task.
    workflow_cpus: Optional[int] = None
    # stage=workflow's GPU stages (warmup, pretrain): their partition (null: `partition`), GPUs per node (GCDs on
    # LUMI; 0: a CPU-only cluster, whose ranks are CPU processes on one node), CPUs per rank, time limit and memory
    # per node (null: the partition's default). Nodes = parallel.tp x pp x dp / gpus_per_node.
    gpu_partition: Optional[str] = None
    gpus_per_node: int = 0
    gpu_cpus_per_task: int = 1
    gpu_time: str = "12:00:00"
    gpu_mem_per_node_gb: Optional[int] = None


@dataclass
class WorkflowConfig:
    """stage=workflow and stage=status (pipeline/workflow/): every stage as a Slurm job array, one task per language."""

    # Print the scripts and the dependency graph; submit nothing.
    dry_run: bool = False
    # The stages to chain (in the pipeline's order); null: all of them. Stages left out are neither checked nor run.
    stages: Optional[List[str]] = None
    # GPU stages get SIGUSR1 this many seconds before their time limit: they checkpoint and requeue themselves.
    signal_seconds: int = 300
    # The jobs' Python; null: the interpreter that runs stage=workflow (right for a virtual environment on a shared
    # file system). With cluster.container, the container's (e.g. `python3`).
    python: Optional[str] = None


def validate_cluster(cluster: ClusterConfig) -> None:
    if cluster.executor not in ("local", "slurm"):
        raise ConfigError("cluster.executor", cluster.executor, ["local", "slurm"])
