"""Stage `clean`: raw web text of one language -> filtered, deduplicated JSONL shards.

The datatrove pipeline (language ID, quality and repetition filters, MinHash deduplication, the held-out splits) is
pipeline/corpus/phases.py's; this stage lists the raw files, holds out the sources `clean.heldout_sources` names,
and runs the phases: here, one after the other, or as Slurm jobs that depend on each other. A last step sums the
statistics into the marker's metrics and `report.md` and commits the output: here, in this process; on Slurm, as a
one-task job that depends on the others. Raw files whose names are not valid UTF-8 are bad records of their own
(`file_name_not_utf8`), the files beside them are read.

On Slurm, datatrove pickles each phase's executor into the work folder (`logs/<phase>/executor.pik`, which its
jobs load) and writes the folder paths unquoted into the batch script: those paths are checked to hold no shell
syntax (pipeline/cluster.py) before anything is submitted. The submitted job ids are kept in
`slurm_jobs.json`, so that a second submission while they are queued or running is refused (pipeline/slurm.py asks
squeue).
"""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from pipeline import slurm
from pipeline.cluster import check_script_word
from pipeline.commit_steps import commit_step
from pipeline.config import PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.corpus.config import heldout_source_patterns
from pipeline.corpus.filters import choose_language_id
from pipeline.corpus.heldout import is_heldout_source, move_to_heldout
from pipeline.corpus.phases import (BAD_FILE_NAME, BUCKETS_PHASE, CLUSTER_PHASE, COMMIT_PLAN, FILTER_PHASE,
                                    INTERMEDIATE, SPLIT_PHASE, build_phases, collect_metrics, executor,
                                    quality_filters, raw_language_folder, top_up_plan)
from pipeline.corpus.reader import RAW_PATTERNS, find_raw_files, fingerprint_files, unreadable_names
from pipeline.corpus.report import markdown, step_key
from pipeline.corpus.sources import CLEAN_SPLITS
from pipeline.corpus.words import resolve_word_tokenizer
from pipeline.errors import StageError
from pipeline.json_files import read_json, write_json_atomic

log = logging.getLogger(__name__)

SLURM_JOBS = "slurm_jobs.json"


def describe_inputs(cfg: PipelineConfig) -> dict:
    folder = raw_language_folder(cfg.raw_dir, cfg.lang)
    files = find_raw_files(folder)
    if not files:
        raise StageError(
            f"No readable raw files for {cfg.lang.code} in {folder}: looked for {', '.join(RAW_PATTERNS)} "
            "(in subfolders too). Add files there or point raw_dir= elsewhere."
        )
    inputs = {"raw": {**fingerprint_files(folder, files), "unreadable_names": len(unreadable_names(folder))}}
    lid_model = choose_language_id(cfg.lang, cfg.clean.lid).fingerprint()
    return inputs if lid_model is None else {**inputs, "language_id_model": lid_model}


def _prepare_work_dir(run: StageRun, files: list[str], tasks: int) -> None:
    """Fix the task layout of this partial run; a resumed run with another layout starts afresh."""
    layout = run.work_dir / "task_layout.json"
    wanted = {"tasks": tasks, "files": files}
    if layout.exists() and json.loads(layout.read_text()) != wanted:
        log.info("The interrupted run in %s used another task layout; starting it afresh.", run.work_dir)
        shutil.rmtree(run.work_dir)
        run.work_dir.mkdir(parents=True)
    (run.work_dir / "raw_files.txt").write_text("".join(f"{name}\n" for name in files), encoding="utf-8")
    layout.write_text(json.dumps(wanted))


def _live_jobs(partial: Path) -> list[str]:
    """The Slurm jobs that an earlier submission of the run in `partial` left queued or running."""
    if not (partial / SLURM_JOBS).is_file():
        return []
    return slurm.live_jobs(read_json(partial / SLURM_JOBS)["job_ids"])


def kept_state(partial: Path) -> str:
    """What an interrupted clean left that a run continues from: finished datatrove tasks, jobs still at work."""
    kept = []
    finished = len(list(partial.glob("logs/*/completions/*")))
    if finished:
        kept.append(f"{finished} finished datatrove tasks")
    live = _live_jobs(partial)
    if live:
        kept.append(f"Slurm jobs still queued or running ({', '.join(live[:5])})")
    return " and ".join(kept)


