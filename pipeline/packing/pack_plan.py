"""Packing a mix plan: its sources tokenized once into memory-mapped shards, and the exact plan.

Tokenizes each source the plan reads with the tokenizer (one shard per input file in datatrove's
format, each batch of documents encoded on `workers` threads: tokenize.py), every document ending
with EOS. The exact token counts then replace the mix stage's estimates in the same planner
(pipeline/mixing/planner.py): epochs, shares and, with rehydration, the per-document weights are
derived again. A source the estimated plan gave no tokens is tokenized only if the exact plan gives
it some. Repetition is an index, never a copy: `repeats.npy` says how many times each document is
read per pass (packed.py), so the packed size is the unique tokens x 2 (or 4) bytes whatever the
epochs. `packed.json` records the exact plan next to the estimates (output.py).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.corpus.report import bytes_text, tokens_text
from pipeline.errors import StageError
from pipeline.mixing.planner import TARGET, Allocation, Plan, PlanError, exact_plan
from pipeline.mixing.rehydration import Rehydration
from pipeline.mixing.sources import planned_source
from pipeline.packing.pack_config import PackConfig
from pipeline.packing.output import (
    packed_bytes,
    source_folder,
    tokenizer_entry,
    write_packed,
    write_source,
)
from pipeline.packing.packed import rehydrated_epochs
from pipeline.packing.shards import token_dtype
from pipeline.packing.tokenize import Encoder, TokenizedSource, tokenize_source
from pipeline.progress import Progress

log = logging.getLogger(__name__)

# Per source, the list of files read and the bad records found (as the mix stage's `sources/`).
READING = "reading"


def pack_plan(
    folder: Path,
    plan_document: dict,
    tokenizer_file: Path,
    tokenizer: Tokenizer,
    eos: str,
    lang: str,
    pack: PackConfig,
    work_dir: str,
) -> dict:
    """Pack the mix plan `plan_document` (its plan.json) of `lang` into `folder` with the tokenizer
    (its file, loaded, and its end-of-text token); the plan's paths are in the work folder
    `work_dir`. Returns the metrics."""
    entry = tokenizer_entry(
        tokenizer_file, tokenizer.get_vocab_size(), eos, tokenizer.token_to_id(eos)
    )
    encoder = Encoder(tokenizer, tokenizer_file, entry["eos_id"], pack.batch_size)
    plan, tokenized = _tokenize_planned(folder, plan_document, encoder, lang, work_dir)
    sources = _write_sources(folder, plan, tokenized, plan_document, pack.seed)
    unique = sum(t.tokens for t in tokenized.values())
    size = packed_bytes(folder, list(tokenized))
    about = _plan_totals(lang, pack, plan, plan_document, unique, size)
    document = write_packed(folder, entry, sources, about)
    width = token_dtype(entry["vocab_size"]).itemsize
    log.info(
        "pack %s: %s unique tokens as %s, %s on disk (%.3f x unique tokens x %d bytes); the exact "
        "plan:\n%s",
        lang,
        tokens_text(unique),
        entry["dtype"],
        bytes_text(size),
        size / max(1, unique * width),
        width,
        _summary_table(document),
    )
    return _metrics(entry, plan, document, tokenized, about)


def _write_sources(
    folder: Path,
    plan: Plan,
    tokenized: dict[str, TokenizedSource],
    plan_document: dict,
    seed: int,
) -> list[dict]:
    """packed.json's entry of each source of the exact plan, in its order; those `tokenized` get
    their repeats.npy written."""
    estimates = {s["name"]: s for s in plan_document["sources"]}
    sources = []
    for allocation in plan.allocations:
        name = allocation.source.name
        packed = None
        if name in tokenized:
            packed = _write_source(
                folder, allocation, tokenized[name], plan_document["rehydration"], seed
            )
        sources.append(_source_entry(plan, allocation, estimates[name], packed))
    return sources


def _plan_totals(
    lang: str, pack: PackConfig, plan: Plan, plan_document: dict, unique: int, size: int
) -> dict:
    """packed.json's totals: the exact plan's budget and tokens next to the estimates, the `unique`
    tokens packed and their `size` on disk."""
    return {
        "lang": lang,
        "seed": pack.seed,
        "budget_tokens": plan.budget,
        "budget_tokens_est": plan_document["budget_tokens"],
        "planned_tokens": plan.planned_tokens,
        "budget_met": plan.budget_met,
        "shortfall_tokens": plan.shortfall,
        "effective_tokens": round(plan.effective_tokens),
        "unique_tokens": unique,
        "packed_bytes": size,
        "rehydration": plan_document["rehydration"]["enabled"],
    }


def _metrics(
    entry: dict, plan: Plan, document: dict, tokenized: dict[str, TokenizedSource], about: dict
) -> dict:
    """The stage marker's metrics: the plan's totals and, per source, its documents, tokens,
    epochs and share (exact and estimated)."""
    by_name = {s["name"]: s for s in document["sources"]}
    return {
        "dtype": entry["dtype"],
        "vocab_size": entry["vocab_size"],
        "budget_tokens": plan.budget,
        "budget_met": plan.budget_met,
        "shortfall_tokens": plan.shortfall,
        "pass_tokens": document["pass_tokens"],
        "packed_bytes": about["packed_bytes"],
        "documents": {name: s.get("documents", 0) for name, s in by_name.items()},
        "bad_records": sum(t.bad_records for t in tokenized.values()),
        **{
            key: {name: s[key] for name, s in by_name.items()}
            for key in (
                "unique_tokens",
                "unique_tokens_est",
                "epochs",
                "epochs_est",
                "share",
                "share_est",
                "tokens",
            )
        },
        "rehydration": about["rehydration"],
    }


def _exact(lang: str, plan_document: dict, unique_tokens: dict[str, int]) -> Plan:
    try:
        return exact_plan(plan_document, unique_tokens)
    except PlanError as error:
        raise StageError(f"pack {lang}: with exact token counts, {error}") from None


def _tokenize_planned(
    folder: Path, plan_document: dict, encoder: Encoder, lang: str, work_dir: str
) -> tuple[Plan, dict[str, TokenizedSource]]:
    """Tokenize what the plan reads until the exact plan reads nothing untokenized; the exact plan."""
    entries = {s["name"]: s for s in plan_document["sources"]}
    tokenized: dict[str, TokenizedSource] = {}
    plan = _exact(lang, plan_document, {})
    while needed := [
        a.source.name for a in plan.allocations if a.tokens > 0 and a.source.name not in tokenized
    ]:
        text_bytes = sum(entries[name]["unique_bytes"] for name in needed)
        with Progress(
            f"pack {lang}: tokenizing {', '.join(needed)}", text_bytes, "B", log
        ) as progress:
            for name in needed:
                tokenized[name] = _tokenize(
                    folder, entries[name], encoder, lang, work_dir, progress
                )
        plan = _exact(lang, plan_document, {name: t.tokens for name, t in tokenized.items()})
    if plan.allocations[0].source.unique_tokens == 0:
        raise StageError(
            f"pack {lang}: the target's training text {entries[lang]['path']} gave no tokens. "
            f"Check it and run python -m pipeline stage=clean lang={lang} and stage=mix again."
        )
    return plan, tokenized


def _tokenize(
    folder: Path, entry: dict, encoder: Encoder, lang: str, work_dir: str, progress: Progress
) -> TokenizedSource:
    """The source of the plan's `entry` tokenized into its shards."""
    name = entry["name"]
    source, reading = planned_source(entry, work_dir), folder / READING / name
    tokenized = tokenize_source(source, source_folder(folder, name), encoder, reading, progress)
    if tokenized.bad_records:
        log.warning(
            "pack %s: %d bad records in source `%s` were skipped; see %s",
            lang,
            tokenized.bad_records,
            name,
            reading / "bad_records",
        )
    else:
        shutil.rmtree(reading / "bad_records", ignore_errors=True)  # one empty log per file read
    return tokenized


