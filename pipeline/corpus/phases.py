"""The clean stage's datatrove pipeline: its filters, its four phases, the executors that run them (local processes
or Slurm jobs), and the last step that sums the statistics into the marker.

1. read (bad records counted, never fatal) -> language ID -> Gopher repetition -> Gopher quality
   -> C4 (off by default) -> FineWeb quality -> intermediate shards + MinHash signatures;
2. MinHash buckets;  3. MinHash clusters (with cluster sizes, for the mix stage's rehydration);
4. drop near-duplicates (keeping one per cluster, annotated with its cluster size) -> the documents of the raw files
   that `clean.heldout_sources` names to `heldout_source/` -> held-out split by document-id hash -> `train/` and
   `heldout/` shards.

Every rejected document is written under `rejected/<filter>/` with its reason in its metadata; a tally after the
reader and after each step that removes or routes documents counts them per raw file (pipeline/corpus/source_counts.py).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from pipeline.commit_steps import commit_step
from pipeline.contract import StageRun
from pipeline.json_files import read_json, write_json_atomic
from pipeline.corpus.filters import DeclaredLanguageFilter, LocalLanguageFilter, choose_language_id
from pipeline.corpus.heldout import HeldoutSourceSplit, HeldoutSplit, choose_top_up, move_to_heldout
from pipeline.corpus.reader import RAW_PATTERNS, RawCorpusReader, TaskOutputReader
from pipeline.corpus.report import count, markdown, step_key, summed_stats
from pipeline.corpus.source_counts import HELDOUT, HELDOUT_SOURCE, READ, SourceTally, moved_to_heldout, per_source
from pipeline.corpus.sources import CLEAN_SPLITS
from pipeline.corpus.words import minhash_word_tokenizer
from pipeline.errors import StageError

log = logging.getLogger(__name__)

FILTER_PHASE, BUCKETS_PHASE = "1_filter", "2_minhash_buckets"
CLUSTER_PHASE, SPLIT_PHASE = "3_minhash_clusters", "4_dedup_split"
TALLIES = "source_counts"
# The commit's statistics and the documents it moves to the held-out split (CommitWhenDone).
COMMIT_PLAN = "commit_plan.json"
# What the phases write for the phases after them and the commit: gone once the marker is written.
INTERMEDIATE = ("filtered", "minhash", TALLIES, COMMIT_PLAN)
BAD_FILE_NAME = "file_name_not_utf8"
DUPLICATES = "minhash_duplicate"


def raw_language_folder(cfg) -> Path:
    """`${raw_dir}/<lang>/`, accepting any of the language's codes as the folder name (HPLT uses `nb`)."""
    lang = cfg.lang
    root = Path(cfg.raw_dir)
    names = [lang.code, lang.hplt_code, lang.iso639_1, *lang.aliases]
    for name in filter(None, names):
        if (root / name).is_dir():
            return root / name
    raise StageError(
        f"No raw input for {lang.code}: none of {', '.join(str(root / n) for n in dict.fromkeys(filter(None, names)))} "
        f"is a directory. Put {', '.join(RAW_PATTERNS)} files in {root / lang.code}/ or point raw_dir= at "
        f"a folder with a {lang.code}/ subfolder."
    )


def _rejected(work: Path, name: str):
    from datatrove.pipeline.writers import JsonlWriter

    return JsonlWriter(str(work / "rejected" / name))


def quality_filters(run: StageRun, tokenizer) -> list[tuple[str, object]]:
    """(name, datatrove filter) pairs: language ID, then the quality and repetition filters that `clean` switches on,
    with the language's thresholds (`lang.filters`); the name keys `rejected/<name>/` and `metrics.rejected`."""
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter, GopherQualityFilter,
                                            GopherRepetitionFilter)


    cfg, clean, work = run.cfg, run.cfg.clean, run.work_dir
    lang, limits = cfg.lang, cfg.lang.filters
    chosen = []
    language_id = choose_language_id(lang, clean.lid)
    if language_id.model is not None:
        chosen.append(("language_id", LocalLanguageFilter, dict(model_path=str(language_id.model),
                                                                 labels=list(language_id.labels),
                                                                 threshold=language_id.threshold)))
    else:
        chosen.append(("declared_language", DeclaredLanguageFilter, dict(lang=lang)))
    if clean.gopher_repetition:
        chosen.append(("gopher_repetition", GopherRepetitionFilter, dict(
            dup_line_frac=limits.dup_line_frac,
            top_n_grams=tuple((limit.n, limit.max_fraction) for limit in limits.top_n_grams),
            dup_n_grams=tuple((limit.n, limit.max_fraction) for limit in limits.dup_n_grams),
            language=tokenizer,
        )))
    if clean.gopher_quality:
        chosen.append(("gopher_quality", GopherQualityFilter, dict(
            min_doc_words=clean.gopher_min_doc_words,
            min_avg_word_length=limits.min_avg_word_length,
            max_avg_word_length=limits.max_avg_word_length,
            max_non_alpha_words_ratio=limits.max_non_alpha_words_ratio,
            stop_words=list(limits.stopwords) if limits.stopwords else None,
            min_stop_words=2 if limits.stopwords else None,
            language=tokenizer,
        )))
    if clean.c4:
        chosen.append(("c4_quality", C4QualityFilter, dict(language=tokenizer)))
    if clean.fineweb_quality:
        chosen.append(("fineweb_quality", FineWebQualityFilter, dict(
            line_punct_thr=limits.line_punct_thr, new_line_ratio=limits.new_line_ratio,
            char_duplicates_ratio=limits.char_duplicates_ratio, language=tokenizer,
        )))
    return [(name, cls(exclusion_writer=_rejected(work, name), **kwargs)) for name, cls, kwargs in chosen]