def _write_bad_names(run: StageRun, names: list[str]) -> None:
    """Raw files whose names are not UTF-8 are bad records: logged beside the reader's (bad_records/)."""
    folder = run.work_dir / "bad_records"
    folder.mkdir(exist_ok=True)
    (folder / "file_names.jsonl").write_text("".join(
        json.dumps({"file": name, "line": 0, "reason": BAD_FILE_NAME}) + "\n" for name in names), encoding="utf-8")


def _commit_logs(run: StageRun) -> Path:
    # The commit job logs outside the folder it moves into place.
    return run.final_dir.parent / "logs" / f"clean-commit-{run.config_hash}"


def _check_slurm_script(run: StageRun) -> None:
    """Before anything is submitted: the folders and job names that datatrove writes into its batch scripts'
    shell lines (the config's checks made every #SBATCH value one token)."""
    for folder in (run.work_dir / "logs", _commit_logs(run)):
        check_script_word("work_dir", folder)
    for phase in (FILTER_PHASE, BUCKETS_PHASE, CLUSTER_PHASE, SPLIT_PHASE, "commit"):
        check_script_word("lang", f"clean-{run.lang}-{phase}")


def heldout_sources(cfg: PipelineConfig, folder: Path, files: list[str]) -> tuple[list[str], list[str]]:
    """The patterns of `clean.heldout_sources` and the raw files they hold out whole, saying which patterns match no
    file (they may still match records' `source`). Holding out every file would leave nothing to train on: refused
    for patterns the user gave; the language table's are dropped (its `ud_*` is the whole of a UD-only sample)."""
    patterns = heldout_source_patterns(cfg.clean, cfg.lang)
    if not patterns:
        return [], []
    for pattern in patterns:
        if not any(is_heldout_source(name, "", [pattern]) for name in files):
            log.info("clean %s: clean.heldout_sources pattern %r matches no raw file in %s (it holds out the records "
                     "whose `source` it matches).", cfg.lang.code, pattern, folder)
    held = [name for name in files if is_heldout_source(name, "", patterns)]
    if held and len(held) == len(files):
        if cfg.clean.heldout_sources is None:
            log.warning("clean %s: the language table's held-out sources %s would hold out every raw file in %s, "
                        "which leaves nothing to train on: none is held out. Give clean.heldout_sources=[...] to hold "
                        "out a source.", cfg.lang.code, patterns, folder)
            return [], []
        raise StageError(f"clean {cfg.lang.code}: clean.heldout_sources={list(patterns)} holds out every raw file in "
                         f"{folder}, which leaves nothing to train on. Narrow the patterns, or set "
                         "clean.heldout_sources=[] to hold out no source.")
    if held:
        log.info("clean %s: %d raw files held out whole (clean.heldout_sources, written to heldout_source/): %s",
                 cfg.lang.code, len(held), ", ".join(held[:10]) + (" ..." if len(held) > 10 else ""))
    return patterns, held


@dataclass
class CommitWhenDone:
    """The last step: turns the phases' statistics into the marker and commits the output; a datatrove pipeline step,
    so that on Slurm it is a job that waits for the phases.

    The statistics are summed, and the held-out top-up chosen, once: recorded in COMMIT_PLAN before any document
    moves, so that a commit killed on the way is finished by the same command with the same documents and counts
    (the intermediate folders it reads go only once the marker is written: the stage's scratch)."""

    run: StageRun

    def __call__(self, data=None, rank: int = 0, world_size: int = 1):
        run, cfg = self.run, self.run.cfg
        recorded = run.work_dir / COMMIT_PLAN
        if recorded.is_file():
            plan = read_json(recorded)
        else:
            metrics = collect_metrics(run.work_dir, cfg.clean.dedup.enabled)
            plan = top_up_plan(run.work_dir, cfg.clean, run.lang, raw_language_folder(cfg.raw_dir, cfg.lang), metrics)
            commit_step("clean: record the commit's plan")
            write_json_atomic(recorded, plan)
        metrics = plan["metrics"]
        move_to_heldout(run.work_dir / "train", run.work_dir / "heldout", plan["top_up"])
        for split in CLEAN_SPLITS:  # an empty split is an empty folder, which the later stages read as no documents
            (run.work_dir / split).mkdir(exist_ok=True)
        (run.work_dir / "report.md").write_text(markdown(run.lang, metrics), encoding="utf-8")
        run.commit(metrics)
        log.info(
            "clean %s: %d documents in, %d kept, %d held out, %d in held-out sources, %d rejected, %d bad records "
            "(per source: %s)", run.lang, metrics["docs_in"], metrics["docs_out"], metrics["docs_heldout"],
            metrics["docs_heldout_source"], sum(metrics["rejected"].values()), metrics["bad_records"],
            run.final_dir / "report.md",
        )
        return data


