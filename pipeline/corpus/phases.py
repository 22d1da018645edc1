"""The clean stage's datatrove pipeline: its filters, its five phases, the executors that run them
(local processes or Slurm jobs), the statistics summed into metrics and the held-out top-up's plan.
Plain values in (the work folder, the `clean` section, the language's table entry): cleaning.py runs
it, pipeline/stages/clean.py under the stage contract.

1. read the task's parts of the raw files (task_layout.py; bad records counted, never fatal) ->
   language ID -> Gopher repetition -> Gopher quality -> C4 (off by default) -> FineWeb quality ->
   intermediate shards + MinHash signatures;
2. MinHash buckets (each bucket's hash range shared by `tasks // num_buckets` tasks);
3. MinHash clusters (one task; with cluster sizes, for the mix stage's rehydration);
4. drop near-duplicates (keeping one per cluster, annotated with its cluster size) -> the documents
   of the raw files that `clean.heldout_sources` names to `heldout_source/` -> held-out split by
   document-id hash -> `train/` and `heldout/`, staged per task;
5. the staged documents merged into the output shards (shards.py).

Every rejected document is written under `rejected/<filter>/` with its reason in its metadata; a
tally after the reader and after each step that removes or routes documents counts them per raw file
(pipeline/corpus/source_counts.py).

Phases 1 and 4 run one task per run of raw-file parts (task_layout.py), so that each task's documents
come after those of the task before: datatrove's MinHash keeps, of each cluster, the document that
its union-find makes the root, which depends only on the order of (task, document) pairs, and so is
the same for any layout (minhash.py keeps it so with more bucket tasks, and for tasks without
duplicates).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from pipeline.cluster import ClusterConfig
from pipeline.corpus.clean_config import CleanConfig
from pipeline.corpus.filters import DeclaredLanguageFilter, LocalLanguageFilter, choose_language_id
from pipeline.corpus.heldout import HeldoutSourceSplit, HeldoutSplit, choose_top_up
from pipeline.corpus.reader import RAW_PATTERNS, TaskOutputReader
from pipeline.corpus.report import count, step_key, summed_stats
from pipeline.corpus.shards import STAGED, MergeShards, staged_writer
from pipeline.corpus.source_counts import (
    HELDOUT,
    HELDOUT_SOURCE,
    READ,
    SourceTally,
    moved_to_heldout,
    per_source,
)
from pipeline.corpus.task_layout import LAYOUT_FILE, LayoutReader
from pipeline.corpus.words import minhash_word_tokenizer
from pipeline.errors import StageError
from pipeline.languages import FilterThresholds, LanguageConfig

log = logging.getLogger(__name__)

FILTER_PHASE, BUCKETS_PHASE = "1_filter", "2_minhash_buckets"
CLUSTER_PHASE, SPLIT_PHASE = "3_minhash_clusters", "4_dedup_split"
MERGE_PHASE = "5_merge_shards"
PHASES = (FILTER_PHASE, BUCKETS_PHASE, CLUSTER_PHASE, SPLIT_PHASE, MERGE_PHASE)
TALLIES = "source_counts"
# The commit's statistics and the documents it moves to the held-out split (cleaning.finish_output).
COMMIT_PLAN = "commit_plan.json"
# Each task's bad records (the commit gathers them into bad_records/) and input read so far.
TASK_BAD_RECORDS, TASK_PROGRESS = "task_bad_records", "task_progress"
# What the phases write for the phases after them and the commit: gone once the marker is written.
INTERMEDIATE = (
    "filtered",
    "minhash",
    TALLIES,
    COMMIT_PLAN,
    STAGED,
    TASK_BAD_RECORDS,
    TASK_PROGRESS,
)
BAD_FILE_NAME = "file_name_not_utf8"
DUPLICATES = "minhash_duplicate"


def raw_language_folder(raw_dir: str, lang: LanguageConfig) -> Path:
    """`${raw_dir}/<lang>/`, accepting any of the language's codes as the folder name (HPLT uses
    `nb`)."""
    root = Path(raw_dir)
    names = [lang.code, lang.hplt_code, lang.iso639_1, *lang.aliases]
    for name in filter(None, names):
        if (root / name).is_dir():
            return root / name
    raise StageError(
        f"No raw input for {lang.code}: none of "
        f"{', '.join(str(root / n) for n in dict.fromkeys(filter(None, names)))} "
        f"is a directory. Put {', '.join(RAW_PATTERNS)} files in {root / lang.code}/ or point "
        "raw_dir= at "
        f"a folder with a {lang.code}/ subfolder."
    )


def _rejected(work: Path, name: str):
    return staged_writer(work, f"rejected/{name}")


def quality_filters(
    work: Path, clean: CleanConfig, lang: LanguageConfig, tokenizer
) -> list[tuple[str, object]]:
    """(name, datatrove filter) pairs: language ID, then the quality and repetition filters that
    `clean` switches on, with the language's thresholds (`lang.filters`); the name keys
    `rejected/<name>/` and `metrics.rejected`."""
    from datatrove.pipeline.filters import (
        C4QualityFilter,
        FineWebQualityFilter,
        GopherQualityFilter,
        GopherRepetitionFilter,
    )

    limits = lang.filters
    chosen = [_language_filter(clean, lang)]
    if clean.gopher_repetition:
        chosen.append(
            (
                "gopher_repetition",
                GopherRepetitionFilter,
                _gopher_repetition_options(limits, tokenizer),
            )
        )
    if clean.gopher_quality:
        chosen.append(
            (
                "gopher_quality",
                GopherQualityFilter,
                _gopher_quality_options(clean, limits, tokenizer),
            )
        )
    if clean.c4:
        chosen.append(("c4_quality", C4QualityFilter, dict(language=tokenizer)))
    if clean.fineweb_quality:
        chosen.append(
            ("fineweb_quality", FineWebQualityFilter, _fineweb_quality_options(limits, tokenizer))
        )
    return [
        (name, cls(exclusion_writer=_rejected(work, name), **kwargs))
        for name, cls, kwargs in chosen
    ]


def _language_filter(clean: CleanConfig, lang: LanguageConfig) -> tuple[str, type, dict]:
    """(name, filter class, options) of the language ID: the model that `clean.lid` chooses, or
    the records' declared language where there is none."""
    language_id = choose_language_id(lang, clean.lid)
    if language_id.model is None:
        return "declared_language", DeclaredLanguageFilter, dict(lang=lang)
    return (
        "language_id",
        LocalLanguageFilter,
        dict(
            model_path=str(language_id.model),
            labels=list(language_id.labels),
            threshold=language_id.threshold,
        ),
    )


