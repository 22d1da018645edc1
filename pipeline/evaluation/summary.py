"""What the evaluate report opens with: the headline (base against the final model, each change
with its paired-bootstrap interval), the cost of the run from the training stages' markers and
metrics, and the models' greedy continuations of held-out prompts."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Optional

from pipeline.evaluation.uncertainty import RESAMPLES
from pipeline.progress import duration


def metric_rows(metrics_file: Path) -> list[dict]:
    return [
        json.loads(line)
        for line in metrics_file.read_text(encoding="utf-8").splitlines()
        if line.strip()
    ]


def _finite(value) -> Optional[float]:
    """A recorded number, else None (missing, null, NaN or infinite: never printed as a result)."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if is_number and math.isfinite(value) else None


def run_mfu(metrics_file: Path) -> Optional[float]:
    """The MFU of a whole training run from its metrics.jsonl: each logged interval's MFU weighted
    by its time. MFU is proportional to speed, so an interval of t tokens at MFU m took t / m of the
    time, and the run's MFU is its tokens over the sum of those. None where none was logged (a CPU,
    an unknown GPU)."""
    tokens = time = 0.0
    previous = 0
    for row in metric_rows(metrics_file):
        if "loss" not in row or _finite(row.get("tokens")) is None:
            continue
        interval, previous = row["tokens"] - previous, row["tokens"]
        mfu = _finite(row.get("mfu"))
        # A run resumed from a checkpoint logs steps again, from fewer tokens: no new interval.
        if interval > 0 and mfu is not None and mfu > 0:
            tokens, time = tokens + interval, time + interval / mfu
    return tokens / time if time else None


def _devices(stage_metrics: dict) -> Optional[int]:
    """A training stage's ranks: tp x pp x dp where its marker records the layout, else the ranks
    whose peak memory it records."""
    layout = stage_metrics.get("parallel")
    if isinstance(layout, dict) and all(key in layout for key in ("tp", "pp", "dp")):
        return layout["tp"] * layout["pp"] * layout["dp"]
    ranks = stage_metrics.get("peak_memory_per_rank")
    return len(ranks) if isinstance(ranks, list) and ranks else None


def training_cost(stage_metrics: dict, metrics_file: Optional[Path]) -> dict:
    """What a training stage took, from its marker's metrics and its metrics.jsonl: tokens trained,
    the wall time of its training loop (seconds), tokens per second, MFU (run_mfu), devices (its
    ranks) and device-hours (wall time x devices); None for a figure it did not record."""
    seconds, devices = _finite(stage_metrics.get("seconds")), _devices(stage_metrics)
    tokens = _finite(stage_metrics.get("tokens"))
    return {
        "tokens": None if tokens is None else int(tokens),
        "seconds": seconds,
        "tokens_per_s": _finite(stage_metrics.get("tokens_per_s")),
        "mfu": None if metrics_file is None else run_mfu(metrics_file),
        "devices": devices,
        "device_hours": None if seconds is None or devices is None else seconds * devices / 3600,
    }


HEADLINE_NOTE = (
    "The base model against the final model on the same documents and test items: change = final "
    "- base, with the 95% interval of that change from a paired bootstrap ({resamples:,} resamples "
    "of the documents, or of the test items, the same for both models); `better` or `worse` where "
    "the interval leaves out zero, else `not told apart`. Bits per byte: lower is better; "
    "accuracy: higher."
)


