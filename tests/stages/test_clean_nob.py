"""The acceptance path of the clean stage on the embedded Norwegian sample, through the real CLI."""

from __future__ import annotations

import collections
import gzip
import json
import time

import pytest

from pipeline.corpus.sources import clean_output, read_documents
from tests.conftest import DATA, copy_of, marker, read_jsonl_gz, run_cli

METRIC_KEYS = {
    "docs_in",
    "docs_out",
    "docs_heldout",
    "bad_records",
    "rejected",
    "duplicates_removed",
    "chars_in",
    "chars_out",
}


@pytest.fixture(scope="module")
def cleaned(tmp_path_factory, nob_eng_cleaned):
    return copy_of(nob_eng_cleaned, tmp_path_factory, "nob", langs=("nob",))


def test_writes_shards_and_marker_with_metrics(cleaned, embedded_records):
    cwd = cleaned
    out = cwd / "work" / "nob" / "clean"
    m = marker(cwd / "work", "nob", "clean")
    assert m["stage"] == "clean" and m["lang"] == "nob" and len(m["config_hash"]) == 16
    assert METRIC_KEYS <= set(m["metrics"])
    # the raw input is recorded by its files (count, size, hash of names, sizes and times), not its
    # path
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
    # every document read is accounted for: kept, held out, in a held-out source or rejected (and
    # written as such)
    rejected = read_jsonl_gz(out / "rejected")
    heldout_source = read_jsonl_gz(out / "heldout_source")
    assert len(rejected) == sum(metrics["rejected"].values())
    assert len(heldout_source) == metrics["docs_heldout_source"] > 0
    assert sum(len(r["text"]) for r in heldout_source) == metrics["chars_heldout_source"]
    assert (
        metrics["docs_out"] + metrics["docs_heldout"] + len(heldout_source) + len(rejected)
        == metrics["docs_in"]
    )
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
    source_ids = {r["id"] for r in read_jsonl_gz(out / "heldout_source")}
    assert train_ids.isdisjoint(heldout_ids) and source_ids.isdisjoint(train_ids | heldout_ids)
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
    result = run_cli(
        "stage=clean",
        "lang=nb",
        "lang.filters.line_punct_thr=0.5",
        "clean.dedup.enabled=false",
        cwd=cwd,
    )
    after = marker(cwd / "work", "nob", "clean")
    assert "changed" in result.stderr + result.stdout
    assert after["config_hash"] != before["config_hash"]
    assert after["config"]["lang"]["filters"]["line_punct_thr"] == 0.5
    # a stricter punctuation threshold rejects more documents
    assert (
        after["metrics"]["rejected"]["fineweb_quality"]
        > before["metrics"]["rejected"]["fineweb_quality"]
    )


def _by_raw_file(records: list[dict]) -> collections.Counter:
    return collections.Counter(r["metadata"]["raw_file"] for r in records)


def test_per_source_metrics_say_where_each_raw_files_documents_went(cleaned):
    out = cleaned / "work" / "nob" / "clean"
    metrics = marker(cleaned / "work", "nob", "clean")["metrics"]
    sources = metrics["sources"]
    raw_files = sorted(p.name for p in (DATA / "nob").glob("*.jsonl.gz"))
    assert sorted(sources) == raw_files
    for name in raw_files:
        with gzip.open(DATA / "nob" / name, "rt", encoding="utf-8") as handle:
            texts = [json.loads(line)["text"] for line in handle if line.strip()]
        assert (sources[name]["docs_in"], sources[name]["chars_in"]) == (
            len(texts),
            sum(map(len, texts)),
        ), name
    # each file's counts are those of the documents written to each split and rejected/<filter>/
    splits = {
        "docs_out": "train",
        "docs_heldout": "heldout",
        "docs_heldout_source": "heldout_source",
    }
    for key, split in splits.items():
        written = _by_raw_file(read_jsonl_gz(out / split))
        assert {name: entry[key] for name, entry in sources.items() if entry[key]} == dict(
            written
        ), key
    for filter_name in metrics["rejected"]:
        written = _by_raw_file(read_jsonl_gz(out / "rejected" / filter_name))
        assert {
            name: entry["rejected"][filter_name]
            for name, entry in sources.items()
            if entry["rejected"][filter_name]
        } == dict(written), filter_name
    # and they add up to the totals, characters too
    for key in (
        "docs_in",
        "chars_in",
        "docs_out",
        "chars_out",
        "docs_heldout",
        "chars_heldout",
        "docs_heldout_source",
        "chars_heldout_source",
    ):
        assert sum(entry[key] for entry in sources.values()) == metrics[key], key
    for name, entry in sources.items():
        kept = entry["docs_out"] + entry["docs_heldout"] + entry["docs_heldout_source"]
        assert kept + sum(entry["rejected"].values()) == entry["docs_in"], name
        assert (
            entry["chars_out"]
            + entry["chars_heldout"]
            + entry["chars_heldout_source"]
            + sum(entry["chars_rejected"].values())
            == entry["chars_in"]
        ), name
    # the legal text loses documents to a filter: the report's table shows it, one row per file
    assert any(
        sum(sources[name]["rejected"].values()) for name in raw_files if name.startswith("lovdata_")
    )
    report = (out / "report.md").read_text(encoding="utf-8")
    for name in raw_files:
        row = next(line for line in report.splitlines() if line.startswith(f"| `{name}` |"))
        assert row.split(" | ")[1] == str(sources[name]["docs_in"])


def test_the_ud_files_are_a_heldout_source_by_default_never_trained_on(cleaned):
    out = cleaned / "work" / "nob" / "clean"
    metrics = marker(cleaned / "work", "nob", "clean")["metrics"]
    assert metrics["heldout_source_files"] == ["ud_dev.jsonl.gz", "ud_test.jsonl.gz"]
    held = read_jsonl_gz(out / "heldout_source")
    assert set(_by_raw_file(held)) == {"ud_dev.jsonl.gz", "ud_test.jsonl.gz"}
    assert all(r["id"].startswith("UD_") for r in held)
    trained_on = read_jsonl_gz(out / "train") + read_jsonl_gz(out / "heldout")
    assert not any(
        r["metadata"]["raw_file"].startswith("ud_") or r["id"].startswith("UD_") for r in trained_on
    )
    # the other stages read the split through the corpus helpers
    source = clean_output("nob", out, split="heldout_source")
    assert sorted(d.id for d in read_documents(source, cleaned / "scratch")) == sorted(
        r["id"] for r in held
    )
