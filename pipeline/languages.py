"""The language table (`pipeline/conf/languages.yaml`): 75 HPLT v1.2 languages by ISO 639-3 code.

`lang=` accepts the ISO 639-3 code, the HPLT code, the ISO 639-1 code or any listed alias
(`lang=nb` is `nob`); anything else is an error that lists the closest codes first.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

import yaml
from omegaconf import MISSING, OmegaConf

from pipeline.errors import closest_first

TABLE_PATH = Path(__file__).resolve().parent / "conf" / "languages.yaml"


def _load_table(path: Path = TABLE_PATH) -> dict[str, dict]:
    # libyaml's loader reads the table in a tenth of the pure-Python one's second: every command
    # line pays it.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    with open(path, encoding="utf-8") as f:
        return yaml.load(f, Loader=loader)


LANGUAGES: dict[str, dict] = _load_table()


def _alias_index(table: dict[str, dict]) -> dict[str, str]:
    index: dict[str, str] = {}
    for code, entry in table.items():
        names = [code, entry.get("hplt_code"), entry.get("iso639_1"), *entry.get("aliases", [])]
        for name in filter(None, names):
            owner = index.setdefault(str(name).lower(), code)
            if owner != code:
                raise ValueError(
                    f"{TABLE_PATH}: code {name!r} is listed for both {owner!r} and {code!r}"
                )
    return index


_ALIASES = _alias_index(LANGUAGES)


class UnknownLanguageError(ValueError):
    pass


def _named(typed: str) -> list[str]:
    """The codes of the languages whose name contains `typed` or a word spelled like it: `norwegian`
    is both nob (Norwegian Bokmål) and nno (Norwegian Nynorsk), `croatian` is hbs."""
    typed = typed.strip().lower()
    if len(typed) < 3:
        return []
    found = []
    for code, entry in LANGUAGES.items():
        name = str(entry["name"]).lower()
        if typed in name or difflib.get_close_matches(
            typed, re.findall(r"\w+", name), n=1, cutoff=0.8
        ):
            found.append(code)
    return found


def resolve_language(typed: str) -> str:
    """The table's ISO 639-3 code for `typed`, or an error naming the closest known codes, languages
    whose name it spells first."""
    code = _ALIASES.get(str(typed).strip().lower())
    if code is not None:
        return code
    suggestions = list(dict.fromkeys([*_named(str(typed)), *closest_first(typed, LANGUAGES)]))[:8]
    described = ", ".join(f"{c} ({LANGUAGES[c]['name']})" for c in suggestions)
    raise UnknownLanguageError(
        f"Unknown language `lang={typed}`. Closest known codes: {described}. "
        f"All {len(LANGUAGES)} languages are listed in {TABLE_PATH}; `lang=` takes an ISO 639-3, "
        "ISO 639-1 or HPLT code."
    )


def resolve_languages(typed: str) -> list[str]:
    """`langs=`: `all` (the table's HPLT v1.2 languages), or codes such as `[nob,nn,fao]`, each
    resolved like `lang=`; the table's codes in the table's order, without duplicates."""
    text = str(typed).strip()
    if text == "all":
        return [code for code, entry in LANGUAGES.items() if entry.get("in_hplt_v1_2", True)]
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    codes = {
        resolve_language(part.strip().strip("'\"")) for part in text.split(",") if part.strip()
    }
    if not codes:
        raise UnknownLanguageError(
            f"`langs={typed}` names no language. Give codes such as langs=[nob,nno], or "
            "langs=all for the 75 HPLT v1.2 languages."
        )
    return [code for code in LANGUAGES if code in codes]


# -- a table entry as a typed config (the `lang` section) ------------------------------------------


@dataclass
class NGramLimit:
    """Gopher repetition limit: at most `max_fraction` of the characters in repeated `n`-grams."""

    n: int = MISSING
    max_fraction: float = MISSING


def _ngram_limits(*pairs: tuple[int, float]) -> list[NGramLimit]:
    return [NGramLimit(n, fraction) for n, fraction in pairs]


@dataclass
class FilterThresholds:
    """Per-language quality-filter thresholds; defaults are FineWeb's language-independent ones."""

    language_score: float = 0.65
    dup_line_frac: float = 0.3
    top_n_grams: List[NGramLimit] = field(
        default_factory=lambda: _ngram_limits((2, 0.2), (3, 0.18), (4, 0.16))
    )
    dup_n_grams: List[NGramLimit] = field(
        default_factory=lambda: _ngram_limits(
            (5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)
        )
    )
    line_punct_thr: float = 0.12
    new_line_ratio: float = 0.3
    # FineWeb quality: at most this share of the characters in lines that repeat an earlier line
    # (FineWeb's value; FineWeb-2's configs do not set it).
    char_duplicates_ratio: float = 0.01
    min_avg_word_length: int = 3
    max_avg_word_length: int = 10
    max_non_alpha_words_ratio: float = 0.8
    # None disables Gopher's stop-word check: English stop words would reject every other language.
    stopwords: Optional[List[str]] = None


@dataclass
class Lid176Labels:
    """How fastText's lid.176 model (the clean stage's default language ID) names the language: its
    labels, whose scores a document's score sums (Bokmål is `no` or `nn`), and the score a document
    needs."""

    labels: List[str] = MISSING
    threshold: float = MISSING


@dataclass
class LanguageConfig:
    code: str = MISSING
    name: str = MISSING
    script: str = MISSING
    hplt_code: str = MISSING
    iso639_1: Optional[str] = None
    aliases: List[str] = field(default_factory=list)
    glotlid: List[str] = field(default_factory=list)
    # None: lid.176 lacks the language (Faroese).
    lid176: Optional[Lid176Labels] = None
    flores: Optional[str] = None
    word_tokenizer: str = MISSING
    # False for the few entries beyond the 75 HPLT v1.2 languages (e.g. Faroese).
    in_hplt_v1_2: bool = True
    filters_source: str = "defaults"
    filters: FilterThresholds = field(default_factory=FilterThresholds)
    # The default of `clean.heldout_sources`: raw files of another kind than most of the language's
    # text, held out whole to score the model on text it never trained on.
    heldout_sources: List[str] = field(default_factory=list)


def language_config(code: str, entry: dict) -> LanguageConfig:
    """The table's entry as a typed config; its `[n, fraction]` pairs become NGramLimits."""
    table_filters = dict(entry.get("filters") or {})
    for key in ("top_n_grams", "dup_n_grams"):
        if key in table_filters:
            table_filters[key] = [{"n": n, "max_fraction": f} for n, f in table_filters[key]]
    filters = OmegaConf.merge(OmegaConf.structured(FilterThresholds), table_filters)
    fields = {k: v for k, v in entry.items() if k not in ("filters", "lid176")}
    lid176 = Lid176Labels(**entry["lid176"]) if entry.get("lid176") else None
    return LanguageConfig(code=code, filters=OmegaConf.to_object(filters), lid176=lid176, **fields)
