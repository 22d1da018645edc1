"""`clean.heldout_sources`: whole raw files held out as a never-trained source, and the per-file
counts of the clean pipeline's blocks (the run on the embedded sample is in test_clean_nob.py)."""

from __future__ import annotations

import dataclasses
import logging
from types import SimpleNamespace

import pytest
from datatrove.data import Document
from datatrove.pipeline.writers import JsonlWriter
from omegaconf import OmegaConf

from pipeline.config import PipelineConfig
from pipeline.corpus.cleaning import heldout_sources
from pipeline.corpus.clean_config import heldout_source_patterns
from pipeline.corpus.heldout import HeldoutSourceSplit, is_heldout_source
from pipeline.corpus.source_counts import (
    HELDOUT,
    HELDOUT_SOURCE,
    READ,
    SourceTally,
    per_source,
)
from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError
from pipeline.json_files import write_json_atomic
from pipeline.languages import LANGUAGES, language_config
from tests.conftest import read_jsonl_gz, run_cli


def _doc(doc_id: str, raw_file: str, text: str = "Tekst.", source: str = "") -> Document:
    return Document(text=text, id=doc_id, metadata={"raw_file": raw_file, "source": source})


def _patterns(lang: str, *overrides: str) -> list[str]:
    cfg = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(PipelineConfig),
            {"lang": OmegaConf.structured(language_config(lang, LANGUAGES[lang]))},
            OmegaConf.from_dotlist(["stage=clean", *overrides]),
        )
    )
    return heldout_source_patterns(cfg.clean, cfg.lang)


def test_the_default_comes_from_the_language_table():
    assert _patterns("nob") == ["ud_*", "regjeringen_*"]
    # one book, by its records' source, and UD's web text, reviews and email
    assert _patterns("eng") == ["*Adventures-of-Sherlock-Holmes*", "ud_*"]
    assert _patterns("fin") == []  # a language without the field holds out no source
    assert _patterns("nob", "clean.heldout_sources=[stortinget_*]") == ["stortinget_*"]
    assert _patterns("nob", "lang.heldout_sources=[]") == []
    assert _patterns("nob", "clean.heldout_sources=[]") == []


def test_the_default_follows_the_language_a_run_cleans():
    # stage=all cleans the base's language (and the demo's) from the target's config: the patterns
    # are the language's own, not the target's
    nob = OmegaConf.to_object(
        OmegaConf.merge(
            OmegaConf.structured(PipelineConfig),
            {"lang": OmegaConf.structured(language_config("nob", LANGUAGES["nob"]))},
            {"stage": "clean"},
        )
    )
    eng = dataclasses.replace(nob, lang=language_config("eng", LANGUAGES["eng"]))
    assert heldout_source_patterns(eng.clean, eng.lang) == [
        "*Adventures-of-Sherlock-Holmes*",
        "ud_*",
    ]


def test_the_command_line_shows_the_default(tmp_path):
    shown = OmegaConf.create(
        run_cli("--cfg", "job", "stage=clean", "lang=nob", cwd=tmp_path).stdout
    )
    assert shown.clean.heldout_sources is None and list(shown.lang.heldout_sources) == [
        "ud_*",
        "regjeringen_*",
    ]


def test_patterns_match_a_files_path_or_its_name_or_the_records_source():
    patterns = ["regjeringen_*", "2024/ud_*", "*Sherlock-Holmes*"]
    assert is_heldout_source("regjeringen_giellalt.jsonl.gz", "", patterns)
    assert is_heldout_source("sub/regjeringen_a.parquet", "", patterns)
    assert is_heldout_source("2024/ud_test.jsonl.gz", "", patterns)
    assert not is_heldout_source("2023/ud_test.jsonl.gz", "", patterns)
    assert not is_heldout_source("lovdata_regjeringen.jsonl.gz", "", patterns)
    assert not is_heldout_source("regjeringen_a.jsonl.gz", "", [])
    # one book of a file of books
    assert is_heldout_source(
        "books.jsonl.gz", "github.com/GITenberg/The-Adventures-of-Sherlock-Holmes_1661", patterns
    )
    assert not is_heldout_source("books.jsonl.gz", "github.com/GITenberg/Dracula_345", patterns)


def test_the_split_writes_held_out_files_and_passes_the_rest_on(tmp_path):
    docs = [
        _doc("a", "lovdata_1.jsonl.gz"),
        _doc("b", "regjeringen_x.jsonl.gz"),
        _doc("c", "npk.jsonl.gz"),
        _doc("d", "sub/regjeringen_y.jsonl.gz", "Lengre tekst."),
        _doc("e", "npk.jsonl.gz", "Tre.", "høring 7"),
    ]
    split = HeldoutSourceSplit(
        ["regjeringen_*", "høring*"], JsonlWriter(str(tmp_path / "heldout_source"))
    )
    passed = list(split.run(iter(docs)))
    assert [d.id for d in passed] == ["a", "c"]
    assert sorted(r["id"] for r in read_jsonl_gz(tmp_path / "heldout_source")) == ["b", "d", "e"]
    assert split.stats["heldout_source"].total == 3
    assert split.stats["heldout_source_chars"].total == len("Tekst.") + len("Lengre tekst.") + len(
        "Tre."
    )


