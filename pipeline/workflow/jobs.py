"""The sbatch script of one stage of a workflow.

The script holds the stage's resources (`#SBATCH`, below), maps the array task id to its language (the
language's index in the table), runs cluster.env_command and then the stage's command line. GPU stages run the
command in the background so that the shell can pass Slurm's warning signal on and, when the stage stops with
exit code 75 after saving a checkpoint, requeue the task, which then resumes from the checkpoint.

Nothing from the config reaches the shell unquoted: `#SBATCH` values are single checked tokens, language codes come
from the table, and every word of the command goes through shlex.quote. The exception is cluster.env_command,
which is shell code by design (module loads, sourcing an environment), written as given.

The command line of a workflow job: `python -m pipeline stage=<s> lang=<code> <the user's overrides>`.

The user's overrides are passed on as typed (each one word for the shell), without those the workflow sets
itself: the stage and language, the workflow's own options, the work folder (absolute, so that a job finds it
wherever it starts) and how the job runs its stage (CPU stages in the job itself with `workers` = its CPUs,
training stages with srun inside the allocation).

The Slurm resources of a workflow's jobs, from the `cluster` section, as `#SBATCH` options.

CPU stages get one task with `workflow_cpus` CPUs on the CPU partition. GPU stages get nodes enough for
parallel.tp x pp x dp ranks, one per GPU (GCD on LUMI), the `--signal` that warns them before the time limit and
`--requeue`. Every value is one plain token: the config's checks (pipeline/cluster.py) make sure of it.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import PipelineConfig
from pipeline.errors import ConfigError, StageInterrupted

_HEADER = """\
#!/bin/bash
# Stage `{stage}` of a pipeline workflow (python -m pipeline stage=workflow): one array task per language, the
# task id being the language's index in conf/languages.yaml.
"""

_LANGUAGE = """
case "${{SLURM_ARRAY_TASK_ID:-}}" in
{cases}
    *) echo "array task ${{SLURM_ARRAY_TASK_ID:-?}} is not a language of this workflow" >&2; exit 2 ;;
esac
"""

_ANNOUNCE = """
echo "[workflow] $(date '+%F %T') ${{SLURM_ARRAY_JOB_ID:-?}}_${{SLURM_ARRAY_TASK_ID:-?}} on $(hostname): {stage} $lang"
"""

_RUN_CPU = """\
exec "${command[@]}"
"""

_RUN_GPU = """\
# Slurm sends SIGUSR1 to this shell before the time limit (--signal=B:USR1@...), and SIGTERM on scancel or
# preemption: pass them on to the stage, which saves a checkpoint and exits with {interrupted}. Then requeue this
# task: it resumes from the checkpoint (resume=auto).
"${{command[@]}}" &
child=$!
trap 'kill -USR1 "$child" 2>/dev/null' USR1
trap 'kill -TERM "$child" 2>/dev/null' TERM
wait "$child"
status=$?
# A trapped signal ends `wait` early while the stage is still writing its checkpoint: wait until it has ended.
while kill -0 "$child" 2>/dev/null; do
    wait "$child"
    status=$?
done
if [[ $status == {interrupted} ]]; then
    echo "[workflow] $(date '+%F %T') stage {stage} saved a checkpoint and stopped: requeueing it to resume"
    scontrol requeue "${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"  # the bare job id could name the whole array
fi
exit "$status"
"""


def shell_words(argv: list[str]) -> str:
    """argv as one shell line; the language placeholder becomes the script's `$lang`."""
    return " ".join('"lang=${lang}"' if word == LANG_ARG else shlex.quote(word) for word in argv)


def sbatch_line(key: str, value) -> str:
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={value}"


def render_script(stage: str, gpu: bool, options: list[tuple[str, object]], languages: dict[int, str],
                  env_command: str | None, argv: list[str]) -> str:
    """The script for `stage`, whose array tasks are the `languages` (array index -> code)."""
    lines = [_HEADER.format(stage=stage).rstrip("\n"), sbatch_line("job-name", f"pipeline-{stage}"),
             *(sbatch_line(key, value) for key, value in options)]
    cases = "\n".join(f"    {index}) lang={shlex.quote(code)} ;;" for index, code in sorted(languages.items()))
    lines.append(_LANGUAGE.format(cases=cases).rstrip("\n"))
    lines += ["", "# OpenMP and PyTorch threads: the job's CPUs, not all of the node's (env_command may change it).",
              'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"']
    if env_command:
        lines += ["", "# cluster.env_command", env_command.rstrip("\n")]
    lines += ["", f"command=({shell_words(argv)})", _ANNOUNCE.format(stage=stage).strip("\n")]
    lines.append(_RUN_GPU.format(stage=stage, interrupted=StageInterrupted.exit_code) if gpu else _RUN_CPU)
    return "\n".join(lines)


# Set by the workflow for each job; a user's value of these is replaced, not passed on.
_SET_BY_WORKFLOW = {"stage", "lang", "langs", "work_dir", "workers", "cluster.executor"}

# Stands for the array task's language in a job's argv; the script puts `"lang=${lang}"` there.
LANG_ARG = "lang=${lang}"


def passed_on(task_overrides: list[str]) -> list[str]:
    """The user's command-line overrides that the jobs get (Hydra's task overrides, as typed)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = []
    for override in OverridesParser.create().parse_overrides(task_overrides):
        key = override.key_or_group
        if key in _SET_BY_WORKFLOW or key == "workflow" or key.startswith("workflow."):
            continue
        kept.append(override.input_line)
    return kept


def work_dir_override(work_dir: Path) -> str:
    """`work_dir='<absolute path>'`, quoted for Hydra so that any path (spaces, quotes) comes back unchanged."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString

    text = str(work_dir)
    # `${` would be an interpolation in the job's config; control characters cannot be passed on safely.
    if "${" not in text and not any(ord(c) < 32 for c in text):
        parser = OverridesParser.create()
        for value in (text, QuotedString(text=text, quote=Quote.single).with_quotes()):  # plain where it can be
            override = f"work_dir={value}"
            try:
                if parser.parse_override(override).value() == text:
                    return override
            except Exception:  # Hydra's grammar error: try the quoted form
                continue
    raise ConfigError("work_dir", text, ["a path without `${` and control characters"])


def python_command(workflow, container: str | None, gpu: bool) -> list[str]:
    """The Python a job runs its stage with: in the container for CPU stages (training stages run the
    container around each rank instead, in its srun command: pipeline/slurm.py)."""
    python = shlex.split(workflow.python) if workflow.python else [sys.executable]
    return python if gpu or not container else [*shlex.split(container), *python]


def job_argv(cfg: PipelineConfig, stage: str, gpu: bool, overrides: list[str], cpus: int) -> list[str]:
    """The job's argv, with LANG_ARG where the array task's language goes."""
    runs = ["cluster.executor=slurm"] if gpu else ["cluster.executor=local", f"workers={cpus}"]
    return [*python_command(cfg.workflow, cfg.cluster.container, gpu), "-m", "pipeline", f"stage={stage}", LANG_ARG,
            *overrides, work_dir_override(Path(cfg.work_dir).absolute()), *runs]


@dataclass(frozen=True)
class GpuLayout:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: no GPU options (a CPU-only cluster)


def gpu_layout(cluster, parallel) -> GpuLayout:
    """One rank per GPU: whole nodes of `gpus_per_node` ranks, or one node with fewer."""
    world = parallel.world_size
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


def sbatch_options(cfg: PipelineConfig, gpu: bool) -> list[tuple[str, object]]:
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


def check_resources(cfg: PipelineConfig, gpu: bool) -> None:
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
