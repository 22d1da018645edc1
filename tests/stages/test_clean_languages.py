"""The clean stage on several languages and scripts, with a local language-ID model, and in
parallel (the same bytes whatever the task layout)."""

from __future__ import annotations

import gzip
import json
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import marker, read_jsonl_gz, run_cli, write_jsonl_gz

# Latin, Cyrillic, Greek, Arabic and Devanagari script; UD documents are short, hence min_doc_words.
SCRIPTS = {
    "fin": "LATIN",
    "mlt": "LATIN",
    "rus": "CYRILLIC",
    "ell": "GREEK",
    "ara": "ARABIC",
    "hin": "DEVANAGARI",
}


def _main_script(text: str) -> str:
    letters = [unicodedata.name(ch, "").split(" ")[0] for ch in text if ch.isalpha()]
    return max(set(letters), key=letters.count)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    """One Hydra multirun over the six scripts' languages and Faroese, given by other codes
    (aliases)."""
    cwd = tmp_path_factory.mktemp("scripts")
    result = run_cli(
        "-m", "stage=clean", "lang=fi,mt,ru,el,ar,hi,fo", "clean.gopher_min_doc_words=5", cwd=cwd
    )
    return cwd, result


@pytest.mark.parametrize("lang", sorted(SCRIPTS))
def test_clean_runs_for_each_script(lang, swept, embedded_records):
    cwd, _ = swept
    metrics = marker(cwd / "work", lang, "clean")["metrics"]
    assert metrics["docs_in"] == len(embedded_records[lang])
    assert metrics["docs_out"] > 0
    assert (
        metrics["docs_heldout"] >= 10
    )  # clean.heldout_min_documents, although 2% of these corpora is 0-3 documents
    assert (
        metrics["docs_out"] + metrics["docs_heldout"] + sum(metrics["rejected"].values())
        == metrics["docs_in"]
    )
    kept = read_jsonl_gz(cwd / "work" / lang / "clean" / "train")
    assert all(_main_script(r["text"]) == SCRIPTS[lang] for r in kept)


def _raw_folder_to_split(root: Path, records: list[dict]) -> dict:
    """raw/nno/ with a gzipped JSONL file large enough to be split, holding a bad line, a record
    without an id and, after the rest, copies of earlier records (near-duplicates), beside a small
    Parquet and a plain JSONL file. Returns what the test checks against."""
    folder = root / "raw" / "nno"
    folder.mkdir(parents=True)
    lines = [json.dumps(r, ensure_ascii=False).encode() + b"\n" for r in records[:380]]
    lines.insert(120, b'{"id": "broken", "text": \n')
    unnamed = " ".join(reversed(records[299]["text"].split()))
    lines.insert(260, json.dumps({"text": unnamed}).encode() + b"\n")
    copies = {f"copy-{i}": records[i] for i in range(0, 380, 60)}
    lines += [json.dumps({**r, "id": name}).encode() + b"\n" for name, r in copies.items()]
    (folder / "web.jsonl.gz").write_bytes(gzip.compress(b"".join(lines)))
    pq.write_table(
        pa.Table.from_pylist(records[380:430]), folder / "rows.parquet", row_group_size=9
    )
    (folder / "held.jsonl").write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records[430:]), encoding="utf-8"
    )
    return {
        "broken_line": 121,
        "unnamed_id": "web.jsonl.gz:261",
        "copies": set(copies),
        "originals": {r["id"] for r in copies.values()},
    }


def _output_bytes(out: Path) -> dict[str, bytes]:
    """Every output file that must not depend on the task layout, by its path."""
    files = {
        str(path.relative_to(out)): path.read_bytes()
        for part in ("train", "heldout", "heldout_source", "rejected", "bad_records")
        for path in sorted((out / part).rglob("*"))
        if path.is_file()
    }
    metrics = json.loads((out / "_SUCCESS.json").read_text(encoding="utf-8"))["metrics"]
    return {**files, "report.md": (out / "report.md").read_bytes(), "metrics": metrics}


