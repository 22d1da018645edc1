"""The word tokenizer of each language, for the quality filters' word counts, MinHash's shingles and
the tokenizer report's fertility: datatrove's, or one of ours where datatrove's cannot run offline.

datatrove assigns Stanza to a few languages (Maltese, Welsh, Galician ...), and Stanza downloads its
models at run time. spaCy's multilingual rules (`xx`) split every hyphen, which for Maltese turns
each article clitic (`il-`, `tal-`) into a punctuation token and fails Gopher's alphabetic-word
ratio; FineWeb-2's Maltese thresholds and stop words (`il-`, `ta'`) assume Stanza's clitic tokens.
"""

from __future__ import annotations

import logging

import regex
from datatrove.utils.word_tokenizers import (
    SpaCyTokenizer,
    WhitespaceTokenizer,
    load_word_tokenizer,
    strip_strings,
)

log = logging.getLogger(__name__)

# A word, with a trailing apostrophe or a hyphen that joins it to the next word kept as part of it
# (`tal-Partit` -> `tal-`, `Partit`; `ta'` stays whole); any other non-space character alone.
_WORD_OR_CLITIC = regex.compile(r"\w+(?:['’]|-(?=\w))?|[^\w\s]")
# A run of word characters, or any other non-space character alone.
_WORD = regex.compile(r"\w+|[^\w\s]")


class RegexWordTokenizer(WhitespaceTokenizer):
    """Words and punctuation by a regex: the fallback when a language's tokenizer cannot load.
    (datatrove's own WhitespaceTokenizer splits words with spaCy's `xx` rules, so it fails where
    spaCy is missing.)"""

    pattern = _WORD

    def word_tokenize(self, text: str) -> list[str]:
        return strip_strings(self.pattern.findall(text))


class CliticWordTokenizer(RegexWordTokenizer):
    """Regex words that keep clitics (`il-`, `ta'`) as tokens, like Stanza's Maltese tokenizer."""

    pattern = _WORD_OR_CLITIC


# Scripts written without spaces between words: MinHash needs the language's word tokenizer there.
SCRIPTS_WITHOUT_SPACES = frozenset({"Hans", "Hant", "Jpan", "Thai", "Mymr", "Khmr", "Laoo", "Tibt"})


class SpaceSplitTokenizer(WhitespaceTokenizer):
    """Words between whitespace: MinHash's words where the script has spaces. Its shingles are of
    simplified text (lower case, no punctuation, numbers normalised), in which the language's
    tokenizer finds the same words (99% of the Norwegian sample's documents identical, the rest
    differing in a digit and its unit) in 100x the time: 24.5 s for that sample with spaCy, as long
    as the filters' tokenization of the raw text, 0.2 s at whitespace."""

    def word_tokenize(self, text: str) -> list[str]:
        return text.split()


def minhash_word_tokenizer(lang, tokenizer):
    """What MinHash splits simplified text with: whitespace, or `tokenizer` for a script without
    spaces."""
    return tokenizer if lang.script in SCRIPTS_WITHOUT_SPACES else SpaceSplitTokenizer()


def resolve_word_tokenizer(lang):
    """The language's datatrove word tokenizer, or a regex fallback when it cannot load offline (its
    package, spaCy included, missing).

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
            "The word tokenizer for %s (%s) is not usable here (%s: %s); the filters and MinHash "
            "fall back to "
            "regex word/punctuation tokenization. Install its package (see README, 'Languages') "
            "for exact "
            "word counts.",
            lang.code,
            lang.word_tokenizer,
            type(error).__name__,
            error,
        )
        return RegexWordTokenizer(), "regex words (fallback)"
