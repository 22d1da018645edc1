"""The language table (`conf/languages.yaml`): 75 HPLT v1.2 languages keyed by ISO 639-3 code.

`lang=` accepts the ISO 639-3 code, the HPLT code, the ISO 639-1 code or any listed alias
(`lang=nb` is `nob`); anything else is an error that lists the closest codes first.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from pipeline.choices import closest_first

TABLE_PATH = Path(__file__).resolve().parent.parent / "conf" / "languages.yaml"


def _load_table(path: Path = TABLE_PATH) -> dict[str, dict]:
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


LANGUAGES: dict[str, dict] = _load_table()


def _alias_index(table: dict[str, dict]) -> dict[str, str]:
    index: dict[str, str] = {}
    for code, entry in table.items():
        names = [code, entry.get("hplt_code"), entry.get("iso639_1"), *entry.get("aliases", [])]
        for name in filter(None, names):
            owner = index.setdefault(str(name).lower(), code)
            if owner != code:
                raise ValueError(f"{TABLE_PATH}: code {name!r} is listed for both {owner!r} and {code!r}")
    return index


_ALIASES = _alias_index(LANGUAGES)


class UnknownLanguageError(ValueError):
    pass


def resolve_language(typed: str) -> str:
    """The table's ISO 639-3 code for `typed`, or an error naming the closest known codes."""
    code = _ALIASES.get(str(typed).strip().lower())
    if code is not None:
        return code
    suggestions = closest_first(typed, LANGUAGES)[:8]
    described = ", ".join(f"{c} ({LANGUAGES[c]['name']})" for c in suggestions)
    raise UnknownLanguageError(
        f"Unknown language `lang={typed}`. Closest known codes: {described}. "
        f"All {len(LANGUAGES)} languages are listed in {TABLE_PATH}; `lang=` takes an ISO 639-3, "
        "ISO 639-1 or HPLT code."
    )


def resolve_languages(typed: str) -> list[str]:
    """`langs=`: `all` (the table's HPLT v1.2 languages), or codes such as `[nob,nn,fao]`, each resolved like
    `lang=`; the table's codes in the table's order, without duplicates."""
    text = str(typed).strip()
    if text == "all":
        return [code for code, entry in LANGUAGES.items() if entry.get("in_hplt_v1_2", True)]
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    codes = {resolve_language(part.strip().strip("'\"")) for part in text.split(",") if part.strip()}
    if not codes:
        raise UnknownLanguageError(f"`langs={typed}` names no language. Give codes such as langs=[nob,nno], or "
                                   "langs=all for the 75 HPLT v1.2 languages.")
    return [code for code in LANGUAGES if code in codes]
