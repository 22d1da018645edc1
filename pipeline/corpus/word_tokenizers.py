"""Word tokenizers for languages whose datatrove tokenizer cannot run offline.

datatrove assigns Stanza to a few languages (Maltese, Welsh, Galician ...), and Stanza downloads its
models at run time. spaCy's multilingual rules (`xx`) split every hyphen, which for Maltese turns each
article clitic (`il-`, `tal-`) into a punctuation token and fails Gopher's alphabetic-word ratio;
FineWeb-2's Maltese thresholds and stop words (`il-`, `ta'`) assume Stanza's clitic tokens.
"""

from __future__ import annotations

import logging

import regex
from datatrove.utils.word_tokenizers import SpaCyTokenizer, WhitespaceTokenizer, load_word_tokenizer, strip_strings

log = logging.getLogger(__name__)

# A word, with a trailing apostrophe or a hyphen that joins it to the next word kept as part of it
# (`tal-Partit` -> `tal-`, `Partit`; `ta'` stays whole); any other non-space character alone.
_WORD_OR_CLITIC = regex.compile(r"\w+(?:['’]|-(?=\w))?|[^\w\s]")
# A run of word characters, or any other non-space character alone.
_WORD = regex.compile(r"\w+|[^\w\s]")


class RegexWordTokenizer(WhitespaceTokenizer):
    """Words and punctuation by a regex: the fallback when a language's tokenizer cannot load. (datatrove's own
    WhitespaceTokenizer splits words with spaCy's `xx` rules, so it fails where spaCy is missing.)"""

    pattern = _WORD

    def word_tokenize(self, text: str) -> list[str]:
        return strip_strings(self.pattern.findall(text))


class CliticWordTokenizer(RegexWordTokenizer):
    """Regex words that keep clitics (`il-`, `ta'`) as tokens, like Stanza's Maltese tokenizer."""

    pattern = _WORD_OR_CLITIC


def resolve_word_tokenizer(lang):
    """The language's datatrove word tokenizer, or a regex fallback when it cannot load offline (its package, spaCy
    included, missing).

    Returns (what the datatrove blocks take as `language`, its name for the metrics).
    """
    try:
        if lang.word_tokenizer == "xx":  # spaCy's multilingual rules: whitespace and punctuation
            return SpaCyTokenizer("xx"), "xx"
        if lang.word_tokenizer == "clitics":
            return CliticWordTokenizer(), "clitics"
        load_word_tokenizer(lang.word_tokenizer).word_tokenize("a b")
        return lang.word_tokenizer, lang.word_tokenizer
    except Exception as error:  # missing optional package, or a model that would need a download
        log.warning(
            "The word tokenizer for %s (%s) is not usable here (%s: %s); the filters and MinHash fall back to "
            "regex word/punctuation tokenization. Install its package (see README, 'Languages') for exact "
            "word counts.", lang.code, lang.word_tokenizer, type(error).__name__, error,
        )
        return RegexWordTokenizer(), "regex words (fallback)"
