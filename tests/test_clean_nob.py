"""The acceptance path of the clean stage on the embedded Norwegian sample, through the real CLI."""

from __future__ import annotations

import json
import time

import pytest

from tests.conftest import DATA, copy_of, marker, read_jsonl_gz, run_cli

METRIC_KEYS = {"docs_in", "docs_out", "docs_heldout", "bad_records", "rejected", "duplicates_removed",
               "chars_in", "chars_out"}


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory, nob_eng_cleaned):
    return copy_of(nob_eng_cleaned, tmp_path_factory, "nob", langs=("nob",))


def test_writes_shards_and_marker_with_metrics(cleaned, embedded_records):
    cwd = cleaned
    out = cwd / "work" / "nob" / "clean"
    m = marker(cwd / "work", "nob", "clean")
    assert m["stage"] == "clean" and m["lang"] == "nob" and len(m["config_hash"]) == 16
    assert METRIC_KEYS <= set(m["metrics"])
    # the raw input is recorded by its files (count, size, hash of names, sizes and times), not its path
    raw_files = sorted(p for p in (DATA / "nob").rglob("*") if p.is_file())
    assert m["inputs"]["raw"]["files"] == len(raw_files)
    assert m["inputs"]["raw"]["bytes"] == sum(p.stat().st_size for p in raw_files)
    assert str(DATA) not in json.dumps(m["inputs"])

    metrics = m["metrics"]
    assert metrics["docs_in"] == len(embedded_records["nob"])
    assert metrics["bad_records"] == 0
    train, heldout = read_jsonl_gz(out / "train"), read_jsonl_gz(out / "heldout")
    assert len(train) == metrics["docs_out"] > 0.5 * metrics["docs_in"]
    assert len(heldout) == metrics["docs_heldout"] > 0
    assert sum(len(r["text"]) for r in train) == metrics["chars_out"]
    assert metrics["chars_in"] == sum(len(r["text"]) for r in embedded_records["nob"])
    # every document read is accounted for: kept, held out or rejected (and written as such)
    rejected = read_jsonl_gz(out / "rejected")
    assert len(rejected) == sum(metrics["rejected"].values())
    assert metrics["docs_out"] + metrics["docs_heldout"] + len(rejected) == metrics["docs_in"]
    assert metrics["duplicates_removed"] == metrics["rejected"]["minhash_duplicate"]
    # kept documents carry their duplicate-cluster size for the mix stage
    assert all(r["metadata"]["minhash_cluster_size"] >= 1 for r in train)
    # no intermediate or partial folders are left behind
    assert not (out / "filtered").exists() and not (out / "minhash").exists()
    assert not list((cwd / "work" / "nob").glob(".clean.partial-*"))


def test_heldout_split_is_disjoint_and_by_id(cleaned):
    cwd = cleaned
    out = cwd / "work" / "nob" / "clean"
    train_ids = {r["id"] for r in read_jsonl_gz(out / "train")}
    heldout_ids = {r["id"] for r in read_jsonl_gz(out / "heldout")}
    assert train_ids.isdisjoint(heldout_ids)
    from pipeline.corpus.heldout import is_heldout

    assert all(is_heldout(i, 0.02) for i in heldout_ids)
    assert not any(is_heldout(i, 0.02) for i in train_ids)


def test_rejected_documents_are_written_with_their_reason(cleaned):
    cwd = cleaned
    rejected_dir = cwd / "work" / "nob" / "clean" / "rejected"
    m = marker(cwd / "work", "nob", "clean")["metrics"]
    for name, n in m["rejected"].items():
        records = read_jsonl_gz(rejected_dir / name) if n else []
        assert len(records) == n, name
        if name.startswith(("gopher", "fineweb")):
            assert all(r["metadata"].get("filter_reason") for r in records)


def test_same_command_again_is_skipped_in_seconds(cleaned):
    cwd = cleaned
    before = marker(cwd / "work", "nob", "clean")
    start = time.monotonic()
    result = run_cli("stage=clean", "lang=nob", cwd=cwd)
    assert time.monotonic() - start < 15
    assert "Skipping clean for nob: it is up to date" in result.stderr + result.stdout
    assert marker(cwd / "work", "nob", "clean") == before


def test_changing_a_threshold_reruns_and_changes_the_output(cleaned):
    cwd = cleaned
    before = marker(cwd / "work", "nob", "clean")
    # without deduplication, which takes most of the time and comes after the filters
    result = run_cli("stage=clean", "lang=nb", "lang.filters.line_punct_thr=0.5", "clean.dedup.enabled=false", cwd=cwd)
    after = marker(cwd / "work", "nob", "clean")
    assert "changed" in result.stderr + result.stdout
    assert after["config_hash"] != before["config_hash"]
    assert after["config"]["lang"]["filters"]["line_punct_thr"] == 0.5
    # a stricter punctuation threshold rejects more documents
    assert after["metrics"]["rejected"]["fineweb_quality"] > before["metrics"]["rejected"]["fineweb_quality"]