def run_clean(run: StageRun):
    cfg: PipelineConfig = run.cfg
    if cfg.cluster.executor == "slurm":
        _check_slurm_script(run)
    live = _live_jobs(run.work_dir)
    if live:
        raise StageError(f"clean {run.lang} was submitted to Slurm already and its jobs are still queued or running "
                         f"({', '.join(live[:10])}; {run.work_dir / SLURM_JOBS}). Wait for them (the marker appears "
                         f"in {run.final_dir}), or scancel them before submitting again.")
    folder = raw_language_folder(cfg.raw_dir, cfg.lang)
    files = find_raw_files(folder)
    tasks = min(cfg.clean.tasks or cfg.workers, len(files))
    _prepare_work_dir(run, files, tasks)
    bad_names = unreadable_names(folder)
    _write_bad_names(run, bad_names)
    tokenizer, tokenizer_name = resolve_word_tokenizer(cfg.lang)
    filters = quality_filters(run.work_dir, cfg.clean, cfg.lang, tokenizer)
    patterns, held = heldout_sources(cfg, folder, files)
    phases = build_phases(run.work_dir, folder, cfg.clean, cfg.lang, tasks, tokenizer, filters, patterns)
    language_id = choose_language_id(cfg.lang, cfg.clean.lid)
    # Falling back to the records' own label is worth a warning: web crawls get it wrong for small languages.
    log.log(logging.WARNING if language_id.model is None else logging.INFO, "clean %s: language ID by %s",
            cfg.lang.code, language_id.description)
    settings = {"filters": [(step_key(step), name) for name, step in filters], "language_id": language_id.marker(),
                "word_tokenizer": tokenizer_name, "input_files": files, "unreadable_names": bad_names,
                "heldout_source_patterns": patterns, "heldout_source_files": held}
    (run.work_dir / "settings.json").write_text(json.dumps(settings, ensure_ascii=False))

    log.info("clean %s: %d files in %s, %d tasks, %d local workers", cfg.lang.code, len(files), folder, tasks,
             min(cfg.workers, tasks))
    on_slurm = cfg.cluster.executor == "slurm"
    executors = []
    for name, pipeline, phase_tasks in phases:
        # Locally the phases run one after the other; on Slurm each job depends on the one before.
        depends = executors[-1] if on_slurm and executors else None
        job_name = f"clean-{cfg.lang.code}-{name}"
        executors.append(executor(cfg.cluster, cfg.workers, pipeline, phase_tasks, run.work_dir / "logs" / name,
                                  depends, job_name))
        if not on_slurm:
            log.info("clean %s: phase %s (%d tasks)", cfg.lang.code, name, phase_tasks)
            executors[-1].run()
    if not on_slurm:
        CommitWhenDone(run)()
        return None
    executors.append(executor(cfg.cluster, cfg.workers, [CommitWhenDone(run)], 1, _commit_logs(run), executors[-1],
                               f"clean-{cfg.lang.code}-commit"))
    try:
        executors[-1].run()  # submits the phases it depends on first
    except subprocess.CalledProcessError as error:
        raise StageError(f"clean {cfg.lang.code}: sbatch refused a job (exit code {error.returncode}; its message is "
                         f"above). Check the cluster options (cluster.partition, cluster.account, cluster.qos, "
                         f"cluster.sbatch_args); jobs submitted before it are listed in "
                         f"{run.work_dir / SLURM_JOBS}.") from None
    finally:
        submitted = [str(e.job_id) for e in executors if e.job_id not in (None, -1)]
        write_json_atomic(run.work_dir / SLURM_JOBS, {"job_ids": submitted})
    log.info("clean %s: submitted to Slurm (jobs %s); the marker appears in %s when the jobs finish.",
             cfg.lang.code, ", ".join(submitted), run.final_dir)
    return None


STAGE = Stage(
    name="clean",
    run=run_clean,
    config_sections=("clean", "lang"),
    # Parallelism and descriptive table fields do not change the output.
    unhashed_keys=("clean.tasks", "lang.name", "lang.flores", "lang.filters_source", "lang.in_hplt_v1_2"),
    kept_state=kept_state,
    describe_inputs=describe_inputs,
    scratch=INTERMEDIATE,
)
