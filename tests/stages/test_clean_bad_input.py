"""Bad input never crashes the clean stage or loses a valid document."""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tests.conftest import marker, read_jsonl_gz, run_cli


def _line(record) -> bytes:
    return (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")


def _recoverable_prefix(truncated_gz: bytes) -> list[bytes]:
    """The complete lines that a truncated gzip stream still holds."""
    data = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(truncated_gz)
    return data.split(b"\n")[:-1]


def build_raw_dir(root, records):
    """A raw folder that mixes valid records with each kind of bad input. Returns (valid ids, bad
    count)."""
    folder = root / "raw" / "fao"
    (folder / "sub").mkdir(parents=True)
    chunks = [records[i::5] for i in range(5)]
    valid, bad = set(), 0

    # 1. plain JSONL with malformed JSON, invalid UTF-8, empty/whitespace text, missing text,
    #    non-object
    plain = b""
    for i, record in enumerate(chunks[0]):
        plain += _line(record)
        valid.add(record["id"])
        if i == 1:
            plain += b'{"id": "broken", "text": "unterminated\n'
            plain += b'{"id": "latin1", "text": "caf\xe9 \xff"}\n'
            plain += _line({"id": "empty", "text": ""})
            plain += _line({"id": "blank", "text": "  \n\t "})
            plain += _line({"id": "no-text", "body": "text under another key"})
            plain += _line(["not", "an", "object"])
            plain += _line({"id": "number", "text": 42})
            bad += 7
    (folder / "mixed.jsonl").write_bytes(plain)

    # 2. an empty file
    (folder / "empty.jsonl").write_bytes(b"")
    bad += 1

    # 3. a truncated gzip: what can still be decompressed is kept
    whole = gzip.compress(b"".join(_line(r) for r in chunks[1]))
    truncated = whole[: int(len(whole) * 0.6)]
    (folder / "sub" / "truncated.jsonl.gz").write_bytes(truncated)
    valid |= {json.loads(line)["id"] for line in _recoverable_prefix(truncated)}
    bad += 1

    # 4. zstd and parquet, the latter with a null text
    (folder / "docs.jsonl.zst").write_bytes(
        zstandard.ZstdCompressor().compress(b"".join(_line(r) for r in chunks[2]))
    )
    valid |= {r["id"] for r in chunks[2]}
    rows = [{"id": r["id"], "text": r["text"], "lang": r["lang"]} for r in chunks[3]]
    rows.append({"id": "null-text", "text": None, "lang": "fao"})
    bad += 1
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), buffer)
    (folder / "docs.parquet").write_bytes(buffer.getvalue())
    valid |= {r["id"] for r in chunks[3]}

    # 5. a valid gzip, and a file type the stage does not read (ignored, not an error)
    (folder / "good.jsonl.gz").write_bytes(gzip.compress(b"".join(_line(r) for r in chunks[4])))
    valid |= {r["id"] for r in chunks[4]}
    (folder / "notes.txt").write_text("not a corpus file")

    # 6. a file whose name is not valid UTF-8 (Latin-1 "café"), next to the valid ones: one bad
    #    record
    with open(os.path.join(os.fsencode(folder / "sub"), b"caf\xe9.jsonl"), "wb") as handle:
        handle.write(_line({"id": "unreachable", "text": "Ein skjal sum ongin kann lesa."}))
    bad += 1
    return valid, bad


def test_every_valid_document_survives_and_bad_records_are_counted(tmp_path, embedded_records):
    valid, bad = build_raw_dir(tmp_path, embedded_records["fao"])
    assert len(valid) > 40
    run_cli(
        "stage=clean",
        "lang=fao",
        f"raw_dir={tmp_path / 'raw'}",
        f"work_dir={tmp_path / 'out'}",
        cwd=tmp_path,
    )

    out = tmp_path / "out" / "fao" / "clean"
    metrics = marker(tmp_path / "out", "fao", "clean")["metrics"]
    assert metrics["bad_records"] == bad
    assert metrics["bad_records_by_reason"] == {
        "malformed_json": 1,
        "invalid_utf8": 1,
        "empty_text": 2,
        "missing_text": 2,
        "not_an_object": 1,
        "text_not_a_string": 1,
        "empty_file": 1,
        "truncated_or_corrupt_file": 1,
        "file_name_not_utf8": 1,
    }
    assert metrics["docs_in"] == len(valid)

    found = {
        r["id"] for folder in ("train", "heldout", "rejected") for r in read_jsonl_gz(out / folder)
    }
    assert found == valid  # every valid document is in the output, held out or rejected: none lost

    logged = [
        json.loads(line) for f in sorted((out / "bad_records").glob("*.jsonl")) for line in f.open()
    ]
    assert len(logged) == bad
    assert {"file", "line", "reason"} <= set(logged[0])
    assert any(
        entry["file"] == "mixed.jsonl" and entry["reason"] == "invalid_utf8" and entry["line"] == 4
        for entry in logged
    )
    assert {
        "file": "sub/caf\\xe9.jsonl",
        "line": 0,
        "reason": "file_name_not_utf8",
    } in logged  # shown escaped


def test_raw_dir_without_readable_files_names_the_folder_and_patterns(tmp_path):
    (tmp_path / "raw" / "fao").mkdir(parents=True)
    (tmp_path / "raw" / "fao" / "readme.txt").write_text("nothing to read")
    result = run_cli(
        "stage=clean", "lang=fao", f"raw_dir={tmp_path / 'raw'}", cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    message = result.stderr + result.stdout
    assert str(tmp_path / "raw" / "fao") in message
    assert "*.jsonl.gz" in message and "*.parquet" in message
    assert not (tmp_path / "work" / "fao" / "clean").exists()


def test_missing_language_folder_says_where_it_looked(tmp_path):
    (tmp_path / "raw").mkdir()
    result = run_cli(
        "stage=clean", "lang=fao", f"raw_dir={tmp_path / 'raw'}", cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    assert "No raw input for fao" in result.stderr + result.stdout