def test_tallies_give_what_each_step_took_from_each_file(tmp_path):
    counts = tmp_path / "counts"
    docs = [
        _doc("a", "x.jsonl", "aa"),
        _doc("b", "x.jsonl", "bbb"),
        _doc("c", "y.jsonl", "c"),
        _doc("d", "y.jsonl", "dddd"),
        _doc("e", "x.jsonl", "e"),
    ]

    def drop(ids):
        return lambda stream: (d for d in stream if d.id not in ids)

    # read -> a filter that drops b and c -> routing d away -> split e away -> training: a
    stream = SourceTally(counts, READ).run(iter(docs), rank=0)
    stream = SourceTally(counts, "quality").run(drop({"b", "c"})(stream), rank=0)
    stream = SourceTally(counts, HELDOUT_SOURCE).run(drop({"d"})(stream), rank=0)
    stream = SourceTally(counts, HELDOUT).run(drop({"e"})(stream), rank=0)
    assert [d.id for d in stream] == ["a"]
    sources = per_source(counts, ["quality"], ["x.jsonl", "y.jsonl", "empty.jsonl"])
    assert sources["x.jsonl"] == {
        "docs_in": 3,
        "chars_in": 6,
        "docs_out": 1,
        "chars_out": 2,
        "docs_heldout": 1,
        "chars_heldout": 1,
        "docs_heldout_source": 0,
        "chars_heldout_source": 0,
        "rejected": {"quality": 1},
        "chars_rejected": {"quality": 3},
    }
    assert (
        sources["y.jsonl"]["docs_heldout_source"] == 1
        and sources["y.jsonl"]["chars_heldout_source"] == 4
    )
    assert sources["y.jsonl"]["rejected"] == {"quality": 1} and sources["y.jsonl"]["docs_out"] == 0
    assert sources["empty.jsonl"]["docs_in"] == 0  # a file that gave no document is still listed


def _files(cfg_patterns, files, caplog, table=()):
    """The raw files held out with clean.heldout_sources=`cfg_patterns` (None: the table's,
    `table`)."""
    cfg = SimpleNamespace(
        clean=SimpleNamespace(heldout_sources=cfg_patterns),
        lang=SimpleNamespace(code="nob", heldout_sources=list(table)),
    )
    with caplog.at_level(logging.INFO, logger="pipeline.corpus.cleaning"):
        patterns, held = heldout_sources(cfg.clean, cfg.lang, "/raw/nob", files)
    assert patterns == (list(table) if cfg_patterns is None else cfg_patterns) or held == []
    return held


def test_a_pattern_that_matches_no_file_is_logged_not_an_error(caplog):
    files = ["lovdata_a.jsonl.gz", "regjeringen_giellalt.jsonl.gz", "ud_test.jsonl.gz"]
    assert _files(["ud_*", "stortinget_*"], files, caplog) == ["ud_test.jsonl.gz"]
    assert "'stortinget_*' matches no raw file" in caplog.text
    caplog.clear()
    assert _files(["hplt_*"], files, caplog) == []
    assert (
        "'hplt_*' matches no raw file" in caplog.text
        and "holds out the records whose `source` it matches" in caplog.text
    )
    assert _files([], files, caplog) == []


def test_holding_out_every_file_is_refused(caplog):
    with pytest.raises(StageError, match=r"holds out every raw file .*clean.heldout_sources=\[\]"):
        _files(["*"], ["lovdata_a.jsonl.gz", "ud_test.jsonl.gz"], caplog)


def test_the_language_tables_sources_are_dropped_where_they_would_take_every_file(caplog):
    """The table's Faroese `ud_*` holds out UD beside the parliament's text, and nothing of a
    UD-only sample."""
    ud_only = ["ud_dev.jsonl.gz", "ud_test.jsonl.gz", "ud_train.jsonl.gz"]
    assert _files(None, ud_only, caplog, table=["ud_*"]) == []
    assert "would hold out every raw file" in caplog.text
    cfg = SimpleNamespace(
        clean=SimpleNamespace(heldout_sources=None),
        lang=SimpleNamespace(code="fao", heldout_sources=["ud_*"]),
    )
    assert heldout_sources(cfg.clean, cfg.lang, "/raw/fao", ud_only) == ([], [])
    assert heldout_sources(cfg.clean, cfg.lang, "/raw/fao", ["tingmal.jsonl.gz", *ud_only]) == (
        ["ud_*"],
        ud_only,
    )


def test_an_empty_or_missing_split_reads_as_no_documents(tmp_path):
    write_json_atomic(tmp_path / "_SUCCESS.json", {"config_hash": "0" * 16})
    (tmp_path / "heldout_source").mkdir()
    for split in (
        "heldout_source",
        "heldout",
    ):  # an empty folder; no folder (a clean from before the split)
        source = clean_output("nob", tmp_path, split=split)
        assert source.files == () and list(read_documents(source, tmp_path / "scratch")) == []
    with pytest.raises(ValueError, match="is not one of train, heldout, heldout_source"):
        clean_output("nob", tmp_path, split="heldout_sources")
