"""stage=workflow and stage=status: the recipe on Slurm, for one language or a sweep over many.

`stage=workflow` submits every stage as one Slurm job array with one task per language (the task id is the
language's index in conf/languages.yaml) that waits for the same language's task of the previous stage
(`aftercorr`); it skips what is done (the stage's marker matches) or already queued, so it is safe to run
again at any time. `stage=status` prints languages x stages. The pieces:

- selection.py: the languages, stages and per-language configs a workflow covers, and its checks;
- command.py: the command line a job runs (the user's overrides passed on, shell- and Hydra-quoted);
- resources.py: each stage's Slurm resources from the `cluster` section;
- render.py: the sbatch script of a stage;
- state.py: `${work_dir}/.workflow/`, the record of what was submitted;
- slurm.py: sbatch, squeue, scancel, sacct;
- progress.py: what each (language, stage) is at: done, running, queued, failed, not started;
- plan.py: what to submit, grouped into arrays, and what each array waits for;
- submit.py and status.py: the two targets.
"""

from __future__ import annotations

from pipeline.workflow.selection import validate_workflow
from pipeline.workflow.status import print_status
from pipeline.workflow.submit import submit_workflow


def run_workflow_target(cfg) -> None:
    validate_workflow(cfg)
    if cfg.stage == "workflow":
        submit_workflow(cfg)
    else:
        print_status(cfg)
