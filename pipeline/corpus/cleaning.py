"""A run of the clean pipeline (phases.py) in a work folder: the raw files it reads and those
`clean.heldout_sources` holds out whole, its settings, its phases run here one after the other or
submitted as Slurm jobs that depend on each other, and its end: the statistics summed into the
metrics, the held-out split topped up and `report.md` written. Raw files whose names are not valid
UTF-8 are bad records of their own (`file_name_not_utf8`), the files beside them are read.

On Slurm, datatrove pickles each phase's executor into the work folder (`logs/<phase>/executor.pik`,
which its jobs load) and writes the folder paths unquoted into the batch script: those paths are
checked to hold no shell syntax (pipeline/cluster.py) before anything is submitted. The submitted
job ids are kept in `slurm_jobs.json`, so that a second submission while they are queued or running
is refused (pipeline/slurm.py asks squeue).

Run here, each phase logs a line when it starts and progress lines (pipeline/progress.py) until it
ends: the filter phase from the bytes its tasks report having read (progress_files.py), the others
at their end, with their documents or bytes per second.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Optional

from pipeline import slurm
from pipeline.cluster import ClusterConfig, check_script_word
from pipeline.commit_steps import commit_step
from pipeline.corpus.clean_config import CleanConfig, LanguageIdConfig, heldout_source_patterns
from pipeline.corpus.filters import choose_language_id
from pipeline.corpus.heldout import is_heldout_source, move_to_heldout
from pipeline.corpus.phases import (
    BAD_FILE_NAME,
    COMMIT_PLAN,
    FILTER_PHASE,
    PHASES,
    TASK_BAD_RECORDS,
    TASK_PROGRESS,
    build_phases,
    collect_metrics,
    executor,
    phase_work,
    quality_filters,
    raw_language_folder,
    top_up_plan,
)
from pipeline.corpus.progress_files import watched
from pipeline.corpus.reader import RAW_PATTERNS, find_raw_files, fingerprint_files, unreadable_names
from pipeline.corpus.report import REPORT_TEXT_FILE, markdown, step_key
from pipeline.corpus.sources import CLEAN_SPLITS, HELDOUT_SPLIT, TRAIN_SPLIT
from pipeline.corpus.task_layout import LAYOUT_FILE, plan_layout
from pipeline.corpus.words import resolve_word_tokenizer
from pipeline.errors import StageError
from pipeline.json_files import read_json, write_json_atomic
from pipeline.languages import LanguageConfig
from pipeline.progress import Progress

log = logging.getLogger(__name__)

SLURM_JOBS = "slurm_jobs.json"
# A phase: its name, its datatrove pipeline and its number of tasks.
Phase = tuple[str, list, int]


def describe_raw_input(raw_dir: str, lang: LanguageConfig, lid: LanguageIdConfig) -> dict:
    """The raw files of `lang` by content, and the language-ID model's: what the clean output is
    made from."""
    folder = raw_language_folder(raw_dir, lang)
    files = find_raw_files(folder)
    if not files:
        raise StageError(
            f"No readable raw files for {lang.code} in {folder}: looked for "
            f"{', '.join(RAW_PATTERNS)} "
            "(in subfolders too). Add files there or point raw_dir= elsewhere."
        )
    inputs = {
        "raw": {
            **fingerprint_files(folder, files),
            "unreadable_names": len(unreadable_names(folder)),
        }
    }
    lid_model = choose_language_id(lang, lid).fingerprint()
    return inputs if lid_model is None else {**inputs, "language_id_model": lid_model}


def _prepare_work_dir(work: Path, layout: dict) -> None:
    """Fix the task layout of this partial run; a resumed run with another layout (other workers or
    `clean.tasks`) starts afresh: its tasks' files would not match."""
    recorded = work / LAYOUT_FILE
    if recorded.exists() and json.loads(recorded.read_text()) != layout:
        log.info("The interrupted run in %s used another task layout; starting it afresh.", work)
        shutil.rmtree(work)
        work.mkdir(parents=True)
    recorded.write_text(json.dumps(layout))


def _live_jobs(partial: Path) -> list[str]:
    """The Slurm jobs that an earlier submission of the run in `partial` left queued or running."""
    if not (partial / SLURM_JOBS).is_file():
        return []
    return slurm.live_jobs(read_json(partial / SLURM_JOBS)["job_ids"])


def kept_state(partial: Path) -> str:
    """What an interrupted clean left that a run continues from: finished datatrove tasks, jobs
    still at work."""
    kept = []
    finished = len(list(partial.glob("logs/*/completions/*")))
    if finished:
        kept.append(f"{finished} finished datatrove tasks")
    live = _live_jobs(partial)
    if live:
        kept.append(f"Slurm jobs still queued or running ({', '.join(live[:5])})")
    return " and ".join(kept)


