"""stage=workflow: look at what is done and queued, then render and submit the rest as dependent job
arrays."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import shlex
from pathlib import Path

from pipeline import slurm
from pipeline.config import PipelineConfig
from pipeline.contract import ON_RANKS
from pipeline.errors import StageError
from pipeline.memory_fit import node_filling_layout
from pipeline.overrides import override_key
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.stages import STAGES, Key, Step
from pipeline.workflow import selection
from pipeline.workflow.arrays import Planned, array_spec, dependency, plan
from pipeline.workflow.jobs import (
    base_language_overrides,
    check_resources,
    job_argv,
    layout_overrides,
    passed_on,
    run_override,
    render_script,
    sbatch_options,
    work_dir_override,
)
from pipeline.workflow.progress import (
    DONE,
    Cell,
    Submission,
    WorkflowState,
    locked,
    observe,
    state_dir,
)
from pipeline.workflow.selection import TABLE_INDEX

log = logging.getLogger(__name__)


def submit_workflow(cfg: PipelineConfig) -> None:
    """Submit what the selected languages still need of the recipe as dependent job arrays, after
    cancelling the tasks that can never start; with workflow.dry_run, print the scripts and the
    dependency graph instead."""
    from hydra.core.hydra_config import HydraConfig

    work = Path(cfg.work_dir).absolute()
    codes = selection.languages(cfg)
    overrides = passed_on(list(HydraConfig.get().overrides.task))
    configs = selection.language_configs(
        cfg, [*overrides, *run_override(cfg), work_dir_override(work)], codes
    )
    steps = selection.steps(cfg, configs)
    check_resources(cfg)
    placements = {step.stage: STAGES[step.stage].placement(step.cfg) for step in steps}
    layout, filled = (
        training_layout(configs[codes[0]], overrides)
        if ON_RANKS in placements.values()
        else (None, False)
    )
    dry_run = cfg.workflow.dry_run
    if not dry_run and not slurm.available():
        raise StageError(
            "sbatch and squeue are not found here: run stage=workflow where Slurm's commands work "
            "(a "
            "login node; tests/slurm/start_local_slurm.sh starts a one-node Slurm on this "
            "machine), or "
            "add workflow.dry_run=true to print the scripts and the dependency graph only."
        )
    # A dry run writes nothing, not even the lock.
    record = state_dir(work, cfg.run)
    with contextlib.nullcontext() if dry_run else locked(work, cfg.run):
        state = WorkflowState.load(work, cfg.run)
        states = slurm.task_states(state.job_ids()) if slurm.available() else {}
        cells = observe(steps, state.latest_tasks(), states)
        planned = plan(steps, cells, TABLE_INDEX)
        scripts = _render_scripts(cfg, planned, placements, overrides, layout, filled, work)
        _print_progress(codes, steps, cells, planned, work)
        if filled:
            print(
                f"Training layout: {' '.join(layout_overrides(layout))}, which fills whole nodes "
                "of "
                f"{cfg.cluster.gpus_per_node} GPUs (cluster.gpu_whole_nodes; set parallel.tp, .pp "
                "or .dp for "
                f"another)."
            )
        if dry_run:
            _print_dry_run(scripts, planned, record)
            return
        _cancel_stuck(cells)
        state.overrides = overrides
        _submit(planned, scripts, state, record)
        state.save()
    if planned:
        print(
            f"Follow it with: python -m pipeline stage=status {selection.languages_argument(cfg)} "
            f"{shlex.join([*run_override(cfg), work_dir_override(work)])}"
        )


def _render_scripts(
    cfg: PipelineConfig,
    planned: list[Planned],
    placements: dict[str, str],
    overrides: list[str],
    layout: ParallelConfig | None,
    filled: bool,
    work: Path,
) -> dict[tuple[str, bool], tuple[Path, str]]:
    """The batch script of each (stage, for the base language) that the `planned` arrays run: where
    it goes and its text. The jobs get the training `layout` on their command line only where the
    workflow chose it (`filled`)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    scripts = {}
    for script in dict.fromkeys(array.script for array in planned):
        stage, for_base = script
        languages = {
            TABLE_INDEX[code]: code
            for array in planned
            if array.script == script
            for code in array.languages
        }
        placement = placements[stage]
        argv = job_argv(
            cfg,
            stage,
            placement,
            base_language_overrides(overrides) if for_base else overrides,
            layout if filled else None,
        )
        text = render_script(
            stage,
            placement,
            sbatch_options(cfg, placement, layout),
            languages,
            cfg,
            argv,
            state_dir(work, cfg.run) / "requeues",
        )
        name = f"{stage}{'-base' if for_base else ''}-{stamp}.sh"
        scripts[script] = (state_dir(work, cfg.run) / "scripts" / name, text)
    return scripts


