"""The language table: 75 HPLT languages, their codes, thresholds and word tokenizers."""

from __future__ import annotations

import json

import pytest
from datatrove.utils.word_tokenizers import load_tokenizer_assignments
from omegaconf import OmegaConf

from pipeline.languages import (
    LANGUAGES,
    LanguageConfig,
    UnknownLanguageError,
    language_config,
    resolve_language,
)
from tests.conftest import REPO


def test_the_table_holds_the_75_hplt_languages_with_every_field():
    assert sum(entry.get("in_hplt_v1_2", True) for entry in LANGUAGES.values()) == 75
    assert {"nob", "nno", "eng", "fin", "eus", "mlt", "fao"} <= set(LANGUAGES)
    for code, entry in LANGUAGES.items():
        assert len(code) == 3 and code.islower(), code
        config = language_config(code, entry)  # typed: a wrong field or type fails here
        assert isinstance(config, LanguageConfig)
        assert config.name and config.script and config.hplt_code and config.glotlid, code
        assert config.filters_source, code


@pytest.mark.parametrize(
    "typed, code",
    [
        ("nob", "nob"),
        ("nb", "nob"),
        ("no", "nob"),
        ("NOB", "nob"),
        ("nn", "nno"),
        ("nob_Latn", "nob"),
        ("en", "eng"),
        ("fo", "fao"),
        ("hbs", "hbs"),
        ("sr", "hbs"),
        ("zh", "zho"),
        ("eu", "eus"),
    ],
)
def test_codes_and_aliases_resolve_to_iso_639_3(typed, code):
    assert resolve_language(typed) == code


def test_unknown_code_lists_the_closest_first():
    with pytest.raises(
        UnknownLanguageError, match=r"Closest known codes: nob \(Norwegian Bokmål\)"
    ):
        resolve_language("nbo")


@pytest.mark.parametrize(
    "typed, first",
    [
        ("norwegian", ["nob", "nno"]),
        ("Norwegain", ["nob", "nno"]),
        ("croatian", ["hbs"]),
        ("faroese", ["fao"]),
    ],
)
def test_a_language_name_suggests_the_languages_it_names_first(typed, first):
    with pytest.raises(UnknownLanguageError) as error:
        resolve_language(typed)
    suggested = [
        part.split(" ")[0]
        for part in str(error.value).split("Closest known codes: ")[1].split("), ")
    ]
    assert suggested[: len(first)] == first


def test_the_lid176_column_names_labels_of_the_bundled_model():
    from fasttext.FastText import _FastText

    from pipeline.corpus.filters import bundled_lid176

    known = {
        label.removeprefix("__label__") for label in _FastText(str(bundled_lid176())).get_labels()
    }
    covered = {code: language_config(code, entry).lid176 for code, entry in LANGUAGES.items()}
    assert [code for code, lid in covered.items() if lid is None] == [
        "fao"
    ]  # lid.176 has no Faroese
    for code, lid in covered.items():
        if lid is not None:
            assert lid.labels and set(lid.labels) <= known and 0 < lid.threshold < 1, code
    assert covered["nob"].labels == ["no", "nn"] and covered["nno"].labels == ["nn", "no"]


def test_nob_has_fineweb2_thresholds_but_where_legal_text_needs_others():
    nob = language_config("nob", LANGUAGES["nob"]).filters
    assert (nob.language_score, nob.dup_line_frac, nob.new_line_ratio) == (
        0.813,
        0.312,
        0.219,
    )  # FineWeb-2's
    assert (nob.min_avg_word_length, nob.max_avg_word_length) == (3, 11) and "og" in nob.stopwords
    # legal, parliament and government text needs looser ones (docs/stages/clean.md, 'Thresholds for
    # Norwegian')
    assert (nob.line_punct_thr, nob.char_duplicates_ratio, nob.max_non_alpha_words_ratio) == (
        0.12,
        0.05,
        0.65,
    )
    assert [(g.n, g.max_fraction) for g in nob.top_n_grams] == [(2, 0.2), (3, 0.18), (4, 0.16)]
    assert [(g.n, g.max_fraction) for g in nob.dup_n_grams][::5] == [(5, 0.25), (10, 0.2)]


def test_languages_without_published_values_get_the_defaults():
    eng = OmegaConf.structured(language_config("eng", LANGUAGES["eng"]).filters)
    assert (
        eng.language_score == 0.65 and eng.line_punct_thr == 0.12 and eng.max_avg_word_length == 10
    )
    assert eng.char_duplicates_ratio == 0.01  # FineWeb's
    assert list(eng.stopwords) == ["the", "be", "to", "of", "and", "that", "have", "with"]


def test_every_word_tokenizer_is_known_to_datatrove():
    known = load_tokenizer_assignments()
    assert all(
        e["word_tokenizer"] in known or e["word_tokenizer"] in ("xx", "clitics")
        for e in LANGUAGES.values()
    )


def test_maltese_clitics_stay_words():
    from pipeline.corpus.words import CliticWordTokenizer

    words = CliticWordTokenizer().word_tokenize("Fil-qalba tal-Partit, id-diskors ta' Muscat.")
    assert words == ["Fil-", "qalba", "tal-", "Partit", ",", "id-", "diskors", "ta'", "Muscat", "."]


def test_without_spacy_the_word_tokenizer_falls_back_to_regex_words():
    # The GPU machine's image has no spaCy: Norwegian's tokenizer (spaCy's nb) cannot load, and
    # datatrove's own fallback splits words with spaCy too; ours must still count words. In a
    # process of its own: datatrove remembers which packages it found missing, and the tests after
    # this one need spaCy.
    import subprocess
    import sys

    code = (
        "import sys, json; sys.modules['spacy'] = None\n"
        "from pipeline.languages import LANGUAGES, language_config\n"
        "from pipeline.corpus.words import resolve_word_tokenizer\n"
        "tokenizer, name = resolve_word_tokenizer(language_config('nob', LANGUAGES['nob']))\n"
        "print(json.dumps([name, tokenizer.word_tokenize('Stortinget vedtok, 12. mars, lov nr. "
        "5.')]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    name, words = json.loads(result.stdout.strip().splitlines()[-1])
    assert name == "regex words (fallback)"
    assert words == [
        "Stortinget",
        "vedtok",
        ",",
        "12",
        ".",
        "mars",
        ",",
        "lov",
        "nr",
        ".",
        "5",
        ".",
    ]
