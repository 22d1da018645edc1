"""The plan as data (`plan.json`) and as text (`plan.md`, the log): numbers, tables and verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from pipeline.corpus.report import tokens_text
from pipeline.json_files import write_json_atomic
from pipeline.mixing.planner import (
    FIXED_RATIO,
    FORMULA,
    REFERENCE,
    R_STAR,
    Allocation,
    Plan,
    epoch_values,
)
from pipeline.mixing.rehydration import Rehydration

# The mix stage's output: the plan the later stages follow, and the same as text for people.
PLAN_FILE, PLAN_TEXT_FILE = "plan.json", "plan.md"
TOKEN_ESTIMATE = (
    "UTF-8 bytes / bytes_per_token of the source's script (mix.bytes_per_token): estimates until "
    "the pack stage counts exact tokens"
)


def verdict(allocation: Allocation) -> str:
    """One line on what the plan does with a source and what it is worth."""
    source, epochs = allocation.source, allocation.epochs
    fixed = f"fixed ratio {source.ratio:g}; " if allocation.role == FIXED_RATIO else ""
    if source.unique_tokens == 0:
        return f"{source.name}: no text to draw from"
    if allocation.tokens == 0:
        return f"{source.name}: not needed, the budget is met before it"
    cap = f" (at its {source.max_epochs:g}-epoch cap)" if allocation.at_cap else ""
    if epochs <= 1:
        return f"{source.name}: {fixed}{epochs:.0%} of its unique tokens, each seen once: effective 100%{cap}"
    values = epoch_values(epochs)
    worth = allocation.effective_tokens / allocation.tokens
    return (
        f"{source.name} repeated {epochs:.1f}x: {fixed}effective {worth:.0%} of unique-equivalent; "
        f"epoch {len(values)} is worth {values[-1]:.0%} of new data{cap}"
    )


def plan_verdict(plan: Plan) -> str:
    if plan.budget_met:
        return (
            f"Budget of {tokens_text(plan.budget)} tokens met: "
            f"{tokens_text(plan.effective_tokens)} effective "
            f"tokens ({plan.effective_tokens / plan.budget:.0%} of unique-equivalent)."
        )
    return (
        "Budget NOT met: with every source at its epoch cap the plan reaches "
        f"{tokens_text(plan.planned_tokens)} "
        f"of {tokens_text(plan.budget)} tokens ({plan.planned_tokens / plan.budget:.0%}), "
        f"{tokens_text(plan.shortfall)} short; the best achievable is "
        f"{tokens_text(plan.planned_tokens)} tokens "
        f"({tokens_text(plan.effective_tokens)} effective). To reach the budget, raise "
        "mix.max_epochs or a "
        "source's max_epochs, or add sources (mix.sources)."
    )


def rehydration_section(
    rehydration: Optional[Rehydration],
    table: Sequence[tuple[int, float]],
    bytes_per_token: float,
    uniform_effective_tokens: float,
    docs_without_cluster_size: int,
) -> dict:
    if rehydration is None:
        return {"enabled": False}
    return {
        "enabled": True,
        "table": [{"min_cluster_size": size, "weight": weight} for size, weight in table],
        "mean_weight": rehydration.mean_weight,
        # A document's repetitions are its table weight x this scale.
        "scale": rehydration.scale,
        "mean_epochs": rehydration.mean_epochs,
        "buckets": [
            {
                "cluster_sizes": b.label,
                "min_cluster_size": b.min_cluster_size,
                "max_cluster_size": b.max_cluster_size,
                "weight": b.weight,
                "documents": b.docs,
                "bytes": b.bytes,
                "epochs": b.epochs,
                "effective_tokens": round(b.effective_tokens(bytes_per_token)),
            }
            for b in rehydration.buckets
        ],
        "effective_tokens": round(rehydration.effective_tokens(bytes_per_token)),
        "effective_tokens_uniform": round(uniform_effective_tokens),
        "docs_without_cluster_size": docs_without_cluster_size,
    }


def plan_document(
    lang: str,
    plan: Plan,
    facts: dict[str, dict],
    budget_from: str,
    skipped: list[dict],
    rehydration: dict,
) -> dict:
    """plan.json: the budget, what each source gives and is worth, and the verdicts."""
    sources = []
    for allocation in plan.allocations:
        source = allocation.source
        sources.append(
            {
                "name": source.name,
                "kind": allocation.role,
                **facts[source.name],
                "unique_tokens_est": source.unique_tokens,
                "priority": source.priority,
                "max_epochs": source.max_epochs,
                "ratio": source.ratio,
                "optional": source.optional,
                "epochs": allocation.epochs,
                "tokens": allocation.tokens,
                "share": plan.share(allocation),
                "sampling_weight": plan.sampling_weight(allocation),
                "effective_tokens": round(allocation.effective_tokens),
                "at_cap": allocation.at_cap,
                "epoch_values": epoch_values(allocation.epochs),
                "verdict": verdict(allocation),
            }
        )
    return {
        "lang": lang,
        "budget_tokens": plan.budget,
        "budget_from": budget_from,
        "planned_tokens": plan.planned_tokens,
        "budget_met": plan.budget_met,
        "shortfall_tokens": plan.shortfall,
        "effective_tokens": round(plan.effective_tokens),
        "verdict": plan_verdict(plan),
        "token_estimate": TOKEN_ESTIMATE,
        "scaling_law": {"formula": FORMULA, "r_star": R_STAR, "reference": REFERENCE},
        "sources": sources,
        "skipped_sources": skipped,
        "rehydration": rehydration,
    }


def summary_table(document: dict) -> str:
    """The Markdown table of plan.md: one row per source, then the total."""
    rows = [
        "| source | kind | unique tokens | epochs | tokens | share | effective tokens | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for s in document["sources"]:
        rows.append(
            f"| {s['name']} | {s['kind']} | {tokens_text(s['unique_tokens_est'])} | "
            f"{s['epochs']:.2f} | "
            f"{tokens_text(s['tokens'])} | {s['share']:.1%} | {tokens_text(s['effective_tokens'])} "
            "| "
            f"{s['verdict']} |"
        )
    planned = document["planned_tokens"]
    rows.append(
        f"| **total** | | {tokens_text(sum(s['unique_tokens_est'] for s in document['sources']))} "
        "| | "
        f"{tokens_text(planned)} | {planned / document['budget_tokens']:.1%} | "
        f"{tokens_text(document['effective_tokens'])} | |"
    )
    return "\n".join(rows)


def _rehydration_markdown(section: dict) -> list[str]:
    lines = [
        "",
        "## Rehydration",
        "",
        "Each target document is repeated by its duplicate-cluster size's weight x "
        f"{section['scale']:.3g} "
        f"(mean weight {section['mean_weight']:.3g} over the bytes), so the mean is "
        f"{section['mean_epochs']:.2f} "
        "epochs, as planned.",
        "",
        "| cluster sizes | weight | documents | bytes | epochs per document | effective tokens |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for b in section["buckets"]:
        lines.append(
            f"| {b['cluster_sizes']} | {b['weight']:g} | {b['documents']:,} | {b['bytes']:,} | "
            f"{b['epochs']:.2f} | {tokens_text(b['effective_tokens'])} |"
        )
    lines += [
        "",
        f"Effective tokens of the target: {tokens_text(section['effective_tokens'])} rehydrated, "
        f"{tokens_text(section['effective_tokens_uniform'])} with every document repeated alike.",
    ]
    if section["docs_without_cluster_size"]:
        lines.append(
            f"{section['docs_without_cluster_size']:,} documents had no cluster size (clean ran "
            "without "
            "deduplication) and count as size 1."
        )
    return lines


def markdown(document: dict) -> str:
    """plan.md: the verdict, the table, the value of each epoch, skipped sources and rehydration."""
    lines = [
        f"# Mix plan for {document['lang']}",
        "",
        document["verdict"],
        "",
        f"Budget: {document['budget_tokens']:,} tokens ({document['budget_from']}).",
        "",
        summary_table(document),
    ]
    repeated = [s for s in document["sources"] if s["epochs"] > 1]
    if repeated:
        lines += ["", "## Value of each epoch, per token, relative to new data", ""]
        lines += [
            f"- {s['name']}: " + ", ".join(f"{v:.0%}" for v in s["epoch_values"]) for s in repeated
        ]
    if document["skipped_sources"]:
        lines += ["", "## Skipped sources", ""]
        lines += [
            f"- {s['name']} ({s['path']}): {s['reason']}" for s in document["skipped_sources"]
        ]
    if document["rehydration"]["enabled"]:
        lines += _rehydration_markdown(document["rehydration"])
    lines += [
        "",
        f"Tokens are {document['token_estimate']}. Effective tokens: {FORMULA} ({REFERENCE}).",
        "",
    ]
    return "\n".join(lines)


def write_plan(folder: Path, document: dict) -> None:
    write_json_atomic(folder / PLAN_FILE, document)
    (folder / PLAN_TEXT_FILE).write_text(markdown(document), encoding="utf-8")


def plan_metrics(document: dict, rehydration: bool) -> dict:
    """The mix stage's marker metrics: the plan's totals, per source its epochs and effective
    tokens, and whether `mix.rehydration` is on."""
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
        "effective_tokens_by_source": {
            name: s["effective_tokens"] for name, s in by_source.items()
        },
        "skipped_sources": [s["name"] for s in document["skipped_sources"]],
        "rehydration": rehydration,
    }
