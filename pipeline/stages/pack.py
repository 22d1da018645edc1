"""Stage `pack`: the mix plan's sources tokenized once into memory-mapped shards, and the exact plan.

Tokenizes each source the plan reads with the tokenizer stage's `tokenizer.json` (datatrove's
`DocumentTokenizer`, one shard per input file, `workers` files at a time: pipeline/packing/tokenize.py),
every document ending with EOS. The exact token counts then replace the mix stage's estimates in the
same planner (pipeline/mixing/planner.py): epochs, shares and, with rehydration, the per-document
weights are derived again. A source the estimated plan gave no tokens is tokenized only if the exact
plan gives it some. Repetition is an index, never a copy: `repeats.npy` says how many times each
document is read per pass (pipeline/packing/packed.py), so the packed size is the unique tokens
x 2 (or 4) bytes whatever the epochs. `packed.json` records the exact plan next to the estimates and
is what `pipeline.packing.sampler.PackedSampler` reads.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np

from pipeline.contract import Stage, StageRun
from pipeline.corpus.report import bytes_text, tokens_text
from pipeline.errors import StageError
from pipeline.json_files import read_json
from pipeline.mixing.planner import TARGET, Allocation, Plan, PlanError, exact_plan
from pipeline.mixing.rehydration import Rehydration
from pipeline.mixing.sources import planned_source
from pipeline.packing.output import packed_bytes, source_folder, tokenizer_entry, write_packed, write_source
from pipeline.packing.packed import rehydrated_epochs
from pipeline.packing.shards import token_dtype
from pipeline.packing.tokenize import TokenizedSource, tokenize_source
from pipeline.tokenization.folder import TOKENIZER_FILE, load_tokenizer

log = logging.getLogger(__name__)

# Per source, the list of files read and the bad records found (as the mix stage's `sources/`).
READING = "reading"


def _tokenizer(run: StageRun) -> dict:
    eos = run.read_input("tokenizer", "special_tokens_map.json", read_json)["eos_token"]
    tokenizer = run.read_input("tokenizer", TOKENIZER_FILE, load_tokenizer)
    path = run.input_file("tokenizer", TOKENIZER_FILE)
    return tokenizer_entry(path, tokenizer.get_vocab_size(), eos, tokenizer.token_to_id(eos))


def _exact(run: StageRun, plan_document: dict, unique_tokens: dict[str, int]) -> Plan:
    try:
        return exact_plan(plan_document, unique_tokens)
    except PlanError as error:
        raise StageError(f"pack {run.lang}: with exact token counts, {error}") from None


def _tokenize_planned(run: StageRun, plan_document: dict, tokenizer: dict) -> tuple[Plan, dict[str, TokenizedSource]]:
    """Tokenize what the plan reads until the exact plan reads nothing untokenized; the exact plan."""
    entries = {s["name"]: s for s in plan_document["sources"]}
    tokenized: dict[str, TokenizedSource] = {}
    plan = _exact(run, plan_document, {})
    while needed := [a.source.name for a in plan.allocations if a.tokens > 0 and a.source.name not in tokenized]:
        for name in needed:
            source, reading = planned_source(entries[name], run.cfg.work_dir), run.work_dir / READING / name
            tokenized[name] = tokenize_source(source, source_folder(run.work_dir, name), Path(tokenizer["path"]),
                                              tokenizer["eos"], reading, run.cfg.workers, run.cfg.pack.batch_size)
            if tokenized[name].bad_records:
                log.warning("pack %s: %d bad records in source `%s` were skipped; see %s", run.lang,
                            tokenized[name].bad_records, name, reading / "bad_records")
            else:
                shutil.rmtree(reading / "bad_records", ignore_errors=True)  # one empty log per file read
        plan = _exact(run, plan_document, {name: t.tokens for name, t in tokenized.items()})
    if plan.allocations[0].source.unique_tokens == 0:
        raise StageError(f"pack {run.lang}: the target's training text {entries[run.lang]['path']} gave no tokens. "
                         f"Check it and run python -m pipeline stage=clean lang={run.lang} and stage=mix again.")
    return plan, tokenized


def _rehydration_entry(rehydration: Rehydration) -> dict:
    return {"scale": rehydration.scale, "mean_weight": rehydration.mean_weight,
            "buckets": [{"cluster_sizes": b.label, "weight": b.weight, "documents": b.docs, "tokens": b.bytes,
                         "epochs": b.epochs} for b in rehydration.buckets]}


def _write_source(run: StageRun, allocation: Allocation, source: TokenizedSource, rehydration: dict) -> dict:
    """repeats.npy for one source, each document read as often as its epochs say; its packed.json facts."""
    epochs, rehydrated = np.full(source.documents, allocation.epochs), None
    if rehydration["enabled"] and allocation.role == TARGET and source.documents:
        table = [(row["min_cluster_size"], row["weight"]) for row in rehydration["table"]]
        epochs, rehydrated = rehydrated_epochs(source.cluster_sizes, source.document_tokens, table, allocation.epochs)
    entry = write_source(run.work_dir, source, epochs, run.cfg.pack.seed)
    if rehydrated is not None:
        entry["rehydration"] = _rehydration_entry(rehydrated)
    return entry


def _source_entry(plan: Plan, allocation: Allocation, estimate: dict, packed: dict | None) -> dict:
    """The exact plan's numbers next to the mix plan's estimates, then the packed facts (if tokenized)."""
    return {
        "name": allocation.source.name, "kind": allocation.role, "input": estimate["input"], "path": estimate["path"],
        "exact": packed is not None,
        "unique_tokens": allocation.source.unique_tokens, "unique_tokens_est": estimate["unique_tokens_est"],
        "epochs": allocation.epochs, "epochs_est": estimate["epochs"],
        "tokens": allocation.tokens, "tokens_est": estimate["tokens"],
        "share": plan.share(allocation), "share_est": estimate["share"],
        "sampling_weight": plan.sampling_weight(allocation), "sampling_weight_est": estimate["sampling_weight"],
        "effective_tokens": round(allocation.effective_tokens), "effective_tokens_est": estimate["effective_tokens"],
        "pass_tokens": 0,
        **(packed or {}),
    }


def _summary_table(document: dict) -> str:
    rows = ["| source | documents | unique tokens (est -> exact) | epochs (est -> exact) | share (est -> exact) "
            "| tokens per pass |", "|---|---:|---:|---:|---:|---:|"]
    for s in document["sources"]:
        unique = tokens_text(s["unique_tokens"]) if s["exact"] else "not tokenized"
        rows.append(f"| {s['name']} | {s.get('documents', 0):,} | {tokens_text(s['unique_tokens_est'])} -> {unique} | "
                    f"{s['epochs_est']:.2f} -> {s['epochs']:.2f} | {s['share_est']:.1%} -> {s['share']:.1%} | "
                    f"{tokens_text(s['pass_tokens'])} |")
    return "\n".join(rows)


def run_pack(run: StageRun) -> dict:
    cfg, lang = run.cfg, run.lang
    plan_document = run.read_input("mix", "plan.json", read_json)
    tokenizer = _tokenizer(run)
    plan, tokenized = _tokenize_planned(run, plan_document, tokenizer)
    estimates = {s["name"]: s for s in plan_document["sources"]}
    sources = []
    for allocation in plan.allocations:
        name = allocation.source.name
        packed = None
        if name in tokenized:
            packed = _write_source(run, allocation, tokenized[name], plan_document["rehydration"])
        sources.append(_source_entry(plan, allocation, estimates[name], packed))
    unique = sum(t.tokens for t in tokenized.values())
    size = packed_bytes(run.work_dir, list(tokenized))
    about = {
        "lang": lang, "seed": cfg.pack.seed,
        "budget_tokens": plan.budget, "budget_tokens_est": plan_document["budget_tokens"],
        "planned_tokens": plan.planned_tokens, "budget_met": plan.budget_met, "shortfall_tokens": plan.shortfall,
        "effective_tokens": round(plan.effective_tokens), "unique_tokens": unique, "packed_bytes": size,
        "rehydration": plan_document["rehydration"]["enabled"],
    }
    document = write_packed(run.work_dir, tokenizer, sources, about)
    width = token_dtype(tokenizer["vocab_size"]).itemsize
    log.info("pack %s: %s unique tokens as %s, %s on disk (%.3f x unique tokens x %d bytes); the exact plan:\n%s",
             lang, tokens_text(unique), tokenizer["dtype"], bytes_text(size), size / max(1, unique * width), width,
             _summary_table(document))
    by_name = {s["name"]: s for s in sources}
    return {
        "dtype": tokenizer["dtype"], "vocab_size": tokenizer["vocab_size"],
        "budget_tokens": plan.budget, "budget_met": plan.budget_met, "shortfall_tokens": plan.shortfall,
        "pass_tokens": document["pass_tokens"], "packed_bytes": size,
        "documents": {name: s.get("documents", 0) for name, s in by_name.items()},
        "bad_records": sum(t.bad_records for t in tokenized.values()),
        **{key: {name: s[key] for name, s in by_name.items()}
           for key in ("unique_tokens", "unique_tokens_est", "epochs", "epochs_est", "share", "share_est", "tokens")},
        "rehydration": about["rehydration"],
    }


STAGE = Stage(
    name="pack",
    run=run_pack,
    needs=("mix", "tokenizer"),
    config_sections=("pack",),
    # Documents per tokenizer call change the speed, not the shards.
    unhashed_keys=("pack.batch_size",),
)
