"""bench/compact_results.py: a raw benchmark folder becomes one compact file, JSON or Markdown, that
keeps the tables and reports (less per-run JSON rows), the command, device and date, and drops what
`--keep` leaves out and what is neither text nor JSON (patches, scripts)."""

from __future__ import annotations

import importlib.util
import json

from tests.conftest import REPO


def _compact():
    spec = importlib.util.spec_from_file_location(
        "compact_results", REPO / "bench" / "compact_results.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compact


def _raw(tmp_path):
    raw = tmp_path / "run_2026-01-01"
    (raw / "fao").mkdir(parents=True)
    (raw / "notes.md").write_text("# Notes\n\nCommand: `x`.\n", encoding="utf-8")
    (raw / "train.md").write_text(
        '| run | tokens/s |\n|---|---:|\n| ours | 64,767 |\n\n```json\n[{"losses": [1, 2]}]\n```\n',
        encoding="utf-8",
    )
    (raw / "fao" / "report.json").write_text(json.dumps({"bits_per_byte": 1.085}), encoding="utf-8")
    (raw / "fix.patch").write_text("--- a\n+++ b\n", encoding="utf-8")
    (raw / "run_log.txt").write_text("step 1\n", encoding="utf-8")
    (raw / "fao" / "report.md").write_text(
        "# Evaluation\n\n![bits per byte](bpb.png)\n", encoding="utf-8"
    )
    (raw / "fao" / "bpb.png").write_bytes(b"\x89PNG")
    return raw


ABOUT = {
    "experiment": "run_2026-01-01",
    "command": ["python bench/x.py", "python bench/y.py"],
    "device": "H100",
    "date": "2026-01-01",
}


def test_markdown_keeps_the_chosen_tables_without_their_json_rows(tmp_path):
    out = tmp_path / "run_2026-01-01.md"
    result = _compact()(_raw(tmp_path), out, ABOUT, keep=["*.md", "fao/*.json"])
    text = out.read_text(encoding="utf-8")
    assert sorted(result["files"]) == ["fao/report.json", "fao/report.md", "notes.md", "train.md"]
    assert sorted(result["dropped"]) == ["fao/bpb.png", "fix.patch", "run_log.txt"]
    assert (
        "(plot `bpb.png`: not kept)" in text and "](bpb.png)" not in text
    )  # no link to a file that is not there
    assert (
        "| ours | 64,767 |" in text
        and '"losses"' not in text
        and "per-run JSON rows not kept" in text
    )
    assert (
        "- command: `python bench/y.py`" in text
        and "- device: H100" in text
        and "- date: 2026-01-01" in text
    )
    assert "### Notes" in text  # the file's own heading, two levels down under its section
    assert '"bits_per_byte": 1.085' in text


def test_json_without_keep_keeps_every_text_and_json_file_and_drops_the_rest(tmp_path):
    out = tmp_path / "run_2026-01-01.json"
    _compact()(_raw(tmp_path), out, {**ABOUT, "command": "python bench/x.py"})
    result = json.loads(out.read_text(encoding="utf-8"))
    assert sorted(result["files"]) == [
        "fao/report.json",
        "fao/report.md",
        "notes.md",
        "run_log.txt",
        "train.md",
    ]
    assert result["dropped"] == ["fix.patch"] and result["images"] == {
        "fao/bpb.png": "run_2026-01-01.png"
    }
    assert (tmp_path / "run_2026-01-01.png").read_bytes() == b"\x89PNG"
    assert '"losses"' not in result["files"]["train.md"]
    assert (
        result["files"]["fao/report.json"] == {"bits_per_byte": 1.085}
        and result["command"] == "python bench/x.py"
    )
