"""Stage `mix`: how often each source may be repeated and what fills the token budget -> `plan.json`.

Measures the target language's clean output and the configured sources (`mix.sources`: related
languages, English, code), estimates their tokens from their UTF-8 bytes, plans the budget
(pipeline/mixing/planner.py) and writes `plan.json`, `plan.md` and the table in the log. Nothing is
copied: the later stages follow the plan, so repeated data is never stored twice.
"""

from __future__ import annotations

import logging

from pipeline.config import PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.corpus.sources import clean_output
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
from pipeline.mixing.planner import FIXED_BUDGET, Allocation, PlanError, Source, default_budget, plan_mixture
from pipeline.mixing.rehydration import rehydrate
from pipeline.mixing.report import markdown, plan_document, rehydration_section, summary_table
from pipeline.mixing.sources import Measurement, locate_sources, measure
from pipeline.work_folder import portable_path, read_marker

log = logging.getLogger(__name__)


def describe_inputs(cfg: PipelineConfig) -> dict:
    """The sources besides the target (whose clean hash the contract adds), by content: a changed source reruns
    the plan, a moved one does not (their paths are not hashed)."""
    found, skipped = locate_sources(cfg)
    described = {s.name: s.fingerprint for s in found}
    described.update({s.name: {"skipped": True} for s in skipped})
    return {"mix_sources": described}


def bytes_per_token(mix, script: str) -> float:
    return mix.bytes_per_token.get(script, mix.default_bytes_per_token)


def run_mix(run: StageRun) -> dict:
    cfg, mix, lang = run.cfg, run.cfg.mix, run.cfg.lang.code
    found, skipped = locate_sources(cfg)
    for s in skipped:
        log.warning("mix %s: source `%s` skipped (%s): %s", lang, s.name, s.path, s.reason)
    target_input = clean_output(lang, run.input("clean"))
    configured = {source.name: source for source in mix.sources}
    scripts = {**{name: source.script for name, source in configured.items()}, lang: cfg.lang.script}

    measured = {s.name: measure(s, run.work_dir / "sources" / s.name, cfg.workers) for s in (target_input, *found)}

    def unique_tokens(name: str) -> int:
        return round(measured[name].bytes / bytes_per_token(mix, scripts[name]))

    target = Source(lang, unique_tokens(lang), mix.max_epochs)
    if target.unique_tokens == 0:
        kept = read_marker(run.input("clean"))["metrics"]
        rejected = ", ".join(f"{name} {count:,}" for name, count in kept["rejected"].items() if count) or "none"
        raise StageError(f"mix {lang}: the clean stage kept no training text of {lang} ({target_input.folder}): "
                         f"{kept['docs_out']:,} of {kept['docs_in']:,} documents kept, rejected by {rejected}, "
                         f"{kept['bad_records']:,} bad records ({run.input('clean') / 'report.md'}). Check the raw "
                         f"input of {lang} and its filters (lang.filters.*, clean.lid).")
    others = [Source(s.name, unique_tokens(s.name), configured[s.name].max_epochs, configured[s.name].priority,
                     configured[s.name].ratio, configured[s.name].optional) for s in found]
    if mix.tokens is not None:
        budget, budget_from = round(mix.tokens), FIXED_BUDGET
    else:
        budget = default_budget(target, others)
        budget_from = "mix.tokens not set: the target's unique tokens x mix.max_epochs, plus the fixed ratios"
    try:
        plan = plan_mixture(budget, target, others)
    except PlanError as error:
        raise StageError(f"mix {lang}: {error}") from None

    for allocation in plan.allocations:
        source = allocation.source
        if source.ratio is not None and plan.share(allocation) < source.ratio - 1e-6:
            log.warning("mix %s: source `%s` gives %.1f%% of the budget, less than its ratio %g: its %s unique tokens "
                        "at most %g epochs (mix.sources) are all there is. Give it more text for the full share.",
                        lang, source.name, 100 * plan.share(allocation), source.ratio,
                        f"{source.unique_tokens:,}", source.max_epochs)
    rehydration = {"enabled": False}
    if mix.rehydration.enabled:
        rehydration = _rehydration(mix, lang, measured[lang], plan.allocations[0],
                                   bytes_per_token(mix, scripts[lang]))

    facts = {s.name: {"input": s.kind, "path": portable_path(cfg, s.path), "script": scripts[s.name],
                      "documents": measured[s.name].docs, "bad_records": measured[s.name].bad_records,
                      "unique_bytes": measured[s.name].bytes,
                      "bytes_per_token": bytes_per_token(mix, scripts[s.name])}
             for s in (target_input, *found)}
    skipped_facts = [{"name": s.name, "path": portable_path(cfg, s.path), "reason": s.reason} for s in skipped]
    document = plan_document(lang, plan, facts, budget_from, skipped_facts, rehydration)
    write_json_atomic(run.work_dir / "plan.json", document)
    (run.work_dir / "plan.md").write_text(markdown(document), encoding="utf-8")
    log.info("mix plan for %s: %s\n%s", lang, document["verdict"], summary_table(document))
    return _metrics(document, mix.rehydration.enabled)


def _rehydration(mix, lang: str, target: Measurement, allocation: Allocation, target_bytes_per_token: float) -> dict:
    table = [(row.min_cluster_size, row.weight) for row in mix.rehydration.weights]
    if target.docs_without_cluster_size:
        log.warning("mix %s: %d documents have no duplicate-cluster size (clean ran without deduplication); "
                    "rehydration counts them as size 1.", lang, target.docs_without_cluster_size)
    return rehydration_section(rehydrate(target.by_cluster_size, table, allocation.epochs), table,
                               target_bytes_per_token, allocation.effective_tokens, target.docs_without_cluster_size)


def _metrics(document: dict, rehydration: bool) -> dict:
    """The marker's metrics: the plan's totals, and per source its epochs and effective tokens."""
    by_source = {s["name"]: s for s in document["sources"]}
    return {
        "budget_tokens": document["budget_tokens"],
        "planned_tokens": document["planned_tokens"],
        "budget_met": document["budget_met"],
        "shortfall_tokens": document["shortfall_tokens"],
        "effective_tokens": document["effective_tokens"],
        "unique_tokens_est": {name: s["unique_tokens_est"] for name, s in by_source.items()},
        "epochs": {name: s["epochs"] for name, s in by_source.items()},
        "tokens": {name: s["tokens"] for name, s in by_source.items()},
        "effective_tokens_by_source": {name: s["effective_tokens"] for name, s in by_source.items()},
        "skipped_sources": [s["name"] for s in document["skipped_sources"]],
        "rehydration": rehydration,
    }


STAGE = Stage(
    name="mix",
    run=run_mix,
    needs=("clean",),
    # The target's script (for the token estimate) is hashed by clean, whose hash this one covers.
    config_sections=("mix",),
    # Where a source is does not make the plan: its content does (describe_inputs), and plan.json records paths
    # inside the work folder relative to it, so that a moved work folder keeps its plan.
    unhashed_keys=("mix.sources.*.path",),
    describe_inputs=describe_inputs,
)