def _gopher_repetition_options(limits: FilterThresholds, tokenizer) -> dict:
    return dict(
        dup_line_frac=limits.dup_line_frac,
        top_n_grams=tuple((limit.n, limit.max_fraction) for limit in limits.top_n_grams),
        dup_n_grams=tuple((limit.n, limit.max_fraction) for limit in limits.dup_n_grams),
        language=tokenizer,
    )


def _gopher_quality_options(clean: CleanConfig, limits: FilterThresholds, tokenizer) -> dict:
    """Gopher's quality thresholds; the stop-word rule only where the language lists stop words."""
    return dict(
        min_doc_words=clean.gopher_min_doc_words,
        min_avg_word_length=limits.min_avg_word_length,
        max_avg_word_length=limits.max_avg_word_length,
        max_non_alpha_words_ratio=limits.max_non_alpha_words_ratio,
        stop_words=list(limits.stopwords) if limits.stopwords else None,
        min_stop_words=2 if limits.stopwords else None,
        language=tokenizer,
    )


def _fineweb_quality_options(limits: FilterThresholds, tokenizer) -> dict:
    return dict(
        line_punct_thr=limits.line_punct_thr,
        new_line_ratio=limits.new_line_ratio,
        char_duplicates_ratio=limits.char_duplicates_ratio,
        language=tokenizer,
    )


def _tally(work: Path, label: str) -> SourceTally:
    return SourceTally(work / TALLIES, label)


def _split_and_write(work: Path, clean: CleanConfig, heldout_sources: list[str]) -> list:
    return [
        HeldoutSourceSplit(heldout_sources, staged_writer(work, "heldout_source")),
        _tally(work, HELDOUT_SOURCE),
        HeldoutSplit(clean.heldout_fraction, staged_writer(work, "heldout")),
        _tally(work, HELDOUT),
        staged_writer(work, "train"),
    ]


def _minhash_config(clean):
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    d = clean.dedup
    return MinhashConfig(
        n_grams=d.n_grams,
        num_buckets=d.num_buckets,
        hashes_per_bucket=d.hashes_per_bucket,
        seed=d.seed,
    )


