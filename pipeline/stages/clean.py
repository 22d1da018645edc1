"""Stage `clean`: raw web text of one language -> filtered, deduplicated JSONL shards.

The datatrove pipeline (language ID, quality and repetition filters, MinHash deduplication, the
held-out splits) is pipeline/corpus/phases.py's; a run of it, pipeline/corpus/cleaning.py's: the raw
files, the sources `clean.heldout_sources` holds out, the phases run here one after the other or as
Slurm jobs that depend on each other. A last step sums the statistics into the marker's metrics and
`report.md` and commits the output: here, in this process; on Slurm, as a one-task job that depends
on the others.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.config import EMBEDDED_DATA_DIR, PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.corpus.cleaning import (
    describe_raw_input,
    finish_output,
    kept_state,
    prepare_phases,
    run_phases,
)
from pipeline.corpus.phases import INTERMEDIATE
from pipeline.errors import StageError
from pipeline.stage_outputs import CleanOutput

log = logging.getLogger(__name__)


def describe_inputs(cfg: PipelineConfig) -> dict:
    if cfg.raw_dir == str(EMBEDDED_DATA_DIR) and not EMBEDDED_DATA_DIR.is_dir():
        # The default names a checkout's data/ beside the package, which no wheel has.
        raise StageError(
            f"No raw input for {cfg.lang.code}: raw_dir is not given, and its default, the embedded "
            f"samples of a checkout ({EMBEDDED_DATA_DIR}), is missing: `pip install .` and wheels "
            f"carry none. Give raw_dir=<folder> with a {cfg.lang.code}/ subfolder of JSONL or "
            "Parquet files (docs/own-corpus.md), or run from a checkout (pip install -e .)."
        )
    return describe_raw_input(cfg.raw_dir, cfg.lang, cfg.clean.lid)


@dataclass
class CommitWhenDone:
    """The last step: turns the phases' statistics into the marker and commits the output; a
    datatrove pipeline step, so that on Slurm it is a job that waits for the phases. Taken again, it
    finishes a commit killed on the way with the same documents and counts (`finish_output`; the
    intermediate folders it reads go only once the marker is written: the stage's scratch)."""

    run: StageRun

    def __call__(self, data=None, rank: int = 0, world_size: int = 1):
        run, cfg = self.run, self.run.cfg
        metrics = finish_output(run.work_dir, cfg.clean, cfg.lang, cfg.raw_dir)
        run.commit(metrics)
        log.info(
            "clean %s: %d documents in, %d kept, %d held out, %d in held-out sources, %d rejected, "
            "%d bad records "
            "(per source: %s)",
            run.lang,
            metrics["docs_in"],
            metrics["docs_out"],
            metrics["docs_heldout"],
            metrics["docs_heldout_source"],
            sum(metrics["rejected"].values()),
            metrics["bad_records"],
            CleanOutput(run.final_dir).report_text.path,
        )
        return data


def run_clean(run: StageRun):
    cfg: PipelineConfig = run.cfg
    # The commit job logs outside the folder it moves into place.
    commit_logs = run.final_dir.parent / "logs" / f"clean-commit-{run.config_hash}"
    phases = prepare_phases(
        run.work_dir,
        run.final_dir,
        commit_logs,
        cfg.raw_dir,
        cfg.clean,
        cfg.lang,
        cfg.cluster,
        cfg.workers,
    )
    submitted = run_phases(
        run.work_dir,
        phases,
        cfg.cluster,
        cfg.workers,
        cfg.lang.code,
        CommitWhenDone(run),
        commit_logs,
    )
    if submitted is not None:
        log.info(
            "clean %s: submitted to Slurm (jobs %s); the marker appears in %s when the jobs finish.",
            cfg.lang.code,
            ", ".join(submitted),
            run.final_dir,
        )
    return None


STAGE = Stage(
    name="clean",
    run=run_clean,
    config_sections=("clean", "lang"),
    # Parallelism and descriptive table fields do not change the output.
    unhashed_keys=(
        "clean.tasks",
        "clean.min_part_bytes",
        "lang.name",
        "lang.flores",
        "lang.filters_source",
        "lang.in_hplt_v1_2",
    ),
    kept_state=kept_state,
    describe_inputs=describe_inputs,
    scratch=INTERMEDIATE,
)
