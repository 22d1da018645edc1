"""The evaluate stage's report: tables in Markdown (first the headline, base against the final model
with the uncertainty of each change, the cost of the run and greedy continuations; then the
details), the regressions against the base model, and two PNG plots (BPB per model and held-out set;
training curves)."""

from __future__ import annotations

import math
from pathlib import Path

from pipeline.evaluation.summary import (
    continuations_section,
    cost_section,
    headline_section,
    metric_rows,
)

# The evaluate stage's output: the report as data and as text, the plots beside them.
REPORT_FILE, REPORT_TEXT_FILE = "report.json", "report.md"
BPB_PLOT = "bpb.png"
CURVES_PLOT = "training_curves.png"
TRAINING_STAGES = {"warmup", "pretrain"}
# Why the training stages' own held-out numbers differ from the `heldout` column, so that nobody
# takes it for a bug.
TRAINING_SCORES_NOTE = (
    "The warmup and pretrain stages log held-out bits per byte too (their metrics.jsonl, markers "
    "and logs), by the "
    "same definition (pipeline/evaluation/bits_per_byte.py) on the same held-out split, but on "
    "other rows: the first "
    "`warmup.train.eval_tokens` / `train.eval_tokens` tokens of it (in the split's shard order, "
    "which groups "
    "documents by raw file; the document that reaches the budget cut there) in windows of the "
    "training sequence "
    "length, where this report takes up to `eval.max_bytes` per set in windows of `eval.seq_len`. "
    "The training "
    "stages keep those rows (heldout.npz); the table below scores them again with the exported "
    "model, so the "
    "stage's number and this report's meet there."
)


