"""The evaluate stage's report: a table in Markdown and two PNG plots (BPB per model; training curves)."""

from __future__ import annotations

import json
from pathlib import Path

BPB_PLOT = "bpb.png"
CURVES_PLOT = "training_curves.png"
TRAINING_STAGES = {"warmup", "pretrain"}
# Where the training stages' own held-out numbers come from, so that nobody takes the difference for a bug.
TRAINING_SCORES_NOTE = (
    "The warmup and pretrain stages log held-out bits per byte too (their metrics.jsonl, markers and logs), by the "
    "same definition (pipeline/evaluation/bits_per_byte.py), but on the first `warmup.train.eval_tokens` / "
    "`train.eval_tokens` tokens of the held-out text in windows of their training length; this table scores up to "
    "`eval.max_bytes` of it in windows of `eval.seq_len`. Different amounts of text give somewhat different "
    "numbers; with eval_tokens covering the whole split and the default windows they agree.")


def read_curves(metrics_file: Path) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """(tokens, loss) and (tokens, held-out BPB) points of a training stage's metrics.jsonl."""
    rows = [json.loads(line) for line in metrics_file.read_text(encoding="utf-8").splitlines() if line.strip()]
    losses = [(row["tokens"], row["loss"]) for row in rows if "loss" in row and row["loss"] is not None]
    # Held-out rows carry the step only; every step trains the same number of tokens.
    per_step = losses[-1][0] / max(row["step"] for row in rows if "loss" in row) if losses else 0
    heldout = [(round(row["step"] * per_step), row["heldout_bpb"]) for row in rows if "heldout_bpb" in row]
    return losses, heldout


def write_plots(out_dir: Path, scores: dict[str, dict], curves: dict[str, Path]) -> list[str]:
    """bpb.png and, when training metrics exist, training_curves.png (warmup then pretrain, on one token axis)."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    written = []
    figure, axis = plt.subplots(figsize=(6, 3.5))
    names = list(scores)
    values = [scores[name]["bits_per_byte"] for name in names]
    bars = axis.bar(names, values, color=["#999999", "#4c72b0", "#dd8452", "#55a868"][:len(names)])
    axis.bar_label(bars, fmt="%.3f")
    axis.set_ylabel("bits per byte (lower is better)")
    axis.set_title("Held-out bits per byte")
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
                bpb_axis.plot([offset + t for t, _ in heldout], [v for _, v in heldout], marker="o", label=stage)
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


def markdown(lang: str, text_source: str, scores: dict[str, dict], models: dict[str, str], plots: list[str]) -> str:
    lines = [f"# Evaluation: {lang}", "",
             f"Held-out text: {text_source}. Bits per byte = summed negative log-likelihood (bits) over the "
             "text's UTF-8 bytes, comparable across tokenizers; token perplexity depends on the tokenizer and is "
             "for reference only.", "",
             "| model | bits per byte | token perplexity | tokens per byte | tokens | bytes | folder |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for name, score in scores.items():
        lines.append(f"| {name} | {score['bits_per_byte']:.4f} | {score['token_perplexity']:.2f} | "
                     f"{score['tokens_per_byte']:.3f} | {score['tokens']:,} | {score['bytes']:,} | {models[name]} |")
    lines.append("")
    if TRAINING_STAGES & scores.keys():
        lines += [TRAINING_SCORES_NOTE, ""]
    lines.extend(f"![{plot}]({plot})" for plot in plots)
    return "\n".join(lines) + "\n"
