"""The datatrove blocks of the clean stage, one at a time, on HPLT-shaped records."""

from __future__ import annotations

import json

from datatrove.data import Document

from pipeline.corpus.filters import DeclaredLanguageFilter, LocalLanguageFilter, bundled_lid176
from pipeline.corpus.heldout import choose_top_up, id_hash, is_heldout, move_to_heldout
from pipeline.corpus.reader import RawCorpusReader, fingerprint_files
from pipeline.corpus.words import (
    SpaceSplitTokenizer,
    minhash_word_tokenizer,
    resolve_word_tokenizer,
)
from pipeline.languages import LANGUAGES, language_config
from tests.conftest import read_jsonl_gz, write_jsonl_gz


def _read(tmp_path, lines: list[str]) -> tuple[list[Document], RawCorpusReader]:
    folder = tmp_path / "raw"
    folder.mkdir()
    (folder / "part.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (tmp_path / "paths.txt").write_text("part.jsonl\n")
    reader = RawCorpusReader(
        str(folder), str(tmp_path / "paths.txt"), str(tmp_path / "bad"), file_progress=False
    )
    return list(reader.run()), reader


def test_reader_understands_hplt_v1_and_v2_fields(tmp_path):
    v1 = {
        "id": "a",
        "text": "Hei verden.",
        "url": "https://example.no/a",
        "document_lang": "nb",
        "scores": [0.9],
        "collection": "wide5",
    }
    v2 = {
        "id": "b",
        "text": "Hallo.",
        "u": "https://example.no/b",
        "lang": ["nob_Latn"],
        "prob": [0.99],
    }
    no_id = {"text": "Uten id."}
    docs, reader = _read(tmp_path, [json.dumps(v1), json.dumps(v2), json.dumps(no_id)])
    assert [d.id for d in docs] == ["a", "b", "part.jsonl:3"]
    assert docs[0].metadata == {
        "collection": "wide5",
        "url": "https://example.no/a",
        "declared_lang": "nb",
        "raw_file": "part.jsonl",
    }
    assert docs[1].metadata["url"] == "https://example.no/b" and docs[1].metadata[
        "declared_lang"
    ] == ["nob_Latn"]
    assert reader.stats["docs_in"].total == 3
    assert reader.stats["chars_in"].total == sum(len(d.text) for d in docs)


def test_declared_language_accepts_every_code_of_the_language():
    keep = DeclaredLanguageFilter(language_config("nob", LANGUAGES["nob"]))
    for declared in ("nob", "nb", "no", "nob_Latn", ["nob_Latn"], ["eng_Latn", "nob_Latn"], "NB"):
        assert (
            keep.filter(Document(text="x", id="1", metadata={"declared_lang": declared})) is True
        ), declared
    for declared in ("nno", "nn", "eng", ["eng_Latn"], "dan_Latn"):
        assert keep.filter(Document(text="x", id="1", metadata={"declared_lang": declared})) == (
            False,
            "declared_other_language",
        ), declared
    assert (
        keep.filter(Document(text="x", id="1", metadata={})) is True
    )  # no label: the folder is per language
    assert keep.stats["no_declared_lang"].total == 1


def test_heldout_split_is_deterministic_and_close_to_the_fraction():
    ids = [f"doc-{i}" for i in range(20000)]
    held = [i for i in ids if is_heldout(i, 0.02)]
    assert held == [i for i in ids if is_heldout(i, 0.02)]
    assert 0.017 < len(held) / len(ids) < 0.023
    assert set(held) <= {
        i for i in ids if is_heldout(i, 0.05)
    }  # a larger fraction only adds documents


def test_lid176_keeps_bokmal_under_either_norwegian_label_and_says_what_it_rejected():
    nob = language_config("nob", LANGUAGES["nob"]).lid176
    keep = LocalLanguageFilter(str(bundled_lid176()), nob.labels, nob.threshold)
    norwegian = Document(
        text="Det var en gang en konge som hadde tre døtre, og de bodde i et stort slott ved havet.",
        id="nb",
    )
    english = Document(
        text="Once upon a time there was a king who had three daughters and lived by the sea.",
        id="en",
    )
    finnish = Document(
        text="Olipa kerran kuningas, jolla oli kolme tytärtä, ja he asuivat suuressa linnassa.",
        id="fi",
    )
    assert keep.filter(norwegian) is True
    assert (
        norwegian.metadata["language"] in ("no", "nn", "da")
        and norwegian.metadata["language_id_score"] > 0.5
    )
    assert keep.filter(english) == (False, "predicted_en") and keep.filter(finnish) == (
        False,
        "predicted_fi",
    )
    # a rejected document keeps what the model said
    assert english.metadata["language"] == "en" and english.metadata["language_score"] > 0.5
    assert english.metadata["language_id_score"] < nob.threshold


def test_the_heldout_top_up_moves_the_documents_with_the_smallest_id_hashes(tmp_path):
    records = [
        {"id": f"doc-{i}", "text": "x" * i, "metadata": {"raw_file": f"{i % 3}.jsonl"}}
        for i in range(40)
    ]
    write_jsonl_gz(tmp_path / "train" / "000_00000.jsonl.gz", records[:25])
    write_jsonl_gz(tmp_path / "train" / "001_00000.jsonl.gz", records[25:])
    assert choose_top_up(tmp_path / "train", 0) == ({}, {})
    chosen, moved = choose_top_up(tmp_path / "train", 6)
    assert len(read_jsonl_gz(tmp_path / "train")) == 40  # choosing moves nothing
    move_to_heldout(tmp_path / "train", tmp_path / "heldout", chosen)
    smallest = sorted(records, key=lambda r: id_hash(r["id"]))[:6]
    # per raw file: the documents and characters moved
    expected = {}
    for r in smallest:
        docs, chars = expected.get(r["metadata"]["raw_file"], [0, 0])
        expected[r["metadata"]["raw_file"]] = [docs + 1, chars + len(r["text"])]
    assert moved == expected and sum(docs for docs, _ in moved.values()) == 6
    assert sorted(r["id"] for r in read_jsonl_gz(tmp_path / "heldout")) == sorted(
        r["id"] for r in smallest
    )
    train = read_jsonl_gz(tmp_path / "train")
    assert len(train) == 34 and not {r["id"] for r in train} & {r["id"] for r in smallest}
    # Taken again (a commit killed after the move), the move changes nothing.
    move_to_heldout(tmp_path / "train", tmp_path / "heldout", chosen)
    assert (
        len(read_jsonl_gz(tmp_path / "heldout")) == 6 and read_jsonl_gz(tmp_path / "train") == train
    )


def test_minhash_splits_at_spaces_where_the_script_has_them_and_finds_the_same_shingles():
    from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature

    nob, zho = (language_config(code, LANGUAGES[code]) for code in ("nob", "zho"))
    language_tokenizer, _ = resolve_word_tokenizer(nob)
    assert isinstance(minhash_word_tokenizer(nob, language_tokenizer), SpaceSplitTokenizer)
    assert minhash_word_tokenizer(zho, "cmn_Hani") == "cmn_Hani"
    # Simplified text has no punctuation left: the same words, hence the same shingles, as spaCy's
    # Norwegian rules.
    text = (
        "Loven gjelder for «alle» kommuner, jf. § 3-2 første ledd; den trer i kraft 1. januar "
        "2026! "
        "Departementet kan gi forskrifter (om gebyr) – også for Svalbard og Jan Mayen."
    )
    spaced, spacy = (
        MinhashDedupSignature("unused", config=MinhashConfig(), language=words).get_shingles(text)
        for words in (SpaceSplitTokenizer(), language_tokenizer)
    )
    assert len(spaced) > 20 and (spaced == spacy).all()


def test_a_raw_folder_carried_with_its_times_to_the_second_is_the_same_input(tmp_path):
    # tar's default format keeps whole seconds: a corpus carried that way must not clean again
    import os

    (tmp_path / "a.jsonl").write_text('{"text": "Hei."}\n')
    os.utime(tmp_path / "a.jsonl", ns=(1_795_727_550_439_911_479, 1_795_727_550_439_911_479))
    before = fingerprint_files(tmp_path, ["a.jsonl"])
    os.utime(tmp_path / "a.jsonl", ns=(1_795_727_550_000_000_000, 1_795_727_550_000_000_000))
    assert fingerprint_files(tmp_path, ["a.jsonl"]) == before
    os.utime(tmp_path / "a.jsonl", ns=(1_795_727_551_000_000_000, 1_795_727_551_000_000_000))
    assert fingerprint_files(tmp_path, ["a.jsonl"]) != before  # a file touched since
