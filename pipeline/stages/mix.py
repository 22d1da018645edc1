"""Stage `mix`: how often each source may be repeated and what fills the token budget ->
`plan.json`.

Measures the target language's clean output and the configured sources (`mix.sources`: related
languages, English, code), estimates their tokens from their UTF-8 bytes, plans the budget and
writes `plan.json`, `plan.md` and the table in the log (pipeline/mixing/estimate.py). Nothing is
copied: the later stages follow the plan, so repeated data is never stored twice.
"""

from __future__ import annotations

from pipeline.config import PipelineConfig
from pipeline.contract import Stage, StageRun
from pipeline.mixing.estimate import write_estimated_plan
from pipeline.mixing.report import plan_metrics
from pipeline.mixing.sources import locate_sources
from pipeline.stage_outputs import CleanOutput


def describe_inputs(cfg: PipelineConfig) -> dict:
    """The sources besides the target (whose clean hash the contract adds), by content: a changed
    source reruns the plan, a moved one does not (their paths are not hashed)."""
    found, skipped = locate_sources(cfg)
    described = {s.name: s.fingerprint for s in found}
    described.update({s.name: {"skipped": True} for s in skipped})
    return {"mix_sources": described}


def run_mix(run: StageRun) -> dict:
    cfg: PipelineConfig = run.cfg
    found, skipped = locate_sources(cfg)
    document = write_estimated_plan(
        run.work_dir,
        cfg.mix,
        run.lang,
        cfg.lang.script,
        run.output(CleanOutput).training_text(run.lang),
        found,
        skipped,
        cfg.work_dir,
        cfg.workers,
    )
    return plan_metrics(document, cfg.mix.rehydration.enabled)


STAGE = Stage(
    name="mix",
    run=run_mix,
    needs=("clean",),
    # The target's script (for the token estimate) is hashed by clean, whose hash this one covers.
    config_sections=("mix",),
    # Where a source is does not make the plan: its content does (describe_inputs), and plan.json
    # records paths inside the work folder relative to it, so that a moved work folder keeps its
    # plan.
    unhashed_keys=("mix.sources.*.path",),
    describe_inputs=describe_inputs,
)
