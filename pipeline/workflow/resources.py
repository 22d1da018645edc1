"""The Slurm resources of a workflow's jobs, from the `cluster` section, as `#SBATCH` options.

CPU stages get one task with `workflow_cpus` CPUs on the CPU partition. GPU stages get nodes enough for
parallel.tp x pp x dp ranks, one per GPU (GCD on LUMI), the `--signal` that warns them before the time limit and
`--requeue`. Every value is one plain token: the config's checks (pipeline/cluster.py) make sure of it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError


@dataclass(frozen=True)
class GpuLayout:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: no GPU options (a CPU-only cluster)


def gpu_layout(cluster, parallel) -> GpuLayout:
    """One rank per GPU: whole nodes of `gpus_per_node` ranks, or one node with fewer."""
    world = parallel.tp * parallel.pp * parallel.dp
    per_node = cluster.gpus_per_node
    if per_node == 0:
        return GpuLayout(nodes=1, tasks_per_node=world, gpus_per_node=0)
    if world <= per_node:
        return GpuLayout(nodes=1, tasks_per_node=world, gpus_per_node=world)
    if world % per_node:
        raise ConfigError("cluster.gpus_per_node", per_node, [
            f"a divisor of parallel.tp x pp x dp = {world} (every node runs the same number of ranks)",
            f"or a parallel layout whose {world} ranks fill whole nodes"])
    return GpuLayout(nodes=world // per_node, tasks_per_node=per_node, gpus_per_node=per_node)


def cpu_stage_cpus(cluster) -> int:
    return cluster.workflow_cpus or cluster.cpus_per_task


def sbatch_options(cfg, gpu: bool) -> list[tuple[str, object]]:
    """(option, value) pairs in the order they are written; value True is a flag without a value."""
    cluster = cfg.cluster
    if gpu:
        layout = gpu_layout(cluster, cfg.parallel)
        mem = f"{cluster.gpu_mem_per_node_gb}G" if cluster.gpu_mem_per_node_gb else None
        options = [("partition", cluster.gpu_partition or cluster.partition), ("nodes", layout.nodes),
                   ("ntasks-per-node", layout.tasks_per_node), ("gpus-per-node", layout.gpus_per_node or None),
                   ("cpus-per-task", cluster.gpu_cpus_per_task), ("mem", mem), ("time", cluster.gpu_time),
                   ("signal", f"B:USR1@{cfg.workflow.signal_seconds}"), ("requeue", True)]
    else:
        options = [("partition", cluster.partition), ("nodes", 1), ("ntasks", 1),
                   ("cpus-per-task", cpu_stage_cpus(cluster)), ("mem-per-cpu", f"{cluster.mem_per_cpu_gb}G"),
                   ("time", cluster.cpu_time)]
    # A requeued task appends to its log instead of starting it again.
    options += [("account", cluster.account), ("qos", cluster.qos), ("open-mode", "append"),
                *cluster.sbatch_args.items()]  # last: sbatch takes the last value of an option given twice
    return [(key, value) for key, value in options if value is not None and value is not False]


def check_resources(cfg, gpu: bool) -> None:
    """Every value that goes into an `#SBATCH` line, and the numbers behind them."""
    cluster = cfg.cluster
    for key in ("workflow_cpus", "cpus_per_task", "mem_per_cpu_gb", "gpu_cpus_per_task", "gpu_mem_per_node_gb"):
        value = getattr(cluster, key)
        if value is not None and value < 1:
            raise ConfigError(f"cluster.{key}", value, ["an integer >= 1"] + (["null"] if key.endswith("_gb") or
                                                                              key == "workflow_cpus" else []))
    if cluster.gpus_per_node < 0:
        raise ConfigError("cluster.gpus_per_node", cluster.gpus_per_node, ["0 (a CPU-only cluster)", "an integer > 0"])
    if cfg.workflow.signal_seconds < 1:
        raise ConfigError("workflow.signal_seconds", cfg.workflow.signal_seconds, ["an integer >= 1, e.g. 300"])
    # The #SBATCH values themselves (times, partitions, sbatch_args) are checked with the config (cluster.py).
    for gpu_stage in (True, False) if gpu else (False,):
        sbatch_options(cfg, gpu_stage)  # raises for a parallel layout that does not fill whole nodes