def _tally(run: StageRun, label: str) -> SourceTally:
    return SourceTally(run.work_dir / TALLIES, label)


def _split_and_write(run: StageRun, heldout_sources: list[str]) -> list:
    from datatrove.pipeline.writers import JsonlWriter


    work, clean = run.work_dir, run.cfg.clean

    def writer(split: str):
        return JsonlWriter(str(work / split), max_file_size=clean.shard_bytes)

    return [
        HeldoutSourceSplit(heldout_sources, writer("heldout_source")),
        _tally(run, HELDOUT_SOURCE),
        HeldoutSplit(clean.heldout_fraction, writer("heldout")), _tally(run, HELDOUT),
        writer("train"),
    ]


def _minhash_config(clean):
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    d = clean.dedup
    return MinhashConfig(n_grams=d.n_grams, num_buckets=d.num_buckets, hashes_per_bucket=d.hashes_per_bucket, seed=d.seed)


def build_phases(run: StageRun, tasks: int, tokenizer, filters: list[tuple[str, object]],
                 heldout_sources: list[str]) -> list[tuple[str, list, int]]:
    """The phases as (name, datatrove pipeline, number of tasks), from the (name, step) pairs of `quality_filters`;
    the documents of `heldout_sources` (patterns) go to `heldout_source/`."""
    from datatrove.pipeline.dedup.minhash import (MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                                  MinhashDedupSignature)
    from datatrove.pipeline.writers import JsonlWriter


    work, clean = run.work_dir, run.cfg.clean
    reader = RawCorpusReader(str(raw_language_folder(run.cfg)), str(work / "raw_files.txt"), str(work / "bad_records"),
                             max_record_bytes=clean.max_record_bytes)
    filtering = [reader, _tally(run, READ)]
    for name, step in filters:
        filtering += [step, _tally(run, name)]
    if not clean.dedup.enabled:
        return [(FILTER_PHASE, filtering + _split_and_write(run, heldout_sources), tasks)]

    minhash, words = _minhash_config(clean), minhash_word_tokenizer(run.cfg.lang, tokenizer)
    signatures, buckets, clusters = (str(work / "minhash" / part) for part in ("signatures", "buckets", "clusters"))
    return [
        (FILTER_PHASE, filtering + [
            JsonlWriter(str(work / "filtered")),
            MinhashDedupSignature(signatures, config=minhash, language=words),
        ], tasks),
        (BUCKETS_PHASE, [MinhashDedupBuckets(signatures, buckets, config=minhash)], minhash.num_buckets),
        (CLUSTER_PHASE, [MinhashDedupCluster(buckets, clusters, config=minhash, save_cluster_size=True)], 1),
        (SPLIT_PHASE, [
            # Not the intermediate file's path (datatrove's `file_path`): it is gone once the stage is done.
            TaskOutputReader(str(work / "filtered"), add_file_path=False),
            MinhashDedupFilter(clusters, exclusion_writer=_rejected(work, DUPLICATES), load_cluster_sizes=True),
            _tally(run, DUPLICATES),
            *_split_and_write(run, heldout_sources),
        ], tasks),
    ]


def collect_metrics(run: StageRun) -> dict:
    from datatrove.pipeline.dedup.minhash import MinhashDedupFilter


    logs = run.work_dir / "logs"
    stats = summed_stats(logs / FILTER_PHASE)
    split_stats = stats if not run.cfg.clean.dedup.enabled else summed_stats(logs / SPLIT_PHASE)
    reader = stats.get(step_key(RawCorpusReader), {})
    settings = json.loads((run.work_dir / "settings.json").read_text())

    rejected, reasons = {}, {}
    for name, key in settings["filters"]:
        rejected[key] = int(stats.get(name, {}).get("dropped", 0))
        for counter, value in stats.get(name, {}).items():
            if counter.startswith("dropped_"):
                reasons[f"{key}.{counter.removeprefix('dropped_')}"] = int(value)
    duplicates = count(split_stats, MinhashDedupFilter, "dropped")
    if run.cfg.clean.dedup.enabled:
        rejected[DUPLICATES] = duplicates

    bad_by_reason = {k.removeprefix("bad_records."): int(v) for k, v in reader.items() if k.startswith("bad_records.")}
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
        "sources": per_source(run.work_dir / TALLIES, list(rejected), settings["input_files"]),
    }
    accounted = metrics["docs_out"] + metrics["docs_heldout"] + metrics["docs_heldout_source"] + sum(rejected.values())
    if accounted != metrics["docs_in"]:
        log.warning("clean: %d documents read but %d accounted for (kept + held out + held-out source + rejected).",
                    metrics["docs_in"], accounted)
    return metrics