def test_any_task_layout_gives_the_same_bytes(tmp_path, embedded_records):
    """One task reading every file whole, and 3 workers running tasks that read the large file in
    parts (clean.min_part_bytes lowered), with two tasks per MinHash bucket: the same shards, bad
    records, report and metrics, byte for byte, and the same config hash."""
    expected = _raw_folder_to_split(tmp_path, embedded_records["nno"])
    same = (
        "stage=clean",
        "lang=nno",
        f"raw_dir={tmp_path / 'raw'}",
        "clean.heldout_sources=[held.jsonl]",
        "clean.heldout_min_documents=30",
        "clean.shard_bytes=100000",
        "clean.dedup.num_buckets=2",
    )
    run_cli(*same, "workers=1", "work_dir=one", cwd=tmp_path)
    parts = ("workers=3", "clean.tasks=3", "clean.min_part_bytes=20000", "work_dir=parts")
    result = run_cli(*same, *parts, cwd=tmp_path)

    one, split = (tmp_path / name / "nno" / "clean" for name in ("one", "parts"))
    layout = json.loads((split / "task_layout.json").read_text())
    split_files = {layout["files"][i] for pieces in layout["tasks"] for i, _, n in pieces if n > 1}
    assert split_files == {"web.jsonl.gz"} and len(layout["tasks"]) > 3
    assert len(list((split / "logs" / "2_minhash_buckets" / "stats").glob("*.json"))) >= 4
    hashes = {marker(tmp_path / name, "nno", "clean")["config_hash"] for name in ("one", "parts")}
    assert len(hashes) == 1
    assert _output_bytes(split) == _output_bytes(one)
    assert len(list((one / "train").glob("*.jsonl.gz"))) > 1

    # ... and that output is right: the line numbers are the file's, the copies are what MinHash
    # removed (the first of a cluster stays), every document is accounted for.
    metrics = marker(tmp_path / "one", "nno", "clean")["metrics"]
    bad = [json.loads(line) for line in (one / "bad_records" / "records.jsonl").open()]
    assert [(b["file"], b["line"], b["reason"]) for b in bad] == [
        ("web.jsonl.gz", expected["broken_line"], "malformed_json")
    ]
    assert expected["unnamed_id"] in {r["id"] for r in read_jsonl_gz(one)}
    duplicates = {r["id"] for r in read_jsonl_gz(one / "rejected" / "minhash_duplicate")}
    assert duplicates & expected["copies"] and not duplicates & expected["originals"]
    assert metrics["docs_in"] == len(embedded_records["nno"]) + len(expected["copies"]) + 1
    assert metrics["docs_heldout_source"] > 0 and metrics["heldout_added_for_minimum"] > 0
    # The phases' progress lines, with their rates.
    logged = result.stderr + result.stdout
    assert "phase 1_filter: done" in logged and " B/s" in logged
    assert "phase 2_minhash_buckets: done" in logged and " docs/s" in logged


def _train_lid_model(path, embedded_records):
    """A small fastText classifier with GlotLID-style labels, trained on UD sentences."""
    import fasttext

    lines = []
    for lang, label in (("nob", "nob_Latn"), ("eng", "eng_Latn"), ("fin", "fin_Latn")):
        for record in embedded_records[lang]:
            if "UD_" in record["id"]:
                lines += [
                    f"__label__{label} {line}"
                    for line in record["text"].split(". ")
                    if line.strip()
                ]
    train = path.with_suffix(".txt")
    train.write_text("\n".join(lines), encoding="utf-8")
    model = fasttext.train_supervised(
        str(train),
        epoch=15,
        lr=0.5,
        wordNgrams=2,
        minn=2,
        maxn=4,
        dim=32,
        thread=1,
        seed=1,
        verbose=0,
    )
    model.save_model(str(path))