def build_phases(
    work: Path,
    raw_folder: Path,
    clean: CleanConfig,
    lang: LanguageConfig,
    tasks: int,
    tokenizer,
    filters: list[tuple[str, object]],
    heldout_sources: list[str],
) -> list[tuple[str, list, int]]:
    """The phases, working in `work` with the `tasks` of its task layout, as (name, datatrove
    pipeline, number of tasks), from the (name, step) pairs of `quality_filters`; the documents of
    `heldout_sources` (patterns) go to `heldout_source/`."""
    from datatrove.pipeline.dedup.minhash import MinhashDedupCluster, MinhashDedupSignature
    from datatrove.pipeline.writers import JsonlWriter

    from pipeline.corpus.minhash import EveryTaskFilter, SharedBuckets, bucket_tasks

    reader = LayoutReader(
        str(raw_folder),
        str(work / LAYOUT_FILE),
        str(work / TASK_BAD_RECORDS),
        str(work / TASK_PROGRESS),
        max_record_bytes=clean.max_record_bytes,
    )
    filtering = [reader, _tally(work, READ)]
    for name, step in filters:
        filtering += [step, _tally(work, name)]
    merge = (MERGE_PHASE, [MergeShards(work, clean.shard_bytes)], tasks)
    if not clean.dedup.enabled:
        split = filtering + _split_and_write(work, clean, heldout_sources)
        return [(FILTER_PHASE, split, tasks), merge]

    minhash, words = _minhash_config(clean), minhash_word_tokenizer(lang, tokenizer)
    signatures, buckets, clusters = (
        str(work / "minhash" / part) for part in ("signatures", "buckets", "clusters")
    )
    return [
        (
            FILTER_PHASE,
            filtering
            + [
                JsonlWriter(str(work / "filtered")),
                MinhashDedupSignature(signatures, config=minhash, language=words),
            ],
            tasks,
        ),
        (
            BUCKETS_PHASE,
            [SharedBuckets(signatures, buckets, config=minhash)],
            bucket_tasks(minhash.num_buckets, tasks),
        ),
        (
            CLUSTER_PHASE,
            [MinhashDedupCluster(buckets, clusters, config=minhash, save_cluster_size=True)],
            1,
        ),
        (
            SPLIT_PHASE,
            [
                # Not the intermediate file's path (datatrove's `file_path`): it is gone once the
                # stage is done.
                TaskOutputReader(str(work / "filtered"), add_file_path=False),
                EveryTaskFilter(
                    clusters, exclusion_writer=_rejected(work, DUPLICATES), load_cluster_sizes=True
                ),
                _tally(work, DUPLICATES),
                *_split_and_write(work, clean, heldout_sources),
            ],
            tasks,
        ),
        merge,
    ]


def phase_work(work: Path, name: str) -> tuple[int, str]:
    """What a phase after the filter phase works through, and its unit, for its progress lines:
    the documents that the filters kept (the MinHash phases), or the bytes staged (the merge)."""
    from datatrove.pipeline.writers import JsonlWriter

    if name == MERGE_PHASE:
        return sum(path.stat().st_size for path in (work / STAGED).rglob("*.jsonl")), "B"
    return count(summed_stats(work / "logs" / FILTER_PHASE), JsonlWriter, "total"), "docs"


def collect_metrics(work: Path, deduplicated: bool) -> dict:
    """The statistics of the phases that ran in `work`, summed into the marker's metrics."""
    from datatrove.pipeline.dedup.minhash import MinhashDedupFilter

    logs = work / "logs"
    stats = summed_stats(logs / FILTER_PHASE)
    split_stats = stats if not deduplicated else summed_stats(logs / SPLIT_PHASE)
    reader = stats.get(step_key(LayoutReader), {})
    settings = json.loads((work / "settings.json").read_text())

    rejected, reasons = {}, {}
    for name, key in settings["filters"]:
        rejected[key] = int(stats.get(name, {}).get("dropped", 0))
        for counter, value in stats.get(name, {}).items():
            if counter.startswith("dropped_"):
                reasons[f"{key}.{counter.removeprefix('dropped_')}"] = int(value)
    duplicates = count(split_stats, MinhashDedupFilter, "dropped")
    if deduplicated:
        rejected[DUPLICATES] = duplicates

    bad_by_reason = {
        k.removeprefix("bad_records."): int(v)
        for k, v in reader.items()
        if k.startswith("bad_records.")
    }
    if settings["unreadable_names"]:
        bad_by_reason[BAD_FILE_NAME] = len(settings["unreadable_names"])
    metrics = {
        "docs_in": int(reader.get("docs_in", 0)),
        "docs_out": count(split_stats, HeldoutSplit, "train"),
        "docs_heldout": count(split_stats, HeldoutSplit, "heldout"),
        "bad_records": int(reader.get("bad_records", 0)) + len(settings["unreadable_names"]),
        "bad_records_by_reason": bad_by_reason,
        "rejected": rejected,
        "rejected_by_reason": reasons,
        "duplicates_removed": duplicates,
        "chars_in": int(reader.get("chars_in", 0)),
        "chars_out": count(split_stats, HeldoutSplit, "train_chars"),
        "chars_heldout": count(split_stats, HeldoutSplit, "heldout_chars"),
        "docs_heldout_source": count(split_stats, HeldoutSourceSplit, "heldout_source"),
        "chars_heldout_source": count(split_stats, HeldoutSourceSplit, "heldout_source_chars"),
        "heldout_source_patterns": settings["heldout_source_patterns"],
        "heldout_source_files": settings["heldout_source_files"],
        "language_id": settings["language_id"],
        "word_tokenizer": settings["word_tokenizer"],
        "input_files": len(settings["input_files"]),
        "sources": per_source(work / TALLIES, list(rejected), settings["input_files"]),
    }
    accounted = (
        metrics["docs_out"]
        + metrics["docs_heldout"]
        + metrics["docs_heldout_source"]
        + sum(rejected.values())
    )
    if accounted != metrics["docs_in"]:
        log.warning(
            "clean: %d documents read but %d accounted for (kept + held out + held-out source + "
            "rejected).",
            metrics["docs_in"],
            accounted,
        )
    return metrics