def _rehydration_entry(rehydration: Rehydration) -> dict:
    return {
        "scale": rehydration.scale,
        "mean_weight": rehydration.mean_weight,
        "buckets": [
            {
                "cluster_sizes": b.label,
                "weight": b.weight,
                "documents": b.docs,
                "tokens": b.bytes,
                "epochs": b.epochs,
            }
            for b in rehydration.buckets
        ],
    }


def _write_source(
    folder: Path, allocation: Allocation, source: TokenizedSource, rehydration: dict, seed: int
) -> dict:
    """repeats.npy for one source, each document read as often as its epochs say; its packed.json
    facts."""
    epochs, rehydrated = np.full(source.documents, allocation.epochs), None
    if rehydration["enabled"] and allocation.role == TARGET and source.documents:
        table = [(row["min_cluster_size"], row["weight"]) for row in rehydration["table"]]
        epochs, rehydrated = rehydrated_epochs(
            source.cluster_sizes, source.document_tokens, table, allocation.epochs
        )
    entry = write_source(folder, source, epochs, seed)
    if rehydrated is not None:
        entry["rehydration"] = _rehydration_entry(rehydrated)
    return entry


def _source_entry(plan: Plan, allocation: Allocation, estimate: dict, packed: dict | None) -> dict:
    """The exact plan's numbers next to the mix plan's estimates, then the packed facts (if
    tokenized)."""
    return {
        "name": allocation.source.name,
        "kind": allocation.role,
        "input": estimate["input"],
        "path": estimate["path"],
        "exact": packed is not None,
        "unique_tokens": allocation.source.unique_tokens,
        "unique_tokens_est": estimate["unique_tokens_est"],
        "epochs": allocation.epochs,
        "epochs_est": estimate["epochs"],
        "tokens": allocation.tokens,
        "tokens_est": estimate["tokens"],
        "share": plan.share(allocation),
        "share_est": estimate["share"],
        "sampling_weight": plan.sampling_weight(allocation),
        "sampling_weight_est": estimate["sampling_weight"],
        "effective_tokens": round(allocation.effective_tokens),
        "effective_tokens_est": estimate["effective_tokens"],
        "pass_tokens": 0,
        **(packed or {}),
    }


def _summary_table(document: dict) -> str:
    rows = [
        "| source | documents | unique tokens (est -> exact) | epochs (est -> exact) | share (est "
        "-> exact) "
        "| tokens per pass |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for s in document["sources"]:
        unique = tokens_text(s["unique_tokens"]) if s["exact"] else "not tokenized"
        rows.append(
            f"| {s['name']} | {s.get('documents', 0):,} | {tokens_text(s['unique_tokens_est'])} -> "
            f"{unique} | "
            f"{s['epochs_est']:.2f} -> {s['epochs']:.2f} | {s['share_est']:.1%} -> "
            f"{s['share']:.1%} | "
            f"{tokens_text(s['pass_tokens'])} |"
        )
    return "\n".join(rows)
