"""stage=workflow and stage=status: the recipe on Slurm, for one language or a sweep over many.

`stage=workflow` submits the steps of stage=all's recipe (pipeline/stages/: `recipe`), every stage
as one Slurm job array with one task per language (the task id is the language's index in
pipeline/conf/languages.yaml) that waits for the same language's task of the previous stage
(`aftercorr`) and, for the mix, for the base language's clean and replay tasks (`afterok`); it skips
what is done (the stage's marker matches) or already queued, so it is safe to run again at any time.
`stage=status` prints languages x stages. The pieces:

- selection.py: the languages, steps and per-language configs a workflow covers, and its checks;
- jobs.py: a stage's job: the command line it runs (the user's overrides passed on, shell- and
  Hydra-quoted), its Slurm resources from the `cluster` section, and its sbatch script;
- progress.py: `${work_dir}/.workflow/`, the record of what was submitted; what each (language,
  stage) is at (done, running, queued, failed, not started); and stage=status's table;
- arrays.py: what to submit, grouped into job arrays, and what each array waits for;
- submit.py: stage=workflow. Slurm's own commands (sbatch, squeue, scancel, sacct) are
  pipeline/slurm.py's.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.workflow.progress import print_status
from pipeline.workflow.selection import validate_workflow
from pipeline.workflow.submit import submit_workflow


def run_workflow_target(cfg: PipelineConfig) -> None:
    validate_workflow(cfg)
    if cfg.stage == "workflow":
        submit_workflow(cfg)
    else:
        print_status(cfg)
