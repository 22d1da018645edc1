"""The clean stage's statistics and `report.md`: datatrove's per-task statistics read back and
summed, and where each raw file's documents and characters went (training, held out, held-out
source, or which filter removed them).

datatrove writes `<logging_dir>/stats/<rank>.json` for every finished task (a list with one entry
per pipeline step: its name and counters). Summing the per-task files, rather than trusting the
merged `stats.json`, gives the right totals when a run was resumed or ran as Slurm jobs.

Numbers in reports and logs (the mix and tokenizer reports use them too) have three significant
digits and a unit prefix (2.63M tokens, 2.63 MB).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

# The clean stage's report, beside its splits.
REPORT_TEXT_FILE = "report.md"
_SPLITS = (("train", "out"), ("held out", "heldout"), ("held-out source", "heldout_source"))


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return [
        "| " + " | ".join(header) + " |",
        "|" + "---|" * len(header),
        *("| " + " | ".join(row) + " |" for row in rows),
    ]


def _rows(sources: dict[str, dict], filters: list[str], unit: str, shown) -> list[list[str]]:
    """One row per source and a total: `unit` (`docs` or `chars`) in, kept share, each split and
    each filter."""
    totals = {"in": 0, **{key: 0 for _, key in _SPLITS}, **{name: 0 for name in filters}}
    rows = []
    for name, entry in sources.items():
        values = {
            "in": entry[f"{unit}_in"],
            **{key: entry[f"{unit}_{key}"] for _, key in _SPLITS},
            **{
                f: entry["rejected" if unit == "docs" else "chars_rejected"].get(f, 0)
                for f in filters
            },
        }
        for key, value in values.items():
            totals[key] += value
        rows.append([f"`{name}`", *_cells(values, filters, shown)])
    if len(sources) > 1:
        rows.append(["**all**", *_cells(totals, filters, shown)])
    return rows


def _cells(values: dict, filters: list[str], shown) -> list[str]:
    kept = sum(values[key] for _, key in _SPLITS)
    return [
        shown(values["in"]),
        _share(kept, values["in"]),
        *(shown(values[key]) for _, key in _SPLITS),
        *(
            f"{shown(values[f])} ({_share(values[f], values['in'])})" if values[f] else "0"
            for f in filters
        ),
    ]


def _names(names: list[str]) -> str:
    return ", ".join(f"`{name}`" for name in names) or "none"


def markdown(lang: str, metrics: dict) -> str:
    sources, filters = metrics["sources"], list(metrics["rejected"])
    header = [
        "raw file",
        "in",
        "kept",
        *(label for label, _ in _SPLITS),
        *(f"`{f}`" for f in filters),
    ]
    lines = [
        f"# Clean report: {lang}",
        "",
        f"{metrics['docs_in']} documents ({tokens_text(metrics['chars_in'])} characters) read from "
        f"{metrics['input_files']} raw files; {metrics['docs_out']} kept for training, "
        f"{metrics['docs_heldout']} held "
        f"out, {metrics['docs_heldout_source']} in held-out sources (`clean.heldout_sources`: "
        f"{_names(metrics['heldout_source_patterns'])}; whole raw files: "
        f"{_names(metrics['heldout_source_files'])}), "
        f"{sum(metrics['rejected'].values())} rejected; {metrics['bad_records']} bad records. "
        "Language ID: "
        f"{metrics['language_id']['description']}.",
        "",
        "Per raw file: what went where. *kept* is the share that any split keeps (training, held "
        "out, held-out "
        "source); each filter's column is what it removed, with its share of what the file brought "
        "in. Rejected "
        "documents are in `rejected/<filter>/`, with the reason in their metadata "
        "(`filter_reason`).",
        "",
        "## Documents",
        "",
        *_table(header, _rows(sources, filters, "docs", str)),
        "",
        "## Characters",
        "",
        *_table(header, _rows(sources, filters, "chars", tokens_text)),
        "",
        "## Rejections by reason (all files)",
        "",
        *_table(
            ["filter.reason", "documents"],
            [
                [f"`{reason}`", str(n)]
                for reason, n in sorted(
                    metrics["rejected_by_reason"].items(), key=lambda item: -item[1]
                )
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def summed_stats(logging_dir: Path) -> dict[str, dict[str, float]]:
    """{step name: {counter: total over all tasks}} for one datatrove run."""
    totals: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for task_file in sorted(Path(logging_dir, "stats").glob("*.json")):
        for step in json.loads(task_file.read_text(encoding="utf-8")):
            for counter, value in step.get("stats", {}).items():
                totals[step["name"]][counter] += (
                    value["total"] if isinstance(value, dict) else value
                )
    return {name: dict(counters) for name, counters in totals.items()}


def step_key(step) -> str:
    """How datatrove names a step (class or instance) in its statistics."""
    return f"{step.type}: {step.name}"


def count(stats: dict[str, dict[str, float]], step, counter: str) -> int:
    return int(stats.get(step_key(step), {}).get(counter, 0))


def _scaled(n: float, prefixes: tuple[tuple[str, float], ...], ones: str) -> str:
    for prefix, size in prefixes:
        if abs(n) >= size:
            return f"{n / size:.3g}{prefix}"
    return f"{n:.0f}{ones}"


def tokens_text(n: float) -> str:
    """1234567 -> '1.23M' (B for billions, as token budgets are written)."""
    return _scaled(n, (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)), "")


def bytes_text(n: float) -> str:
    """2627032 -> '2.63 MB'."""
    return _scaled(n, ((" TB", 1e12), (" GB", 1e9), (" MB", 1e6), (" kB", 1e3)), " B")