def headline_section(headline: list[dict]) -> list[str]:
    """One table: each held-out set's bits per byte and each task's accuracy per scoring, base ->
    final, the change, its interval and the verdict."""
    if not headline:
        return [
            "## Headline",
            "",
            "No base model and trained model to compare: no headline (the details follow).",
            "",
        ]
    final = headline[0]["model"]
    lines = [
        f"## Headline: base -> {final}",
        "",
        HEADLINE_NOTE.format(resamples=RESAMPLES),
        "",
        f"| measure | n | base | {final} | change | 95% interval | verdict |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for row in headline:
        low, high = row["interval_95"]
        if row["measure"] == "bits per byte":
            what = f"bits per byte, {row['title']}"
            change = f"{row['change']:+.4f} ({row['final'] / row['base'] - 1:+.1%})"
            values, interval = (
                f"{row['base']:.4f} | {row['final']:.4f}",
                f"[{low:+.4f}, {high:+.4f}]",
            )
        else:
            what = f"accuracy, {row['task']}: {row['scoring']}"
            change, interval = f"{row['change']:+.3f}", f"[{low:+.3f}, {high:+.3f}]"
            values = f"{row['base']:.3f} | {row['final']:.3f}"
        lines.append(
            f"| {what} | {row['n']:,} | {values} | {change} | {interval} | {row['verdict']} |"
        )
    return [*lines, ""]


NOT_RECORDED = "not recorded"
COST_NOTE = (
    "From the training stages' markers and metrics.jsonl. Wall time: the training loop of the "
    "stage's last run (one resumed from a checkpoint counts from there); devices: its ranks (tp x "
    "pp x dp; processes on a CPU); device-hours = wall time x devices; MFU: model FLOP/s per "
    "device over the device's peak bf16 FLOP/s, over all logged steps (not recorded on a CPU)."
)


def _cost_cells(cost: dict) -> str:
    """A stage's (or the total's) figures as table cells: `not recorded` where missing, empty where
    it has none (a total's MFU)."""
    formats = {
        "tokens": lambda value: f"{value:,}",
        "seconds": duration,
        "tokens_per_s": lambda value: f"{value:,.0f}",
        "mfu": lambda value: f"{value:.1%}",
        "devices": str,
        "device_hours": lambda value: f"{value:.3f}",
    }
    return " | ".join(
        "" if key not in cost else NOT_RECORDED if cost[key] is None else show(cost[key])
        for key, show in formats.items()
    )


def total_cost(cost: dict[str, dict]) -> dict:
    """The training stages' tokens, wall time and device-hours added up (None where one of them did
    not record its figure)."""

    def added(key: str):
        values = [figures[key] for figures in cost.values()]
        return None if any(value is None for value in values) else sum(values)

    return {key: added(key) for key in ("tokens", "seconds", "device_hours")}


def cost_section(cost: dict[str, dict]) -> list[str]:
    """A table of what each training stage took, and their total."""
    lines = ["## Cost of the run", ""]
    if not cost:
        return [*lines, "No trained model is evaluated: no training to account for.", ""]
    lines += [
        COST_NOTE,
        "",
        "| stage | tokens trained | wall time | tokens/s | MFU | devices | device-hours |",
        "|---|---:|---:|---:|---:|---:|---:|",
        *(f"| {stage} | {_cost_cells(figures)} |" for stage, figures in cost.items()),
    ]
    if len(cost) > 1:
        lines.append(f"| total | {_cost_cells(total_cost(cost))} |")
    return [*lines, ""]


def _fenced(lines: list[str]) -> list[str]:
    """A fenced block whose fence is longer than any run of backticks in `lines`, so that a model's
    text cannot end it."""
    longest = max((len(run) for run in re.findall("`+", "\n".join(lines))), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"{fence}text", *lines, fence]


def continuations_section(continuations: dict) -> list[str]:
    """Each prompt and each model's greedy continuation of it, on one line each."""
    if not continuations["prompts"]:
        return []
    lines = [
        "## Greedy continuations",
        "",
        f"The first {continuations['words']} words of the first held-out documents, continued by "
        f"each model (up to {continuations['new_tokens']} tokens, greedy, each model with its own "
        "tokenizer; spacing made single spaces). The prompt ends where `...` starts.",
        "",
    ]
    entries = continuations["prompts"]
    width = max(len(name) for entry in entries for name in ["prompt", *entry["models"]])
    for entry in entries:
        lines += _fenced(
            [
                f"{'prompt':<{width}}  {_one_line(entry['prompt'])}",
                *(
                    f"{model:<{width}}  {_continued(text)}"
                    for model, text in entry["models"].items()
                ),
            ]
        )
        lines.append("")
    return lines


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _continued(text: str) -> str:
    """A continuation after `...`, with the space it starts with, if any: whether the model went on
    within the prompt's last word or after it."""
    if not text.strip():
        return "... (nothing: the model ends the document here)"
    return f"...{' ' * text[0].isspace()}{_one_line(text)}"
