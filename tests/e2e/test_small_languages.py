"""Small languages on the embedded data with default settings: held-out text is guaranteed, so the
tokenizer report has something to score (Greek and Maltese: 91 and 105 documents, of which 2% is 0
held out)."""

from __future__ import annotations

import json

from pipeline.corpus.clean_config import CleanConfig, no_heldout_advice
from tests.conftest import marker, read_jsonl_gz, run_cli

LANGS = ("ell", "mlt")


def test_acceptance_greek_and_maltese_keep_heldout_documents_that_the_tokenizer_report_scores(
    tmp_path,
):
    for stage in ("clean", "mix", "tokenizer"):
        run_cli(
            "-m",
            f"stage={stage}",
            f"lang={','.join(LANGS)}",
            "tokenizer.vocab_size=1024",
            cwd=tmp_path,
        )
    for lang in LANGS:
        metrics = marker(tmp_path / "work", lang, "clean")["metrics"]
        heldout = read_jsonl_gz(tmp_path / "work" / lang / "clean" / "heldout")
        assert len(heldout) == metrics["docs_heldout"] == 10 == CleanConfig().heldout_min_documents
        assert metrics["heldout_added_for_minimum"] > 0
        report = json.loads(
            (tmp_path / "work" / lang / "tokenizer" / "report.json").read_text(encoding="utf-8")
        )
        assert report["heldout"]["documents"] == 10 and report["new"]["scores"]["fertility"] > 0


def test_the_advice_for_missing_heldout_text_never_names_a_setting_in_force():
    assert no_heldout_advice(CleanConfig(heldout_fraction=0.0, heldout_min_documents=0)) == (
        "run clean with clean.heldout_fraction > 0 or clean.heldout_min_documents > 0."
    )
    advice = no_heldout_advice(CleanConfig())
    assert "heldout_fraction > 0" not in advice and "clean.heldout_min_documents=10" in advice