def top_up_plan(run: StageRun, metrics: dict) -> dict:
    """The commit's plan: the documents that top the held-out split up to `clean.heldout_min_documents` (at most a
    quarter of the kept documents) and the metrics with them moved; warns when the corpus is too small for it."""
    minimum, kept, heldout = run.cfg.clean.heldout_min_documents, metrics["docs_out"], metrics["docs_heldout"]
    wanted = min(minimum, (kept + heldout) // 4)
    chosen, moved = choose_top_up(run.work_dir / "train", wanted - heldout)
    docs, chars = sum(d for d, _ in moved.values()), sum(c for _, c in moved.values())
    if docs:
        log.warning("clean %s: clean.heldout_fraction=%g of %d kept documents held out %d; %d more are held out "
                    "(those with the smallest id hashes) to reach %d.", run.lang, run.cfg.clean.heldout_fraction,
                    kept + heldout, heldout, docs, wanted)
    if heldout + docs < minimum:
        log.warning("clean %s: only %d documents kept, too few for clean.heldout_min_documents=%d: %d held out (a "
                    "quarter), so held-out scores will be noisy. Add text to %s if you can.", run.lang, kept + heldout,
                    minimum, heldout + docs, raw_language_folder(run.cfg))
    metrics = {**metrics, "docs_out": kept - docs, "docs_heldout": heldout + docs,
               "chars_out": metrics["chars_out"] - chars, "chars_heldout": metrics["chars_heldout"] + chars,
               "heldout_added_for_minimum": docs, "sources": moved_to_heldout(metrics["sources"], moved)}
    return {"metrics": metrics, "top_up": chosen}


@dataclass
class CommitWhenDone:
    """The last step: turns the statistics into the marker. A datatrove pipeline step, for Slurm.

    The statistics are summed, and the held-out top-up chosen, once: recorded in COMMIT_PLAN before any document
    moves, so that a commit killed on the way is finished by the same command with the same documents and counts
    (the intermediate folders it reads go only once the marker is written: the stage's scratch)."""

    run: StageRun

    def __call__(self, data=None, rank: int = 0, world_size: int = 1):
        recorded = self.run.work_dir / COMMIT_PLAN
        if recorded.is_file():
            plan = read_json(recorded)
        else:
            plan = top_up_plan(self.run, collect_metrics(self.run))
            commit_step("clean: record the commit's plan")
            write_json_atomic(recorded, plan)
        metrics = plan["metrics"]
        move_to_heldout(self.run.work_dir / "train", self.run.work_dir / "heldout", plan["top_up"])
        for split in CLEAN_SPLITS:  # an empty split is an empty folder, which the later stages read as no documents
            (self.run.work_dir / split).mkdir(exist_ok=True)
        (self.run.work_dir / "report.md").write_text(markdown(self.run.lang, metrics), encoding="utf-8")
        self.run.commit(metrics)
        log.info(
            "clean %s: %d documents in, %d kept, %d held out, %d in held-out sources, %d rejected, %d bad records "
            "(per source: %s)", self.run.lang, metrics["docs_in"], metrics["docs_out"], metrics["docs_heldout"],
            metrics["docs_heldout_source"], sum(metrics["rejected"].values()), metrics["bad_records"],
            self.run.final_dir / "report.md",
        )
        return data


def executor(cfg, pipeline: list, tasks: int, logging_dir: Path, depends, job_name: str):
    if cfg.cluster.executor == "slurm":
        from datatrove.executor.slurm import SlurmPipelineExecutor

        # datatrove writes `--option` for an empty value, `--option=True` for true.
        sbatch_args = {key: "" if value is True else value for key, value in cfg.cluster.sbatch_args.items()}
        if cfg.cluster.account:
            sbatch_args["account"] = cfg.cluster.account
        return SlurmPipelineExecutor(
            pipeline=pipeline, tasks=tasks, time=cfg.cluster.cpu_time, partition=cfg.cluster.partition,
            cpus_per_task=cfg.cluster.cpus_per_task, mem_per_cpu_gb=cfg.cluster.mem_per_cpu_gb, qos=cfg.cluster.qos,
            job_name=job_name, logging_dir=str(logging_dir), depends=depends, sbatch_args=sbatch_args,
            env_command=cfg.cluster.env_command, slurm_logs_folder=str(logging_dir / "slurm"),
        )
    from datatrove.executor.local import LocalPipelineExecutor

    return LocalPipelineExecutor(
        pipeline=pipeline, tasks=tasks, workers=min(cfg.workers, tasks), logging_dir=str(logging_dir),
        depends=depends,
    )
