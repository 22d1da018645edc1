"""The sbatch script of one stage of a workflow.

The script holds the stage's resources (`#SBATCH`, below), maps the array task id to its language
(the language's index in the table), runs cluster.env_command and then the stage's command line. GPU
stages run the command in the background so that the shell can pass Slurm's warning signal on and,
when the stage stops with exit code 75 after saving a checkpoint, requeue the task, which then
resumes from the checkpoint.

Nothing from the config reaches the shell unquoted: `#SBATCH` values are single checked tokens,
language codes come from the table, a run's name (`run=`, in the job name and the command) is
checked (pipeline/run_folders.py), and every word of the command goes through shlex.quote. The
exception is cluster.env_command, which is shell code by design (module loads, sourcing an
environment), written as given.

The command line of a workflow job: `python -m pipeline stage=<s> lang=<code> <the user's
overrides>`.

The user's overrides are passed on as typed (each one word for the shell), without those the
workflow sets itself: the stage and language, the workflow's own options, the work folder (absolute,
so that a job finds it wherever it starts) and how the job runs its stage (CPU and one-GPU stages in
the job itself with `workers` = its CPUs, training stages with srun inside the allocation, and on
whole nodes the layout that fills them when the user set none). Nothing else: the job's own command
line check adds what it derives (model.base's shape).

The Slurm resources of a workflow's jobs, from the `cluster` section, as `#SBATCH` options, by where
the stage runs (contract.Stage.placement): CPU stages get one task with `workflow_cpus` CPUs on the
CPU partition; stages of one GPU (replay; evaluate of a model that needs one) one task with one GPU
on `one_gpu_partition` (else the GPU partition); training stages nodes enough for parallel.tp x pp x
dp ranks, one per GPU (GCD on LUMI), the `--signal` that warns them before the time limit and
`--requeue`. Every value is one plain token: the config's checks (pipeline/cluster.py) make sure of
it.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from pipeline.config import SCALE_GROUP, PipelineConfig
from pipeline.contract import ON_ONE_GPU, ON_RANKS
from pipeline.errors import ConfigError, StageInterrupted
from pipeline.overrides import override_key
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.stages import RUN_LANGUAGE_KEYS
from pipeline.work_folder import DEFAULT_RUN

_HEADER = """\
#!/bin/bash
# Stage `{stage}` of a pipeline workflow (python -m pipeline stage=workflow): one array task per language, the
# task id being the language's index in pipeline/conf/languages.yaml.
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

_RUN_IN_JOB = """\
exec "${command[@]}"
"""