def _print_progress(
    codes: list[str], steps: list[Step], cells: dict[Key, Cell], planned: list[Planned], work: Path
) -> None:
    """How many steps are done, queued or running, and what is left to submit."""
    done = sum(cell.status == DONE for cell in cells.values())
    active = sum(cell.active for cell in cells.values())
    print(
        f"Workflow of {len(codes)} language(s), {len(steps)} step(s) in {work}: {done} done, "
        f"{active} queued or "
        f"running, {sum(len(a.languages) for a in planned)} to submit as {len(planned)} job "
        "array(s)."
    )


def _cancel_stuck(cells: dict[Key, Cell]) -> None:
    """Cancel the queued tasks that wait for a failed predecessor: they can never start, and their
    steps are submitted again."""
    stuck = [cell.task.slurm_id for cell in cells.values() if cell.stuck]
    if stuck:
        log.info(
            "Cancelling %d task(s) that wait for a failed predecessor: %s",
            len(stuck),
            " ".join(stuck),
        )
        slurm.cancel(stuck)


def training_layout(cfg: PipelineConfig, overrides: list[str]) -> tuple[ParallelConfig, bool]:
    """The training stages' layout (`cfg`: a job's config) and whether the workflow chose it: on a
    partition of whole nodes without a layout on the command line, the one that fills them
    (memory_fit.node_filling_layout)."""
    cluster = cfg.cluster
    given = any(
        override_key(override) in ("parallel", "parallel.tp", "parallel.pp", "parallel.dp")
        for override in overrides
    )
    if not cluster.gpu_whole_nodes or cluster.gpus_per_node == 0 or given:
        return cfg.parallel, False
    return node_filling_layout(cfg, cluster.gpus_per_node, (cfg.train, cfg.warmup.train)), True


def _submit(planned: list[Planned], scripts: dict, state: WorkflowState, record: Path) -> None:
    """Submit the `planned` arrays, keeping each submission in `state` (in the workflow's record
    folder `record`, where the logs go too)."""
    for path, text in scripts.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    (record / "logs").mkdir(parents=True, exist_ok=True)
    job_ids: dict[int, str] = {}
    for array in planned:
        script = scripts[array.script][0]
        log_pattern = _log_pattern(record, array.stage)
        after = dependency(array, job_ids)
        argv = _sbatch_argv(array, script, log_pattern, after)
        job_ids[id(array)] = job = slurm.submit(argv)
        state.submissions.append(
            Submission(
                job_id=job,
                stage=array.stage,
                tasks={TABLE_INDEX[code]: code for code in array.languages},
                script=str(script),
                log=log_pattern,
                dependency=after,
            )
        )
        # after every array: a failing sbatch later must not lose the record of this one
        state.save()
        shown = (
            ", ".join(array.languages)
            if len(array.languages) <= 8
            else f"{len(array.languages)} languages"
        )
        print(
            f"Submitted {array.name}: job {job}, array "
            f"{array_spec([TABLE_INDEX[c] for c in array.languages])} "
            f"({shown}){f', after {after}' if after else ''}"
        )


def _log_pattern(record: Path, stage: str) -> str:
    """One log per array task: %A is the array's job id, %a the task's index."""
    return str(record / "logs" / f"{stage}_%A_%a.log")


def _sbatch_argv(array: Planned, script: Path, log_pattern: str, after: str | None) -> list[str]:
    # Paths go on the command line (no shell, no quoting), not into #SBATCH lines.
    argv = [
        "sbatch",
        "--parsable",
        f"--array={array_spec([TABLE_INDEX[c] for c in array.languages])}",
        f"--output={log_pattern}",
        f"--chdir={os.getcwd()}",
    ]
    if after:
        # A task whose predecessor failed can never start: end it instead of leaving it pending.
        argv += [f"--dependency={after}", "--kill-on-invalid-dep=yes"]
    return [*argv, str(script)]


def _print_dry_run(scripts: dict, planned: list[Planned], record: Path) -> None:
    for path, text in scripts.values():
        print(f"\n#### {path} (not written: workflow.dry_run=true)\n{text}")
    print("#### dependency graph (nothing submitted: workflow.dry_run=true)")
    for array in planned:
        indices = [TABLE_INDEX[code] for code in array.languages]
        waits = dependency(array, {id(a): a.name for a in planned}) or "-"
        print(
            f"{array.name}: stage={array.stage} array={array_spec(indices)} tasks={len(indices)} "
            f"after={waits}"
        )
        shown = dependency(array, {id(a): f"<job id of {a.name}>" for a in planned})
        print(
            "    "
            + shlex.join(
                _sbatch_argv(
                    array, scripts[array.script][0], _log_pattern(record, array.stage), shown
                )
            )
        )