def _write_bad_names(work: Path, names: list[str]) -> None:
    """Raw files whose names are not UTF-8 are bad records: logged beside the reader's
    (bad_records/)."""
    folder = work / "bad_records"
    folder.mkdir(exist_ok=True)
    (folder / "file_names.jsonl").write_text(
        "".join(
            json.dumps({"file": name, "line": 0, "reason": BAD_FILE_NAME}) + "\n" for name in names
        ),
        encoding="utf-8",
    )


def _check_slurm_script(work: Path, last_logs: Path, lang: str) -> None:
    """Before anything is submitted: the folders and job names that datatrove writes into its batch
    scripts' shell lines (the config's checks made every #SBATCH value one token)."""
    for folder in (work / "logs", last_logs):
        check_script_word("work_dir", folder)
    for phase in (*PHASES, "commit"):
        check_script_word("lang", f"clean-{lang}-{phase}")


def heldout_sources(
    clean: CleanConfig, lang: LanguageConfig, folder: Path, files: list[str]
) -> tuple[list[str], list[str]]:
    """The patterns of `clean.heldout_sources` and the raw files they hold out whole, saying which
    patterns match no file (they may still match records' `source`). Holding out every file would
    leave nothing to train on: refused for patterns the user gave; the language table's are dropped
    (its `ud_*` is the whole of a UD-only sample)."""
    patterns = heldout_source_patterns(clean, lang)
    if not patterns:
        return [], []
    for pattern in patterns:
        if not any(is_heldout_source(name, "", [pattern]) for name in files):
            log.info(
                "clean %s: clean.heldout_sources pattern %r matches no raw file in %s (it holds "
                "out the records "
                "whose `source` it matches).",
                lang.code,
                pattern,
                folder,
            )
    held = [name for name in files if is_heldout_source(name, "", patterns)]
    if held and len(held) == len(files):
        if clean.heldout_sources is None:
            log.warning(
                "clean %s: the language table's held-out sources %s would hold out every raw file "
                "in %s, "
                "which leaves nothing to train on: none is held out. Give "
                "clean.heldout_sources=[...] to hold "
                "out a source.",
                lang.code,
                patterns,
                folder,
            )
            return [], []
        raise StageError(
            f"clean {lang.code}: clean.heldout_sources={list(patterns)} holds out every raw file "
            "in "
            f"{folder}, which leaves nothing to train on. Narrow the patterns, or set "
            "clean.heldout_sources=[] to hold out no source."
        )
    if held:
        log.info(
            "clean %s: %d raw files held out whole (clean.heldout_sources, written to "
            "heldout_source/): %s",
            lang.code,
            len(held),
            ", ".join(held[:10]) + (" ..." if len(held) > 10 else ""),
        )
    return patterns, held


def prepare_phases(
    work: Path,
    final_dir: Path,
    last_logs: Path,
    raw_dir: str,
    clean: CleanConfig,
    lang: LanguageConfig,
    cluster: ClusterConfig,
    workers: int,
) -> list[Phase]:
    """The phases of a run in the partial folder `work` (its output goes to `final_dir`; the last
    step logs in `last_logs`), after the checks that come before anything is submitted; writes the
    run's raw file list, task layout and settings."""
    if cluster.executor == "slurm":
        _check_slurm_script(work, last_logs, lang.code)
    live = _live_jobs(work)
    if live:
        raise StageError(
            f"clean {lang.code} was submitted to Slurm already and its jobs are still queued or "
            "running "
            f"({', '.join(live[:10])}; {work / SLURM_JOBS}). Wait for them (the marker appears in "
            f"{final_dir}), or scancel them before submitting again."
        )
    folder = raw_language_folder(raw_dir, lang)
    files = find_raw_files(folder)
    layout = plan_layout(folder, files, clean.tasks or workers, clean.min_part_bytes)
    _prepare_work_dir(work, layout)
    tasks = len(layout["tasks"])
    bad_names = unreadable_names(folder)
    _write_bad_names(work, bad_names)
    tokenizer, tokenizer_name = resolve_word_tokenizer(lang)
    filters = quality_filters(work, clean, lang, tokenizer)
    patterns, held = heldout_sources(clean, lang, folder, files)
    phases = build_phases(work, folder, clean, lang, tasks, tokenizer, filters, patterns)
    language_id = choose_language_id(lang, clean.lid)
    # Falling back to the records' own label is worth a warning: web crawls get it wrong for small
    # languages.
    log.log(
        logging.WARNING if language_id.model is None else logging.INFO,
        "clean %s: language ID by %s",
        lang.code,
        language_id.description,
    )
    settings = {
        "filters": [(step_key(step), name) for name, step in filters],
        "language_id": language_id.marker(),
        "word_tokenizer": tokenizer_name,
        "input_files": files,
        "unreadable_names": bad_names,
        "heldout_source_patterns": patterns,
        "heldout_source_files": held,
    }
    (work / "settings.json").write_text(json.dumps(settings, ensure_ascii=False))
    split = {index for pieces in layout["tasks"] for index, _, parts in pieces if parts > 1}
    log.info(
        "clean %s: %d files in %s (%d read in parts), %d tasks, %d local workers",
        lang.code,
        len(files),
        folder,
        len(split),
        tasks,
        min(workers, tasks),
    )
    return phases


