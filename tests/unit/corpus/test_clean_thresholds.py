"""Norwegian quality thresholds (pipeline/conf/languages.yaml): legal text that FineWeb-2's values
removed is kept, and web junk is still removed (docs/stages/clean.md, 'Thresholds for
Norwegian')."""

from __future__ import annotations

import gzip
import json

import pytest
from datatrove.data import Document
from omegaconf import OmegaConf

from pipeline.config import PipelineConfig
from pipeline.corpus.phases import quality_filters as _filters
from pipeline.corpus.words import resolve_word_tokenizer
from pipeline.languages import LANGUAGES, language_config
from tests.conftest import DATA

# FineWeb-2's nob values that the table replaced (the study's "before")
FINEWEB2_NOB = {
    "top_n_grams": [{"n": n, "max_fraction": f} for n, f in ((2, 0.087), (3, 0.107), (4, 0.131))],
    "dup_n_grams": [
        {"n": n, "max_fraction": f}
        for n, f in ((5, 0.163), (6, 0.153), (7, 0.134), (8, 0.122), (9, 0.115), (10, 0.112))
    ],
    "line_punct_thr": 0.2,
    "max_non_alpha_words_ratio": 0.783,
    "char_duplicates_ratio": 0.01,
}

ARTICLE = [
    "Kommunestyret vedtok i går å bygge en ny skole på Nordsiden, etter flere års diskusjon om "
    "plassering og pris.",
    "Rådmannen mener at byggingen kan starte til høsten dersom anbudene kommer inn som planlagt.",
    "Foreldrene i området har lenge ønsket seg en skole som ligger nærmere boligfeltene.",
    "Opposisjonen stemte imot og viste til at kostnadene har økt med nesten en tredjedel siden "
    "forrige år.",
    "Skolen skal ha plass til rundt fire hundre elever og en egen flerbrukshall for idrettslagene.",
    "Ordføreren sa etter møtet at hun er glad for at saken endelig er avgjort.",
]
MORE = [
    "Fylkesmannen skal nå vurdere om vedtaket er i tråd med den nye arealplanen for området.",
    "En innbygger som deltok på møtet, sa at hun savnet en bedre plan for trafikken langs "
    "skoleveien.",
    "Bussen går i dag bare to ganger i timen, og mange barn må gå langs en smal vei uten fortau.",
    "Kommunen lover at det blir bygget gang- og sykkelvei før skolen åpner om tre år.",
    "Prosjektet skal finansieres med lån, og eiendomsskatten blir ikke endret.",
    "Neste møte i kommunestyret er i slutten av måneden.",
]
BANNER = "Vi bruker informasjonskapsler for å gi deg en bedre opplevelse på nettstedet vårt."
# Web junk of the kinds the filters are for, each with the filter that must remove it.
JUNK = {
    "keyword spam": (
        "gopher_repetition",
        " ".join(["billige flybilletter Oslo Bergen tilbud"] * 30) + " " + ARTICLE[0],
    ),
    "navigation menus": (
        "gopher_repetition",
        "\n".join(["Hjem", "Om oss", "Produkter", "Kontakt oss", "Logg inn"] * 8 + ARTICLE),
    ),
    "price list": (
        "gopher_quality",
        "\n".join(
            f"Art. {1000 + 7 * i} {i % 9 + 1} stk. {49 + i},90 kr - {10 + i} % = {39 + i},92 kr"
            for i in range(40)
        ),
    ),
    "repeated paragraphs": ("gopher_repetition", "\n\n".join([" ".join(ARTICLE)] * 3)),
    "headlines without a sentence": (
        "fineweb_quality",
        "\n".join(" ".join(sentence.split()[:7]).rstrip(",") for sentence in ARTICLE + MORE),
    ),
    "a repeated cookie banner": ("fineweb_quality", "\n".join([*ARTICLE, BANNER, *MORE, BANNER])),
}
# Legal text of the embedded sample that FineWeb-2's values removed, and the filter that did.
LEGAL = {
    # a consolidated law's repeated short lines
    "lovdata_gjeldende_lover_sample/nl-20030606-038": "fineweb_quality",
    # 5- to 10-grams of amendment notes
    "lovdata_gjeldende_lover_sample/nl-19170601-001": "gopher_repetition",
    # a short notice names its subject twice
    "lovdata_lovtidend_2025/sf-20250114-0032": "gopher_repetition",
    # section numbers, dates: words without letters
    "lovdata_lovtidend_2025/nl-20250410-010": "gopher_quality",
    # lines ending without a full stop
    "lovdata_lovtidend_2025/sf-20250131-0110": "fineweb_quality",
}


def _quality_filters(tmp_path, lang: str = "nob", thresholds: dict | None = None):
    """The clean stage's quality filters (language ID aside) for `lang`, with `thresholds` over the
    table's."""
    cfg = OmegaConf.merge(
        OmegaConf.structured(PipelineConfig),
        {"lang": OmegaConf.structured(language_config(lang, LANGUAGES[lang]))},
        {"stage": "clean", "lang": {"filters": thresholds or {}}},
    )
    cfg = OmegaConf.to_object(cfg)
    tokenizer, _ = resolve_word_tokenizer(cfg.lang)
    chosen = _filters(tmp_path, cfg.clean, cfg.lang, tokenizer)
    return [(name, step) for name, step in chosen if name != "language_id"]


def _removed_by(filters, text: str):
    """The first filter that removes the text, or None."""
    for name, step in filters:
        if step.filter(Document(text=text, id="doc")) is not True:
            return name
    return None


@pytest.fixture(scope="module")
def embedded_legal() -> dict[str, str]:
    texts = {}
    for path in sorted((DATA / "nob").glob("lovdata_*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            texts.update((r["id"], r["text"]) for r in map(json.loads, handle) if r["id"] in LEGAL)
    assert set(texts) == set(LEGAL)
    return texts


def test_legal_text_that_fineweb2_values_removed_is_kept(tmp_path, embedded_legal):
    now, before = _quality_filters(tmp_path), _quality_filters(tmp_path, thresholds=FINEWEB2_NOB)
    for doc_id, text in embedded_legal.items():
        assert _removed_by(before, text) == LEGAL[doc_id], doc_id
        assert _removed_by(now, text) is None, doc_id


@pytest.mark.parametrize("lang", ["nob", "nno"])
def test_web_junk_is_still_removed(tmp_path, lang):
    filters = _quality_filters(tmp_path, lang=lang)
    for kind, (expected, text) in JUNK.items():
        assert _removed_by(filters, text) == expected, kind
    assert (
        _removed_by(filters, "\n".join([*ARTICLE, *MORE])) is None
    )  # and the article without the junk is kept