def test_language_id_with_a_local_model_rejects_other_languages(tmp_path, embedded_records):
    model = tmp_path / "lid.bin"
    _train_lid_model(model, embedded_records)
    # documents not used for training, all claiming to be Bokmål
    nob = [r for r in embedded_records["nob"] if r["id"].startswith("npk_cc0")][:60]
    eng = [r for r in embedded_records["eng"] if "gutenberg" in r["id"]][:20]
    write_jsonl_gz(
        tmp_path / "raw" / "nob" / "mixed.jsonl.gz", [{**r, "lang": "nob"} for r in nob + eng]
    )

    run_cli(
        "stage=clean",
        "lang=nob",
        f"raw_dir={tmp_path / 'raw'}",
        f"clean.lid.model={model}",
        "clean.lid.threshold=0.5",
        "clean.gopher_quality=false",
        "clean.gopher_repetition=false",
        "clean.fineweb_quality=false",
        "clean.dedup.enabled=false",
        cwd=tmp_path,
    )
    out = tmp_path / "work" / "nob" / "clean"
    metrics = marker(tmp_path / "work", "nob", "clean")["metrics"]
    assert metrics["language_id"]["model"] == str(model) and metrics["language_id"]["labels"] == [
        "nob_Latn"
    ]
    rejected = {r["id"] for r in read_jsonl_gz(out / "rejected" / "language_id")}
    kept = {r["id"] for part in ("train", "heldout") for r in read_jsonl_gz(out / part)}
    assert {r["id"] for r in eng} <= rejected
    assert len(kept & {r["id"] for r in nob}) >= 0.95 * len(nob)
    assert all(r["metadata"]["language"] for r in read_jsonl_gz(out / "train"))


def test_acceptance_lid176_by_default_rejects_what_claims_to_be_norwegian_but_is_not(
    tmp_path, embedded_records
):
    nob = [r for r in embedded_records["nob"] if r["id"].startswith("npk_cc0")][:60]
    eng = [r for r in embedded_records["eng"] if "gutenberg" in r["id"]][:10] + [
        r for r in embedded_records["eng"] if "UD_" in r["id"]
    ][:10]
    fin = embedded_records["fin"][:20]
    write_jsonl_gz(
        tmp_path / "raw" / "nob" / "mixed.jsonl.gz", [{**r, "lang": "nob"} for r in nob + eng + fin]
    )

    run_cli(
        "stage=clean",
        "lang=nob",
        f"raw_dir={tmp_path / 'raw'}",
        "clean.gopher_quality=false",
        "clean.gopher_repetition=false",
        "clean.fineweb_quality=false",
        "clean.dedup.enabled=false",
        cwd=tmp_path,
    )
    out = tmp_path / "work" / "nob" / "clean"
    metrics = marker(tmp_path / "work", "nob", "clean")["metrics"]
    language_id = metrics["language_id"]
    assert language_id["model"].endswith("lid.176.ftz") and "lid.176" in language_id["description"]
    assert language_id["labels"] == ["no", "nn"]
    rejected = read_jsonl_gz(out / "rejected" / "language_id")
    assert {r["id"] for r in rejected} == {r["id"] for r in eng + fin}
    assert metrics["rejected"] == {"language_id": 40}
    assert metrics["rejected_by_reason"] == {
        "language_id.predicted_en": 20,
        "language_id.predicted_fi": 20,
    }
    assert all(
        r["metadata"]["language"] in ("en", "fi") and r["metadata"]["language_score"] > 0.5
        for r in rejected
    )
    kept = {r["id"] for part in ("train", "heldout") for r in read_jsonl_gz(out / part)}
    assert kept == {r["id"] for r in nob}


def test_hydra_multirun_sweeps_languages_and_faroese_falls_back_to_the_lang_field(swept):
    cwd, result = swept
    assert "Launching 7 jobs locally" in result.stderr + result.stdout
    assert marker(cwd / "work", "fao", "clean")["metrics"]["docs_out"] > 0
    # lid.176 has no Faroese: the records' `lang` field decides, and the log and the marker say so.
    faroese = marker(cwd / "work", "fao", "clean")["metrics"]
    assert faroese["language_id"]["model"] is None and "declared_language" in faroese["rejected"]
    assert "does not know Faroese" in faroese["language_id"]["description"]
    assert "clean fao: " in result.stderr and "does not know Faroese" in result.stderr
    assert marker(cwd / "work", "mlt", "clean")["metrics"]["language_id"]["labels"] == ["mt"]


def test_c4_filters_run_when_switched_on(tmp_path):
    run_cli(
        "stage=clean", "lang=mlt", "clean.c4=true", "clean.gopher_min_doc_words=5", cwd=tmp_path
    )
    metrics = marker(tmp_path / "work", "mlt", "clean")["metrics"]
    assert "c4_quality" in metrics["rejected"]
    rejected = read_jsonl_gz(tmp_path / "work" / "mlt" / "clean" / "rejected" / "c4_quality")
    assert len(rejected) == metrics["rejected"]["c4_quality"] > 0