_RUN_RANKS = """\
# Slurm sends SIGUSR1 to this shell before the time limit (--signal=B:USR1@...), and SIGTERM on scancel or
# preemption: pass them on to the stage, which saves a checkpoint and exits with {interrupted}. Then requeue this
# task: it resumes from the checkpoint (resume=auto). A task that stops again within {quick} s of its start gains
# nothing: after {max_requeues} such requeues in a row it fails instead.
started=$SECONDS
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
    quick_stops={requeues}/"{stage}_${{SLURM_ARRAY_JOB_ID}}_${{SLURM_ARRAY_TASK_ID}}"
    stops=0
    if (( SECONDS - started < {quick} )); then
        stops=$(( $(cat "$quick_stops" 2>/dev/null || echo 0) + 1 ))
    fi
    mkdir -p {requeues} && echo "$stops" > "$quick_stops"
    if (( stops > {max_requeues} )); then
        echo "[workflow] $(date '+%F %T') stage {stage} stopped within {quick} s of its start $stops times in a row:" \\
             "not requeued again (workflow.max_requeues={max_requeues}). Check cluster.gpu_time against" \\
             "workflow.signal_seconds and the preemptions above; run stage=workflow again to resume it." >&2
        exit 1
    fi
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


def render_script(
    stage: str,
    placement: str,
    options: list[tuple[str, object]],
    languages: dict[int, str],
    cfg: PipelineConfig,
    argv: list[str],
    requeues: Path,
) -> str:
    """The script for `stage`, whose array tasks are the `languages` (array index -> code); a
    training stage counts its quick stops in the folder `requeues`."""
    run = "" if cfg.run == DEFAULT_RUN else f"-{cfg.run}"
    lines = [
        _HEADER.format(stage=stage).rstrip("\n"),
        sbatch_line("job-name", f"pipeline-{stage}{run}"),
        *(sbatch_line(key, value) for key, value in options),
    ]
    cases = "\n".join(
        f"    {index}) lang={shlex.quote(code)} ;;" for index, code in sorted(languages.items())
    )
    lines.append(_LANGUAGE.format(cases=cases).rstrip("\n"))
    lines += [
        "",
        "# OpenMP and PyTorch threads: the job's CPUs, not all of the node's (env_command may "
        "change it).",
        'export OMP_NUM_THREADS="${SLURM_CPUS_PER_TASK:-1}"',
    ]
    if cfg.cluster.env_command:
        lines += ["", "# cluster.env_command", cfg.cluster.env_command.rstrip("\n")]
    lines += ["", f"command=({shell_words(argv)})", _ANNOUNCE.format(stage=stage).strip("\n")]
    if placement == ON_RANKS:
        lines.append(
            _RUN_RANKS.format(
                stage=stage,
                interrupted=StageInterrupted.exit_code,
                requeues=shlex.quote(str(requeues)),
                quick=cfg.workflow.signal_seconds,
                max_requeues=cfg.workflow.max_requeues,
            )
        )
    else:
        lines.append(_RUN_IN_JOB)
    return "\n".join(lines)


# Set by the workflow for each job, or by the job's own command line (the recipe): not passed on.
_SET_BY_WORKFLOW = {
    "stage",
    "lang",
    "langs",
    "work_dir",
    "workers",
    "cluster.executor",
    SCALE_GROUP,
    # As resolved (`run_override`): a multirun's name is an interpolation on its command line.
    "run",
}

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


def base_language_overrides(overrides: list[str]) -> list[str]:
    """The overrides of the base language's jobs where the run does not name that language: without
    the settings of the named languages' text (stages.RUN_LANGUAGE_KEYS), as the recipe gives them
    (stages.base_language_config)."""
    return [
        override
        for override in overrides
        if not any(
            override_key(override) == key or override_key(override).startswith(f"{key}.")
            for key in RUN_LANGUAGE_KEYS
        )
    ]


def work_dir_override(work_dir: Path) -> str:
    """`work_dir='<absolute path>'`, quoted for Hydra so that any path (spaces, quotes) comes back
    unchanged."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Quote, QuotedString

    text = str(work_dir)
    # `${` would be an interpolation in the job's config; control characters cannot be passed on
    # safely.
    if "${" not in text and not any(ord(c) < 32 for c in text):
        parser = OverridesParser.create()
        for value in (
            text,
            QuotedString(text=text, quote=Quote.single).with_quotes(),
        ):  # plain where it can be
            override = f"work_dir={value}"
            try:
                if parser.parse_override(override).value() == text:
                    return override
            except Exception:  # Hydra's grammar error: try the quoted form
                continue
    raise ConfigError("work_dir", text, ["a path without `${` and control characters"])


def run_override(cfg: PipelineConfig) -> list[str]:
    """`run=<name>` of a named run (a checked name: letters, digits and `._+-`), for its jobs."""
    return [] if cfg.run == DEFAULT_RUN else [f"run={cfg.run}"]


def python_command(workflow, container: str | None, placement: str) -> list[str]:
    """The Python a job runs its stage with: in the container, except for training stages, which run
    the container around each rank instead (in its srun command: pipeline/slurm.py)."""
    python = shlex.split(workflow.python) if workflow.python else [sys.executable]
    return python if placement == ON_RANKS or not container else [*shlex.split(container), *python]


def layout_overrides(parallel: ParallelConfig) -> list[str]:
    return [f"parallel.{key}={getattr(parallel, key)}" for key in ("tp", "pp", "dp")]


def job_argv(
    cfg: PipelineConfig,
    stage: str,
    placement: str,
    overrides: list[str],
    layout: ParallelConfig | None = None,
) -> list[str]:
    """The job's argv, with LANG_ARG where the array task's language goes; `layout`: the training
    ranks that the workflow chose to fill whole nodes (the user set none)."""
    if placement == ON_RANKS:
        runs = [*(layout_overrides(layout) if layout else []), "cluster.executor=slurm"]
    else:
        runs = ["cluster.executor=local", f"workers={job_cpus(cfg.cluster, placement)}"]
    return [
        *python_command(cfg.workflow, cfg.cluster.container, placement),
        "-m",
        "pipeline",
        f"stage={stage}",
        LANG_ARG,
        *overrides,
        *run_override(cfg),
        work_dir_override(Path(cfg.work_dir).absolute()),
        *runs,
    ]


@dataclass(frozen=True)
class GpuLayout:
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: no GPU options (a CPU-only cluster)


