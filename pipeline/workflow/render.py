"""The sbatch script of one stage of a workflow.

The script holds the stage's resources (`#SBATCH`, resources.py), maps the array task id to its language (the
language's index in the table), runs cluster.env_command and then the stage's command line. GPU stages run the
command in the background so that the shell can pass Slurm's warning signal on and, when the stage stops with
exit code 75 after saving a checkpoint, requeue the task, which then resumes from the checkpoint.

Nothing from the config reaches the shell unquoted: `#SBATCH` values are single checked tokens, language codes come
from the table, and every word of the command goes through shlex.quote. The exception is cluster.env_command,
which is shell code by design (module loads, sourcing an environment), written as given.
"""

from __future__ import annotations

import shlex

from pipeline.errors import StageInterrupted
from pipeline.workflow.command import LANG_ARG

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
