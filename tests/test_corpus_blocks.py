"""The datatrove blocks of the clean stage, one at a time, on HPLT-shaped records."""

from __future__ import annotations

import json

from datatrove.data import Document

from pipeline.corpus.heldout import is_heldout
from pipeline.corpus.language_id import DeclaredLanguageFilter
from pipeline.corpus.reader import RawCorpusReader
from pipeline.languages import LANGUAGES, language_config


def _read(tmp_path, lines: list[str]) -> tuple[list[Document], RawCorpusReader]:
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "part.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "paths.txt").write_text("part.jsonl\n")
    reader = RawCorpusReader(str(folder), str(tmp_path / "paths.txt"), str(tmp_path / "bad"), file_progress=False)
    return list(reader.run()), reader


def test_reader_understands_hplt_v1_and_v2_fields(tmp_path):
    v1 = {"id": "a", "text": "Hei verden.", "url": "https://example.no/a", "document_lang": "nb",
          "scores": [0.9], "collection": "wide5"}
    v2 = {"id": "b", "text": "Hallo.", "u": "https://example.no/b", "lang": ["nob_Latn"], "prob": [0.99]}
    no_id = {"text": "Uten id."}
    docs, reader = _read(tmp_path, [json.dumps(v1), json.dumps(v2), json.dumps(no_id)])
    assert [d.id for d in docs] == ["a", "b", "part.jsonl:3"]
    assert docs[0].metadata == {"collection": "wide5", "url": "https://example.no/a", "declared_lang": "nb",
                                "raw_file": "part.jsonl"}
    assert docs[1].metadata["url"] == "https://example.no/b" and docs[1].metadata["declared_lang"] == ["nob_Latn"]
    assert reader.stats["docs_in"].total == 3
    assert reader.stats["chars_in"].total == sum(len(d.text) for d in docs)


def test_declared_language_accepts_every_code_of_the_language():
    keep = DeclaredLanguageFilter(language_config("nob", LANGUAGES["nob"]))
    for declared in ("nob", "nb", "no", "nob_Latn", ["nob_Latn"], ["eng_Latn", "nob_Latn"], "NB"):
        assert keep.filter(Document(text="x", id="1", metadata={"declared_lang": declared})) is True, declared
    for declared in ("nno", "nn", "eng", ["eng_Latn"], "dan_Latn"):
        assert keep.filter(Document(text="x", id="1", metadata={"declared_lang": declared})) == (
            False, "declared_other_language"), declared
    assert keep.filter(Document(text="x", id="1", metadata={})) is True  # no label: the folder is per language
    assert keep.stats["no_declared_lang"].total == 1


def test_heldout_split_is_deterministic_and_close_to_the_fraction():
    ids = [f"doc-{i}" for i in range(20000)]
    held = [i for i in ids if is_heldout(i, 0.02)]
    assert held == [i for i in ids if is_heldout(i, 0.02)]
    assert 0.017 < len(held) / len(ids) < 0.023
    assert set(held) <= {i for i in ids if is_heldout(i, 0.05)}  # a larger fraction only adds documents