def gpu_layout(cluster, world: int) -> GpuLayout:
    """One rank per GPU for `world` ranks: whole nodes of `gpus_per_node` ranks, or one node with
    fewer."""
    per_node = cluster.gpus_per_node
    if per_node == 0:
        return GpuLayout(nodes=1, tasks_per_node=world, gpus_per_node=0)
    if world <= per_node:
        return GpuLayout(nodes=1, tasks_per_node=world, gpus_per_node=world)
    if world % per_node:
        raise ConfigError(
            "cluster.gpus_per_node",
            per_node,
            [
                f"a divisor of parallel.tp x pp x dp = {world} (every node runs the same number of "
                "ranks)",
                f"or a parallel layout whose {world} ranks fill whole nodes",
            ],
        )
    return GpuLayout(nodes=world // per_node, tasks_per_node=per_node, gpus_per_node=per_node)


def job_cpus(cluster, placement: str) -> int:
    """The CPUs of a job that runs its stage itself (the stage's `workers`)."""
    return (
        cluster.gpu_cpus_per_task
        if placement == ON_ONE_GPU
        else cluster.workflow_cpus or cluster.cpus_per_task
    )


def sbatch_options(
    cfg: PipelineConfig, placement: str, parallel: ParallelConfig
) -> list[tuple[str, object]]:
    """(option, value) pairs in the order they are written; value True is a flag without a value."""
    cluster = cfg.cluster
    if placement == ON_RANKS:
        layout = gpu_layout(cluster, parallel.world_size)
        mem = f"{cluster.gpu_mem_per_node_gb}G" if cluster.gpu_mem_per_node_gb else None
        options = [
            ("partition", cluster.gpu_partition or cluster.partition),
            ("nodes", layout.nodes),
            ("ntasks-per-node", layout.tasks_per_node),
            ("gpus-per-node", layout.gpus_per_node or None),
            ("cpus-per-task", cluster.gpu_cpus_per_task),
            ("mem", mem),
            ("time", cluster.gpu_time),
            ("signal", f"B:USR1@{cfg.workflow.signal_seconds}"),
            ("requeue", True),
        ]
    elif placement == ON_ONE_GPU:
        options = [
            ("partition", cluster.one_gpu_partition or cluster.gpu_partition or cluster.partition),
            ("nodes", 1),
            ("ntasks", 1),
            ("gpus-per-node", 1 if cluster.gpus_per_node else None),
            ("cpus-per-task", job_cpus(cluster, placement)),
            ("time", cluster.gpu_time),
        ]
    else:
        options = [
            ("partition", cluster.partition),
            ("nodes", 1),
            ("ntasks", 1),
            ("cpus-per-task", job_cpus(cluster, placement)),
            ("mem-per-cpu", f"{cluster.mem_per_cpu_gb}G"),
            ("time", cluster.cpu_time),
        ]
    # A requeued task appends to its log instead of starting it again.
    options += [
        ("account", cluster.account),
        ("qos", cluster.qos),
        ("open-mode", "append"),
        *cluster.sbatch_args.items(),
    ]  # last: sbatch takes the last value of an option given twice
    return [(key, value) for key, value in options if value is not None and value is not False]


def check_resources(cfg: PipelineConfig) -> None:
    """The numbers behind the `#SBATCH` lines (the values themselves, times, partitions and
    sbatch_args, are checked with the config: cluster.py)."""
    cluster = cfg.cluster
    for key in (
        "workflow_cpus",
        "cpus_per_task",
        "mem_per_cpu_gb",
        "gpu_cpus_per_task",
        "gpu_mem_per_node_gb",
    ):
        value = getattr(cluster, key)
        if value is not None and value < 1:
            raise ConfigError(
                f"cluster.{key}",
                value,
                ["an integer >= 1"]
                + (["null"] if key.endswith("_gb") or key == "workflow_cpus" else []),
            )
    if cluster.gpus_per_node < 0:
        raise ConfigError(
            "cluster.gpus_per_node",
            cluster.gpus_per_node,
            ["0 (a CPU-only cluster)", "an integer > 0"],
        )
    if cfg.workflow.signal_seconds < 1:
        raise ConfigError(
            "workflow.signal_seconds", cfg.workflow.signal_seconds, ["an integer >= 1, e.g. 300"]
        )
    if cfg.workflow.max_requeues < 0:
        raise ConfigError(
            "workflow.max_requeues", cfg.workflow.max_requeues, ["an integer >= 0, e.g. 3"]
        )