def run_phases(
    work: Path,
    phases: list[Phase],
    cluster: ClusterConfig,
    workers: int,
    lang: str,
    last_step: Callable,
    last_logs: Path,
) -> Optional[list[str]]:
    """Run the phases and then `last_step` (a datatrove pipeline step, which commits the output):
    here, one after the other, returning None; or on Slurm, each job depending on the one before,
    returning the submitted jobs."""
    on_slurm = cluster.executor == "slurm"
    executors = []
    for name, pipeline, phase_tasks in phases:
        # Locally the phases run one after the other; on Slurm each job depends on the one before.
        depends = executors[-1] if on_slurm and executors else None
        executors.append(
            executor(
                cluster,
                workers,
                pipeline,
                phase_tasks,
                work / "logs" / name,
                depends,
                f"clean-{lang}-{name}",
            )
        )
        if not on_slurm:
            _run_here(work, name, executors[-1], lang)
    if not on_slurm:
        last_step()
        return None
    executors.append(
        executor(cluster, workers, [last_step], 1, last_logs, executors[-1], f"clean-{lang}-commit")
    )
    try:
        executors[-1].run()  # submits the phases it depends on first
    except subprocess.CalledProcessError as error:
        raise StageError(
            f"clean {lang}: sbatch refused a job (exit code {error.returncode}; its message is "
            f"above). Check the cluster options (cluster.partition, cluster.account, cluster.qos, "
            f"cluster.sbatch_args); jobs submitted before it are listed in "
            f"{work / SLURM_JOBS}."
        ) from None
    finally:
        submitted = [str(e.job_id) for e in executors if e.job_id not in (None, -1)]
        write_json_atomic(work / SLURM_JOBS, {"job_ids": submitted})
    return submitted


def _run_here(work: Path, name: str, phase, lang: str) -> None:
    """Run the phase here, with a log line when it starts and progress lines until it ends."""
    ranks = phase.get_incomplete_ranks(range(phase.world_size))
    log.info("clean %s: phase %s (%d tasks, %d to run)", lang, name, phase.world_size, len(ranks))
    what = f"clean {lang}: phase {name}"
    if name == FILTER_PHASE:
        shares = read_json(work / LAYOUT_FILE)["task_bytes"]
        with (
            Progress(what, sum(shares[rank] for rank in ranks), "B", log) as progress,
            watched(progress, work / TASK_PROGRESS, ranks),
        ):
            phase.run()
        return
    total, unit = phase_work(work, name)
    with Progress(what, total, unit, log) as progress:
        phase.run()
        progress.update(total)


def _gather_bad_records(work: Path) -> None:
    """The tasks' bad records, in task order (input order), into `bad_records/records.jsonl`: the
    same file whatever the task layout."""
    folder = work / "bad_records"
    folder.mkdir(exist_ok=True)
    with open(folder / ".records.jsonl.tmp", "wb") as gathered:
        for task_log in sorted((work / TASK_BAD_RECORDS).glob("*.jsonl")):
            with open(task_log, "rb") as records:
                shutil.copyfileobj(records, gathered)
    os.replace(folder / ".records.jsonl.tmp", folder / "records.jsonl")


def finish_output(work: Path, clean: CleanConfig, lang: LanguageConfig, raw_dir: str) -> dict:
    """The end of a run whose phases are done: the statistics summed and the held-out top-up chosen
    once (recorded in COMMIT_PLAN before any document moves, so that an end killed on the way is
    finished by the same command with the same documents and counts), the top-up moved, every split
    there and the report written. Returns the marker's metrics."""
    recorded = work / COMMIT_PLAN
    if recorded.is_file():
        plan = read_json(recorded)
    else:
        metrics = collect_metrics(work, clean.dedup.enabled)
        plan = top_up_plan(work, clean, lang.code, raw_language_folder(raw_dir, lang), metrics)
        commit_step("clean: record the commit's plan")
        write_json_atomic(recorded, plan)
    metrics = plan["metrics"]
    move_to_heldout(work / TRAIN_SPLIT, work / HELDOUT_SPLIT, plan["top_up"])
    _gather_bad_records(work)
    for split in (
        CLEAN_SPLITS
    ):  # an empty split is an empty folder, which the later stages read as no documents
        (work / split).mkdir(exist_ok=True)
    (work / REPORT_TEXT_FILE).write_text(markdown(lang.code, metrics), encoding="utf-8")
    return metrics
