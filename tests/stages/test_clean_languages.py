"""The clean stage on several languages and scripts, with a local language-ID model, and in
parallel."""

from __future__ import annotations

import unicodedata

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


def test_parallel_workers_give_the_same_output(tmp_path, embedded_records):
    runs = {}
    for workers in (1, 2):
        work = tmp_path / f"w{workers}"
        run_cli("stage=clean", "lang=nno", f"workers={workers}", f"work_dir={work}", cwd=tmp_path)
        out = work / "nno" / "clean"
        runs[workers] = {
            part: sorted(r["id"] for r in read_jsonl_gz(out / part))
            for part in ("train", "heldout", "rejected")
        }
        assert marker(work, "nno", "clean")["metrics"]["docs_in"] == len(embedded_records["nno"])
    assert (
        len(
            list((tmp_path / "w2" / "nno" / "clean" / "logs" / "1_filter" / "stats").glob("*.json"))
        )
        == 2
    )
    assert runs[1] == runs[2]


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
