"""stage=status: a table languages x stages of a workflow (done, running, queued, failed, not started).

The markers are checked against the options of this command line, or, when it gives none besides the
languages, against those of the last stage=workflow command in this work folder (recorded in
.workflow/state.json), so that `stage=status langs=...` alone answers for the workflow that was submitted.
Where no workflow was submitted, the markers are `stage=all`'s: without `model.base`, the demo base is the base.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.stages import with_demo_base
from pipeline.languages import LANGUAGES
from pipeline.workflow import selection, slurm
from pipeline.workflow.command import passed_on, work_dir_override
from pipeline.workflow.progress import DONE, FAILED, NOT_STARTED, QUEUED, RUNNING, observe
from pipeline.workflow.state import WorkflowState

log = logging.getLogger(__name__)

# Short words, so that 75 languages x 7 stages stay one screen wide.
_SHOWN = {DONE: "done", RUNNING: "running", QUEUED: "queued", FAILED: "FAILED", NOT_STARTED: "-"}


def print_status(cfg) -> None:
    from hydra.core.hydra_config import HydraConfig

    work = Path(cfg.work_dir).absolute()
    codes, chain = selection.languages(cfg), selection.stages(cfg)
    state = WorkflowState.load(work)
    overrides = passed_on(list(HydraConfig.get().overrides.task))
    if not overrides and state.overrides:
        overrides = state.overrides
        log.info("Checking the markers with the options of the last stage=workflow here: %s", " ".join(overrides))
    configs = selection.language_configs(cfg, [*overrides, work_dir_override(work)], codes)
    if not state.overrides:  # no stage=workflow here: the markers are stage=all's, whose base is the demo's without one
        configs = {code: with_demo_base(config) for code, config in configs.items()}
    states = slurm.task_states(state.job_ids()) if slurm.available() else {}
    cells = observe(configs, chain, state.latest_tasks(), states)
    print(table(codes, chain, cells, work))


def table(codes: list[str], chain: tuple[str, ...], cells: dict, work: Path) -> str:
    names = {code: LANGUAGES[code]["name"][:14] for code in codes}
    header = ["language", *chain]
    rows = [[f"{code} {names[code]}", *(_SHOWN[cells[code, stage].status] for stage in chain)] for code in codes]
    rows.append(["done", *(f"{sum(cells[code, stage].status == DONE for code in codes)}/{len(codes)}"
                           for stage in chain)])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [f"Workflow in {work}: {len(codes)} language(s) x {len(chain)} stage(s); - = not started", ""]
    for row in [header, *rows[:-1], ["-" * w for w in widths], rows[-1]]:
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
    counts = {status: sum(cell.status == status for cell in cells.values()) for status in _SHOWN}
    lines += ["", ", ".join(f"{counts[status]} {status}" for status in _SHOWN)]
    failed = [(code, stage) for code in codes for stage in chain if cells[code, stage].status == FAILED]
    if failed:
        lines += ["", "Failed (the log says why; fix it, then run the same stage=workflow command again):"]
        for code, stage in failed:
            cell = cells[code, stage]
            slurm_state = f" (Slurm: {cell.slurm.state})" if cell.slurm else ""
            lines.append(f"  {code} {stage}: {cell.task.log}{slurm_state}")
    return "\n".join(lines)
