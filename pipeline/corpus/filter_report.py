"""The clean stage's `report.md`: where each raw file's documents and characters went (training, held out, held-out
source, or which filter removed them), from the marker's metrics."""

from __future__ import annotations

from pipeline.short_numbers import tokens_text

_SPLITS = (("train", "out"), ("held out", "heldout"), ("held-out source", "heldout_source"))


def _share(part: int, whole: int) -> str:
    return f"{part / whole:.0%}" if whole else "-"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(row) + " |" for row in rows)]


def _rows(sources: dict[str, dict], filters: list[str], unit: str, shown) -> list[list[str]]:
    """One row per source and a total: `unit` (`docs` or `chars`) in, kept share, each split and each filter."""
    totals = {"in": 0, **{key: 0 for _, key in _SPLITS}, **{name: 0 for name in filters}}
    rows = []
    for name, entry in sources.items():
        values = {"in": entry[f"{unit}_in"], **{key: entry[f"{unit}_{key}"] for _, key in _SPLITS},
                  **{f: entry["rejected" if unit == "docs" else "chars_rejected"].get(f, 0) for f in filters}}
        for key, value in values.items():
            totals[key] += value
        rows.append([f"`{name}`", *_cells(values, filters, shown)])
    if len(sources) > 1:
        rows.append(["**all**", *_cells(totals, filters, shown)])
    return rows


def _cells(values: dict, filters: list[str], shown) -> list[str]:
    kept = sum(values[key] for _, key in _SPLITS)
    return [shown(values["in"]), _share(kept, values["in"]), *(shown(values[key]) for _, key in _SPLITS),
            *(f"{shown(values[f])} ({_share(values[f], values['in'])})" if values[f] else "0" for f in filters)]


def markdown(lang: str, metrics: dict) -> str:
    sources, filters = metrics["sources"], list(metrics["rejected"])
    header = ["raw file", "in", "kept", *(label for label, _ in _SPLITS), *(f"`{f}`" for f in filters)]
    lines = [
        f"# Clean report: {lang}",
        "",
        f"{metrics['docs_in']} documents ({tokens_text(metrics['chars_in'])} characters) read from "
        f"{metrics['input_files']} raw files; {metrics['docs_out']} kept for training, {metrics['docs_heldout']} held "
        f"out, {metrics['docs_heldout_source']} in held-out sources (`clean.heldout_sources`: "
        f"{', '.join(f'`{name}`' for name in metrics['heldout_source_files']) or 'none'}), "
        f"{sum(metrics['rejected'].values())} rejected; {metrics['bad_records']} bad records. Language ID: "
        f"{metrics['language_id']['description']}.",
        "",
        "Per raw file: what went where. *kept* is the share that any split keeps (training, held out, held-out "
        "source); each filter's column is what it removed, with its share of what the file brought in. Rejected "
        "documents are in `rejected/<filter>/`, with the reason in their metadata (`filter_reason`).",
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
        *_table(["filter.reason", "documents"],
                [[f"`{reason}`", str(n)] for reason, n in sorted(metrics["rejected_by_reason"].items(),
                                                                 key=lambda item: -item[1])]),
        "",
    ]
    return "\n".join(lines)