def read_curves(metrics_file: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(tokens, loss) and (tokens, held-out BPB) points of a training stage's metrics.jsonl."""
    rows = metric_rows(metrics_file)
    losses = [
        (row["tokens"], row["loss"]) for row in rows if "loss" in row and row["loss"] is not None
    ]
    # Held-out rows carry the step only; every step trains the same number of tokens.
    per_step = losses[-1][0] / max(row["step"] for row in rows if "loss" in row) if losses else 0
    heldout = [
        (round(row["step"] * per_step), row["heldout_bpb"]) for row in rows if "heldout_bpb" in row
    ]
    return losses, heldout


def find_regressions(bpb: dict[str, dict[str, float]]) -> list[dict]:
    """Each (trained model, held-out set) where the model predicts the text worse than the base
    model, from bits per byte per model and set; none without a base model."""
    base = bpb.get("base")
    if base is None:
        return []
    return [
        {"model": model, "set": name, "bits_per_byte": value, "base_bits_per_byte": base[name]}
        for model, by_set in bpb.items()
        if model != "base"
        for name, value in by_set.items()
        if name in base and value > base[name]
    ]


def reproduction_line(model: str, result: dict) -> str:
    """Whether the exported model gives the training stage's logged held-out score on the stage's
    own rows."""
    what = (
        f"{model}'s exported model scores {result['rescored']:.4f} bits per byte on the {model} "
        "stage's own "
        f"held-out rows ({result['documents']} documents, {result['tokens']:,} tokens, windows of "
        f"{result['seq_len']}), where the stage logged {result['logged']:.4f}"
    )
    if result["agree"]:
        return f"{what}: the two computations agree"
    return (
        f"WARNING: {what}: the training engine and the exported model disagree on the same rows "
        "(by "
        f"{result['rescored'] / result['logged'] - 1:+.1%}), so one of the two numbers is wrong; "
        "compare "
        f"them with kernels=reference and on a CPU to find which"
    )


def regression_line(regression: dict, title: str) -> str:
    return (
        f"WARNING: {regression['model']} is worse than the base model on the {title} set: "
        f"{regression['bits_per_byte']:.4f} bits per byte against the base's "
        f"{regression['base_bits_per_byte']:.4f}"
        f" (+{regression['bits_per_byte'] / regression['base_bits_per_byte'] - 1:.1%})"
    )


def write_plots(
    out_dir: Path, bpb: dict[str, dict[str, float]], titles: dict[str, str], curves: dict[str, Path]
) -> list[str]:
    """bpb.png (bars per held-out set, one per model) and, when training metrics exist,
    training_curves.png (warmup then pretrain, on one token axis)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    figure, axis = plt.subplots(figsize=(max(6, 2.5 * len(titles)), 3.8))
    colours = ["#999999", "#4c72b0", "#dd8452", "#55a868"]
    width = 0.8 / max(1, len(bpb))
    for place, (model, by_set) in enumerate(bpb.items()):
        positions = [index + (place - (len(bpb) - 1) / 2) * width for index in range(len(titles))]
        bars = axis.bar(
            positions,
            [by_set[name] for name in titles],
            width,
            label=model,
            color=colours[place % len(colours)],
        )
        axis.bar_label(bars, fmt="%.3f", fontsize=7)
    axis.set_xticks(range(len(titles)), list(titles.values()))
    axis.set_ylabel("bits per byte (lower is better)")
    axis.set_title("Held-out bits per byte")
    axis.legend()
    figure.tight_layout()
    figure.savefig(out_dir / BPB_PLOT, dpi=120)
    plt.close(figure)
    written.append(BPB_PLOT)

    if curves:
        figure, (loss_axis, bpb_axis) = plt.subplots(1, 2, figsize=(11, 3.8))
        offset = 0
        for stage, metrics_file in curves.items():
            losses, heldout = read_curves(metrics_file)
            if losses:
                loss_axis.plot([offset + t for t, _ in losses], [v for _, v in losses], label=stage)
            if heldout:
                bpb_axis.plot(
                    [offset + t for t, _ in heldout],
                    [v for _, v in heldout],
                    marker="o",
                    label=stage,
                )
            offset += losses[-1][0] if losses else 0
        loss_axis.set_title("Training loss (nats per token)")
        bpb_axis.set_title("Held-out bits per byte during training")
        for axis in (loss_axis, bpb_axis):
            axis.set_xlabel("training tokens")
            axis.legend()
        figure.tight_layout()
        figure.savefig(out_dir / CURVES_PLOT, dpi=120)
        plt.close(figure)
        written.append(CURVES_PLOT)
    return written


def added_tokens_line(added: dict[str, dict], title: str) -> str:
    """What the added tokens of an extended base tokenizer take on the base language's set, per
    trained model, and why a warm start that freezes the body and the base's rows cannot beat the
    base there."""
    shares = "; ".join(
        f"{model} {share['mass']:.2%} ({-math.log2(1 - share['mass']):.4f} bits per token), "
        f"{share['added_targets']:,} of {share['base_targets'] + share['added_targets']:,} targets "
        f"added tokens"
        for model, share in added.items()
    )
    first = next(iter(added.values()))["first_added"]
    return (
        f"On the {title} set the added tokens (ids from {first:,}) take this share of the "
        "probability where a "
        f"base token is the target: {shares}. Where the text is cut as the base cuts it, a model "
        "whose body and "
        "base rows are frozen (warmup with warmup.base_rows=frozen) gives the right token the "
        "base's "
        "probability times one minus that share, so it cannot do better than the base there; "
        "training the body "
        f"(pretrain) or the base rows at a small learning rate (warmup.base_rows_lr) can."
    )


def markdown(lang: str, report: dict, plots: list[str]) -> str:
    """The report (the evaluate stage's report.json): the headline, the cost of the run and greedy
    continuations; then the held-out sets, bits per byte per model and set, the regressions, each
    set's details, the downstream tasks and the training stages' own held-out numbers."""
    lines = [
        f"# Evaluation: {lang}",
        "",
        "Bits per byte = summed negative log-likelihood (bits) over the text's UTF-8 bytes, "
        "comparable across "
        "tokenizers (lower is better); token perplexity depends on the tokenizer and is for "
        "reference only.",
        "",
        *headline_section(report["headline"]),
        *cost_section(report["cost"]),
        *continuations_section(report["continuations"]),
        *_heldout_sets_section(report),
        *_bits_per_byte_section(report),
        *_set_sections(report),
        *task_tables(report["tasks"], report["skipped_tasks"]),
        *_training_scores_section(report),
        *(f"![{plot}]({plot})" for plot in plots),
    ]
    return "\n".join(lines) + "\n"


def _heldout_sets_section(report: dict) -> list[str]:
    """The sets scored, with how much text each has, and why the others are not."""
    return [
        "## Held-out sets",
        "",
        "| set | text | documents | bytes |",
        "|---|---|---:|---:|",
        *(
            f"| {about['title']} | {about['text']} | {about['documents']:,} | {about['bytes']:,} |"
            for about in report["sets"].values()
        ),
        "",
        *(f"- not scored: `{name}`: {reason}." for name, reason in report["skipped_sets"].items()),
        "",
    ]


INTERVALS_NOTE = (
    "Each set's table below gives bits per byte with its 95% interval from a bootstrap over the "
    "documents (how far the number would move with other documents of the same kind). Two models' "
    "intervals that overlap may still differ: the headline compares them on the same resampled "
    "documents."
)


def _bits_per_byte_section(report: dict) -> list[str]:
    """Bits per byte per model and set, the regressions flagged, then what they amount to."""
    sets, regressions = report["sets"], report["regressions"]
    lines = [
        "## Bits per byte",
        "",
        "| model | " + " | ".join(about["title"] for about in sets.values()) + " | folder |",
        "|---|" + "---:|" * len(sets) + "---|",
    ]
    flagged = {(regression["model"], regression["set"]) for regression in regressions}
    for model, by_set in report["scores"].items():
        cells = [
            f"{by_set[name]['bits_per_byte']:.4f}{' (worse than base)' * ((model, name) in flagged)}"
            for name in sets
        ]
        lines.append(f"| {model} | " + " | ".join(cells) + f" | {report['models'][model]} |")
    return [*lines, "", *_regression_lines(report), "", INTERVALS_NOTE, ""]


def _regression_lines(report: dict) -> list[str]:
    """Each regression (and what the added tokens take where the set they are measured on
    regressed), or why there are none."""
    sets, scores, regressions = report["sets"], report["scores"], report["regressions"]
    if regressions:
        lines = [
            f"**{regression_line(regression, sets[regression['set']]['title'])}**"
            for regression in regressions
        ]
        added = report.get("added_tokens")
        if added and any(regression["set"] == added["set"] for regression in regressions):
            lines += ["", added_tokens_line(added["models"], sets[added["set"]]["title"])]
        return lines
    if "base" in scores and len(scores) > 1:
        return ["No trained model is worse than the base model on any held-out set."]
    return ["No base model and trained model to compare: no regression is checked."]


def _set_sections(report: dict) -> list[str]:
    """A section per held-out set: every model's scores on it, bits per byte with its 95% bootstrap
    interval over the documents."""
    lines = []
    for name, about in report["sets"].items():
        lines += [
            f"### {about['title']}",
            "",
            about["text"],
            "",
            "| model | bits per byte | 95% interval | token perplexity | tokens per byte | tokens "
            "| bytes |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        for model, by_set in report["scores"].items():
            score = by_set[name]
            low, high = score["interval_95"]
            lines.append(
                f"| {model} | {score['bits_per_byte']:.4f} | [{low:.4f}, {high:.4f}] | "
                f"{score['token_perplexity']:.2f} | {score['tokens_per_byte']:.3f} | "
                f"{score['tokens']:,} | {score['bytes']:,} |"
            )
        lines.append("")
    return lines


def _training_scores_section(report: dict) -> list[str]:
    """Where training stages are scored: why their logged held-out numbers differ from this
    report's, and whether the exported models give those numbers again on the stages' own rows."""
    if not TRAINING_STAGES & report["scores"].keys():
        return []
    lines = ["## The training stages' held-out numbers", "", TRAINING_SCORES_NOTE, ""]
    reproduced = report["training_heldout"]
    if not reproduced:
        return lines
    lines += [
        "| model | logged by the stage | rescored here | documents | tokens | window |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {model} | {result['logged']:.4f} | {result['rescored']:.4f} | "
        f"{result['documents']:,} | "
        f"{result['tokens']:,} | {result['seq_len']:,} |"
        for model, result in reproduced.items()
    ]
    lines += [""] + [
        f"**{reproduction_line(model, result)}**"
        for model, result in reproduced.items()
        if not result["agree"]
    ]
    return lines + [""]


def _interval(result: dict) -> str:
    low, high = result["interval_95"]
    return f"{result['accuracy']:.3f} [{low:.3f}, {high:.3f}]"


def task_tables(tasks: dict[str, dict], skipped: dict[str, str]) -> list[str]:
    """A table per task: the accuracy of each model under each scoring, with its 95% Wilson
    interval."""
    if not tasks and not skipped:
        return []
    lines = [
        "## Downstream tasks",
        "",
        "Accuracy on the test items [95% Wilson interval]; chance = one over the number of "
        "choices. Intervals "
        "that overlap do not tell the models apart.",
        "",
    ]
    for name, about in tasks.items():
        results = about["results"]
        scorings = list(next(iter(results.values()))) if results else []
        first = (
            next(iter(next(iter(results.values())).values()))
            if results
            else {"chance": 0, "n": about["test"]}
        )
        what = (
            f"{len(about['labels'])} categories ({', '.join(about['labels'])}), {about['train']} "
            "train + "
            f"{about['dev']} dev examples, majority share of test {about['majority']:.3f}"
            if about["layout"] == "sib200"
            else f"{round(1 / first['chance'])} choices per question"
            if first["chance"]
            else "no model scored it"
        )
        lines += [
            f"### {name}",
            "",
            f"{about['layout']} layout, language {about['language']}, {about['path']}: {what}; n = "
            f"{first['n']} test items, chance {first['chance']:.3f}.",
            "",
            "| model | " + " | ".join(scorings) + " |",
            "|---|" + "---:|" * len(scorings),
        ]
        lines += [
            f"| {model} | "
            + " | ".join(_interval(by_scoring[scoring]) for scoring in scorings)
            + " |"
            for model, by_scoring in results.items()
        ]
        lines.append("")
    lines += [f"- not built: `{name}`: {reason}." for name, reason in skipped.items()]
    return lines + ([""] if skipped else [])
