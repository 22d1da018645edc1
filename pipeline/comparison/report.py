"""One report on several runs of a language (`stage=compare`): each run's held-out bits per byte
and task accuracies as its evaluate stage reported them, the settings that differ between the runs,
what each run's pretrain cost, which run it continued and which outputs it shares. A run without a
finished evaluate stage is listed with the reason, never left out. Written as `report.json`,
`report.md` and `bpb.png` (each run's final model on each held-out set).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from pipeline.progress import duration
from pipeline.json_files import write_json_atomic

# Beside the default run's stage folders: <work_dir>/<lang>/compare/.
COMPARE_FOLDER = "compare"
REPORT_FILE, REPORT_TEXT_FILE, BPB_PLOT = "report.json", "report.md", "bpb.png"


@dataclass(frozen=True)
class RunRecord:
    """What the report takes of one run, read from its outputs by the stage module."""

    name: str
    # Its evaluate stage's report.json; None while that stage is not done.
    evaluate: Optional[dict]
    # Why it has none, with the command that makes it.
    not_evaluated: str
    # The settings its stages' markers record (their hashed configs), as flattened keys.
    settings: dict[str, Any]
    # Its pretrain marker's metrics; None while pretrain is not done.
    pretrain: Optional[dict]
    # Stage -> the run whose output it shares (pipeline/run_folders.py).
    shares: dict[str, str]


def _scores(evaluate: dict) -> dict:
    """Model -> held-out set -> its bits per byte and, where reported, the 95% interval."""
    return {
        model: {
            name: {key: result[key] for key in ("bits_per_byte", "interval_95") if key in result}
            for name, result in by_set.items()
        }
        for model, by_set in evaluate.get("scores", {}).items()
    }


def _tasks(evaluate: dict) -> dict:
    """Task -> model -> scoring -> accuracy."""
    return {
        task: {
            model: {scoring: result["accuracy"] for scoring, result in by_scoring.items()}
            for model, by_scoring in about.get("results", {}).items()
        }
        for task, about in evaluate.get("tasks", {}).items()
    }


def differing_settings(records: list[RunRecord]) -> dict[str, dict[str, Any]]:
    """Key -> run -> value, for the keys that hold more than one value among the runs that record
    them (a run whose stage is not done yet records none of its keys: no difference)."""
    keys = sorted({key for record in records for key in record.settings})
    values = {key: {r.name: r.settings[key] for r in records if key in r.settings} for key in keys}
    return {
        key: by_run
        for key, by_run in values.items()
        if len({json.dumps(value, sort_keys=True) for value in by_run.values()}) > 1
    }


def comparison(lang: str, records: list[RunRecord]) -> dict:
    """The report as data (report.json)."""
    evaluated = [record for record in records if record.evaluate is not None]
    metrics = {record.name: record.pretrain for record in records if record.pretrain is not None}
    return {
        "lang": lang,
        "runs": [record.name for record in records],
        "not_evaluated": {r.name: r.not_evaluated for r in records if r.evaluate is None},
        "settings": differing_settings(records),
        "scores": {record.name: _scores(record.evaluate) for record in evaluated},
        "tasks": {record.name: _tasks(record.evaluate) for record in evaluated},
        "cost": {
            name: {key: m.get(key) for key in ("steps", "tokens", "seconds", "tokens_per_s")}
            for name, m in metrics.items()
        },
        "continued_from": {
            name: m["continued_from"] for name, m in metrics.items() if "continued_from" in m
        },
        "shares": {record.name: record.shares for record in records if record.shares},
    }


def _setting(value) -> str:
    """A setting as the command line writes it (`scratch`, `0.001`, `null`, `[a, b]`)."""
    return value if isinstance(value, str) else json.dumps(value)


def _number(value, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def _score_cell(result: Optional[dict]) -> str:
    if result is None:
        return "-"
    interval = result.get("interval_95")
    shown = _number(result["bits_per_byte"])
    return f"{shown} [{_number(interval[0])}, {_number(interval[1])}]" if interval else shown


def _scores_section(report: dict) -> list[str]:
    scores = report["scores"]
    sets = list(
        dict.fromkeys(s for by_model in scores.values() for m in by_model.values() for s in m)
    )
    if not sets:
        return []
    rows = [
        [f"{run} · {model}", *(_score_cell(by_set.get(name)) for name in sets)]
        for run, by_model in scores.items()
        for model, by_set in by_model.items()
    ]
    return [
        "## Held-out bits per byte",
        "",
        "Lower is better; [95% interval] where the evaluate stage reports one. Each run's models "
        "as its evaluate stage scored them.",
        "",
        *_table(["run · model", *sets], rows),
    ]


def _tasks_section(report: dict) -> list[str]:
    columns = list(
        dict.fromkeys(
            (task, scoring)
            for by_task in report["tasks"].values()
            for task, by_model in by_task.items()
            for by_scoring in by_model.values()
            for scoring in by_scoring
        )
    )
    if not columns:
        return []
    rows = [
        [
            f"{run} · {model}",
            *(
                _number(by_task.get(task, {}).get(model, {}).get(scoring), 3)
                for task, scoring in columns
            ),
        ]
        for run, by_task in report["tasks"].items()
        for model in dict.fromkeys(m for by_model in by_task.values() for m in by_model)
    ]
    header = ["run · model", *(f"{task} ({scoring})" for task, scoring in columns)]
    return ["## Task accuracy", "", *_table(header, rows)]


def _cost_section(report: dict) -> list[str]:
    if not report["cost"]:
        return []
    rows = []
    for run, cost in report["cost"].items():
        lineage = report["continued_from"].get(run)
        started = (
            f"{lineage['run']} at step {lineage['step']} ({lineage['tokens']:,} tokens)"
            if lineage
            else "-"
        )
        rows.append(
            [
                run,
                f"{cost['steps']:,}" if cost["steps"] is not None else "-",
                f"{cost['tokens']:,}" if cost["tokens"] is not None else "-",
                "-" if cost["seconds"] is None else duration(cost["seconds"]),
                f"{cost['tokens_per_s']:,.0f}" if cost["tokens_per_s"] is not None else "-",
                started,
            ]
        )
    header = ["run", "steps", "tokens", "wall time", "tokens/s", "continued from"]
    return [
        "## Cost of pretrain",
        "",
        "A continued run's steps and tokens count on from the run it continued; its wall time and "
        "tokens/s are its own.",
        "",
        *_table(header, rows),
    ]


def markdown(report: dict) -> str:
    settings = report["settings"]
    lines = [f"# Runs of {report['lang']} compared", "", f"Runs: {', '.join(report['runs'])}.", ""]
    for run, why in report["not_evaluated"].items():
        lines.append(f"- **{run}: not evaluated**: {why}")
    lines += [""] if report["not_evaluated"] else []
    if settings:
        rows = [
            [key, *(_setting(by_run[run]) if run in by_run else "-" for run in report["runs"])]
            for key, by_run in settings.items()
        ]
        lines += ["## Settings that differ", "", *_table(["key", *report["runs"]], rows)]
    else:
        lines += ["The runs' recorded settings are the same.", ""]
    lines += _scores_section(report) + _tasks_section(report) + _cost_section(report)
    if report["shares"]:
        lines += ["## Shared outputs", ""]
        lines += [
            f"- {run}: {', '.join(f'{stage} (of {owner})' for stage, owner in shares.items())}"
            for run, shares in report["shares"].items()
        ]
        lines.append("")
    if report["scores"]:
        lines += [f"![Held-out bits per byte of each run's final model]({BPB_PLOT})", ""]
    return "\n".join(lines)


def write_plot(report: dict, path: Path) -> None:
    """Bars per held-out set, one per run: its final model's bits per byte, with its interval."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    finals = {
        run: list(by_model.values())[-1] for run, by_model in report["scores"].items() if by_model
    }
    sets = list(dict.fromkeys(name for by_set in finals.values() for name in by_set))
    figure, axis = plt.subplots(figsize=(max(6, 2.5 * len(sets)), 3.8))
    width = 0.8 / max(1, len(finals))
    for place, (run, by_set) in enumerate(finals.items()):
        positions = [i + (place - (len(finals) - 1) / 2) * width for i in range(len(sets))]
        values = [by_set.get(name, {}).get("bits_per_byte", float("nan")) for name in sets]
        errors = [
            [
                v - by_set[n]["interval_95"][0] if "interval_95" in by_set.get(n, {}) else 0
                for v, n in zip(values, sets)
            ],
            [
                by_set[n]["interval_95"][1] - v if "interval_95" in by_set.get(n, {}) else 0
                for v, n in zip(values, sets)
            ],
        ]
        bars = axis.bar(positions, values, width, yerr=errors, capsize=3, label=run)
        axis.bar_label(bars, fmt="%.3f", fontsize=7)
    axis.set_xticks(range(len(sets)), sets)
    axis.set_ylabel("bits per byte (lower is better)")
    axis.set_title(f"{report['lang']}: each run's final model")
    axis.legend()
    figure.tight_layout()
    partial = path.with_name(f".{path.name}.tmp")
    figure.savefig(partial, dpi=120, format="png")
    plt.close(figure)
    os.replace(partial, path)


def write_comparison(
    language_folder: Path, lang: str, records: list[RunRecord]
) -> tuple[dict, Path]:
    """Write report.json, report.md and (when a run was evaluated) bpb.png into the language
    folder's COMPARE_FOLDER; returns the report and where report.md is."""
    folder = language_folder / COMPARE_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    report = comparison(lang, records)
    if report["scores"]:
        write_plot(report, folder / BPB_PLOT)
    else:
        (folder / BPB_PLOT).unlink(missing_ok=True)  # an earlier comparison's
    text = folder / REPORT_TEXT_FILE
    partial = text.with_name(f".{text.name}.tmp")
    partial.write_text(markdown(report), encoding="utf-8")
    os.replace(partial, text)
    write_json_atomic(folder / REPORT_FILE, report)
    return report, text
