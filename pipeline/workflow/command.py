"""The command line of a workflow job: `python -m pipeline stage=<s> lang=<code> <the user's overrides>`.

The user's overrides are passed on as typed (each one word for the shell), without those the workflow sets
itself: the stage and language, the workflow's own options, the work folder (absolute, so that a job finds it
wherever it starts) and how the job runs its stage (CPU stages in the job itself with `workers` = its CPUs,
training stages with srun inside the allocation).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from pipeline.errors import ConfigError

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
    container around each rank instead, through srun: pipeline/parallel/launch.py)."""
    python = shlex.split(workflow.python) if workflow.python else [sys.executable]
    return python if gpu or not container else [*shlex.split(container), *python]


def job_argv(cfg, stage: str, gpu: bool, overrides: list[str], cpus: int) -> list[str]:
    """The job's argv, with LANG_ARG where the array task's language goes."""
    runs = ["cluster.executor=slurm"] if gpu else ["cluster.executor=local", f"workers={cpus}"]
    return [*python_command(cfg.workflow, cfg.cluster.container, gpu), "-m", "pipeline", f"stage={stage}", LANG_ARG,
            *overrides, work_dir_override(Path(cfg.work_dir).absolute()), *runs]