def top_up_plan(work: Path, clean: CleanConfig, lang: str, raw_folder: Path, metrics: dict) -> dict:
    """The commit's plan: the documents of `work/train` that top the held-out split up to
    `clean.heldout_min_documents` (at most a quarter of the kept documents) and the metrics with
    them moved; warns when the corpus is too small for it."""
    minimum, kept, heldout = (
        clean.heldout_min_documents,
        metrics["docs_out"],
        metrics["docs_heldout"],
    )
    wanted = min(minimum, (kept + heldout) // 4)
    chosen, moved = choose_top_up(work / "train", wanted - heldout)
    docs, chars = sum(d for d, _ in moved.values()), sum(c for _, c in moved.values())
    if docs:
        log.warning(
            "clean %s: clean.heldout_fraction=%g of %d kept documents held out %d; %d more are "
            "held out "
            "(those with the smallest id hashes) to reach %d.",
            lang,
            clean.heldout_fraction,
            kept + heldout,
            heldout,
            docs,
            wanted,
        )
    if heldout + docs < minimum:
        log.warning(
            "clean %s: only %d documents kept, too few for clean.heldout_min_documents=%d: %d held "
            "out (a "
            "quarter), so held-out scores will be noisy. Add text to %s if you can.",
            lang,
            kept + heldout,
            minimum,
            heldout + docs,
            raw_folder,
        )
    metrics = {
        **metrics,
        "docs_out": kept - docs,
        "docs_heldout": heldout + docs,
        "chars_out": metrics["chars_out"] - chars,
        "chars_heldout": metrics["chars_heldout"] + chars,
        "heldout_added_for_minimum": docs,
        "sources": moved_to_heldout(metrics["sources"], moved),
    }
    return {"metrics": metrics, "top_up": chosen}


def executor(
    cluster: ClusterConfig,
    workers: int,
    pipeline: list,
    tasks: int,
    logging_dir: Path,
    depends,
    job_name: str,
):
    """The phase's datatrove executor: `workers` local processes, or a Slurm job (array) on
    `cluster`."""
    if cluster.executor == "slurm":
        from datatrove.executor.slurm import SlurmPipelineExecutor

        # datatrove writes `--option` for an empty value, `--option=True` for true.
        sbatch_args = {
            key: "" if value is True else value for key, value in cluster.sbatch_args.items()
        }
        if cluster.account:
            sbatch_args["account"] = cluster.account
        return SlurmPipelineExecutor(
            pipeline=pipeline,
            tasks=tasks,
            time=cluster.cpu_time,
            partition=cluster.partition,
            cpus_per_task=cluster.cpus_per_task,
            mem_per_cpu_gb=cluster.mem_per_cpu_gb,
            qos=cluster.qos,
            job_name=job_name,
            logging_dir=str(logging_dir),
            depends=depends,
            sbatch_args=sbatch_args,
            env_command=cluster.env_command,
            slurm_logs_folder=str(logging_dir / "slurm"),
        )
    from datatrove.executor.local import LocalPipelineExecutor

    return LocalPipelineExecutor(
        pipeline=pipeline,
        tasks=tasks,
        workers=min(workers, tasks),
        logging_dir=str(logging_dir),
        depends=depends,
    )
