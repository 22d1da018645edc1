"""The mix stage's plan, estimated: how often each source may be repeated and what fills the token
budget.

Measures the target language's clean text and the configured sources (`mix.sources`: related
languages, English, code; sources.py), estimates their tokens from their UTF-8 bytes and their
script (`mix.bytes_per_token`), plans the budget (planner.py) and, with `mix.rehydration`, the
target's weights by duplicate-cluster size (rehydration.py); writes the plan as data and as text
(report.py) and logs its table. Nothing is copied: the later stages follow the plan, so repeated
data is never stored twice; the pack stage makes it exact with the tokens it counts.
"""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.corpus.sources import SourceInput, what_clean_kept
from pipeline.errors import StageError
from pipeline.mixing.mix_config import MixConfig
from pipeline.mixing.planner import (
    FIXED_BUDGET,
    Allocation,
    Plan,
    PlanError,
    Source,
    default_budget,
    plan_mixture,
)
from pipeline.mixing.rehydration import rehydrate
from pipeline.mixing.report import plan_document, rehydration_section, summary_table, write_plan
from pipeline.mixing.sources import Measurement, Skipped, measure
from pipeline.work_folder import record_path

log = logging.getLogger(__name__)

# Per source, in the mix stage's folder: the list of files read and the bad records found.
MEASURED = "sources"


def bytes_per_token(mix: MixConfig, script: str) -> float:
    return mix.bytes_per_token.get(script, mix.default_bytes_per_token)


def write_estimated_plan(
    folder: Path,
    mix: MixConfig,
    lang: str,
    script: str,
    target_text: SourceInput,
    found: list[SourceInput],
    skipped: list[Skipped],
    work_dir: str,
    workers: int,
) -> dict:
    """Plan the mix of `target_text` (the clean output of `lang`, written in `script`) and the
    configured sources that were `found` (sources.locate_sources); write the plan to `folder` and
    return it. Paths inside the work folder `work_dir` are recorded relative to it, so that a moved
    work folder keeps its plan."""
    for s in skipped:
        log.warning("mix %s: source `%s` skipped (%s): %s", lang, s.name, s.path, s.reason)
    scripts = {**{source.name: source.script for source in mix.sources}, lang: script}

    measured = {
        s.name: measure(s, folder / MEASURED / s.name, workers) for s in (target_text, *found)
    }
    target, others = _planned_sources(mix, lang, target_text, found, measured, scripts)
    budget, budget_from = _budget(mix, target, others)
    try:
        plan = plan_mixture(budget, target, others)
    except PlanError as error:
        raise StageError(f"mix {lang}: {error}") from None
    _warn_short_of_ratio(lang, plan)

    rehydration = {"enabled": False}
    if mix.rehydration.enabled:
        rehydration = _rehydration(
            mix, lang, measured[lang], plan.allocations[0], bytes_per_token(mix, script)
        )

    facts = {
        s.name: _source_facts(mix, s, measured[s.name], scripts[s.name], work_dir)
        for s in (target_text, *found)
    }
    skipped_facts = [
        {"name": s.name, "path": record_path(work_dir, s.path), "reason": s.reason} for s in skipped
    ]
    document = plan_document(lang, plan, facts, budget_from, skipped_facts, rehydration)
    write_plan(folder, document)
    log.info("mix plan for %s: %s\n%s", lang, document["verdict"], summary_table(document))
    return document


def _planned_sources(
    mix: MixConfig,
    lang: str,
    target_text: SourceInput,
    found: list[SourceInput],
    measured: dict[str, Measurement],
    scripts: dict[str, str],
) -> tuple[Source, list[Source]]:
    """The target and the `found` sources as the planner takes them, their unique tokens estimated
    from the bytes `measured` and their `scripts`. A target with no text is an error: there is
    nothing to plan around."""
    configured = {source.name: source for source in mix.sources}

    def unique_tokens(name: str) -> int:
        return round(measured[name].bytes / bytes_per_token(mix, scripts[name]))

    target = Source(lang, unique_tokens(lang), mix.max_epochs)
    if target.unique_tokens == 0:
        raise StageError(
            f"mix {lang}: the clean stage kept no training text of {lang} ({target_text.folder}): "
            f"{what_clean_kept(target_text.path)}. Check the raw input of {lang} and its filters "
            f"(lang.filters.*, clean.lid)."
        )
    others = [
        Source(
            s.name,
            unique_tokens(s.name),
            configured[s.name].max_epochs,
            configured[s.name].priority,
            configured[s.name].ratio,
            configured[s.name].optional,
        )
        for s in found
    ]
    return target, others


def _budget(mix: MixConfig, target: Source, others: list[Source]) -> tuple[int, str]:
    """The token budget, and where it comes from (for the plan's text)."""
    if mix.tokens is not None:
        return round(mix.tokens), FIXED_BUDGET
    return (
        default_budget(target, others),
        "mix.tokens not set: the target's unique tokens x mix.max_epochs, plus the fixed ratios",
    )


def _warn_short_of_ratio(lang: str, plan: Plan) -> None:
    """Warn of each source with a fixed ratio that has too little text to fill its share."""
    for allocation in plan.allocations:
        source = allocation.source
        if source.ratio is not None and plan.share(allocation) < source.ratio - 1e-6:
            log.warning(
                "mix %s: source `%s` gives %.1f%% of the budget, less than its ratio %g: its %s "
                "unique tokens "
                "at most %g epochs (mix.sources) are all there is. Give it more text for the full "
                "share.",
                lang,
                source.name,
                100 * plan.share(allocation),
                source.ratio,
                f"{source.unique_tokens:,}",
                source.max_epochs,
            )


def _source_facts(
    mix: MixConfig, source: SourceInput, measured: Measurement, script: str, work_dir: str
) -> dict:
    """What the plan records of one measured source."""
    return {
        "input": source.kind,
        "path": record_path(work_dir, source.path),
        "script": script,
        "documents": measured.docs,
        "bad_records": measured.bad_records,
        "unique_bytes": measured.bytes,
        "bytes_per_token": bytes_per_token(mix, script),
    }


def _rehydration(
    mix: MixConfig,
    lang: str,
    target: Measurement,
    allocation: Allocation,
    target_bytes_per_token: float,
) -> dict:
    table = [(row.min_cluster_size, row.weight) for row in mix.rehydration.weights]
    if target.docs_without_cluster_size:
        log.warning(
            "mix %s: %d documents have no duplicate-cluster size (clean ran without "
            "deduplication); "
            "rehydration counts them as size 1.",
            lang,
            target.docs_without_cluster_size,
        )
    return rehydration_section(
        rehydrate(target.by_cluster_size, table, allocation.epochs),
        table,
        target_bytes_per_token,
        allocation.effective_tokens,
        target.docs_without_cluster_size,
    )
