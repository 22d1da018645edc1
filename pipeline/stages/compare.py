"""`stage=compare lang=<code> runs=[a,b]` (or `runs=all`, the default): one report on a language's
runs (`run=`, pipeline/run_folders.py) in `<work_dir>/<lang>/compare/` (pipeline/comparison/). Not a
stage of the recipe (stage=all does not run it) and not under the stage contract: like stage=status,
it reads what the runs' stages left, each run's evaluate report and its markers, whenever it is
asked, and writes the report again."""

from __future__ import annotations

import dataclasses
import logging

from pipeline.comparison.report import RunRecord, write_comparison
from pipeline.config_keys import flatten
from pipeline.errors import ConfigError
from pipeline.run_folders import ALL_RUNS, language_runs, shared_stages
from pipeline.stage_outputs import STAGE_OUTPUTS, EvaluateOutput, PretrainOutput
from pipeline.work_folder import DEFAULT_RUN, language_dir

log = logging.getLogger(__name__)

_STAGES = tuple(handle.stage for handle in STAGE_OUTPUTS)


def _record(cfg, name: str) -> RunRecord:
    """What the report takes of run `name`: its evaluate report, its stages' settings, its
    pretrain's metrics and what it shares."""
    in_run = dataclasses.replace(cfg, run=name)
    markers = {h.stage: h.at(in_run).marker for h in STAGE_OUTPUTS}
    settings = {}
    for marker in markers.values():
        settings.update(flatten((marker or {}).get("config") or {}))
    evaluate = EvaluateOutput.at(in_run)
    named = "" if name == DEFAULT_RUN else f" run={name}"
    command = f"python -m pipeline stage=evaluate lang={cfg.lang.code}{named}"
    report, why = None, f"its evaluate stage is not done (no {evaluate.marker_file}): {command}"
    if markers[EvaluateOutput.stage] is not None:
        try:
            report, why = evaluate.report.read(evaluate.report.path), ""
        except (OSError, ValueError) as error:
            why = (
                f"its {evaluate.report.path} cannot be read ({error}): delete "
                f"{evaluate.marker_file}, then {command}"
            )
    return RunRecord(
        name=name,
        evaluate=report,
        not_evaluated=why,
        settings=settings,
        pretrain=(markers[PretrainOutput.stage] or {}).get("metrics"),
        shares=shared_stages(cfg.work_dir, cfg.lang.code, name, _STAGES),
    )


def compare_runs(cfg) -> None:
    lang = cfg.lang.code
    found = language_runs(cfg.work_dir, lang, _STAGES)
    names = found if cfg.runs in (None, [ALL_RUNS]) else list(dict.fromkeys(cfg.runs))
    unknown = [name for name in names if name not in found]
    if unknown or not names:
        raise ConfigError(
            "runs",
            unknown or cfg.runs,
            [f"runs of {lang} in {language_dir(cfg.work_dir, lang)}: {', '.join(found)}"]
            if found
            else [
                f"none: {lang} has no run yet (python -m pipeline stage=all lang={lang} run=<name>)"
            ],
        )
    records = [_record(cfg, name) for name in names]
    report, text = write_comparison(language_dir(cfg.work_dir, lang), lang, records)
    for name, why in report["not_evaluated"].items():
        log.warning("compare %s: run %s is listed without scores: %s", lang, name, why)
    print(f"Compared {len(names)} run(s) of {lang}: {text}")
