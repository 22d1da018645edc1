"""Word tokenizers for languages whose datatrove tokenizer cannot run offline.

datatrove assigns Stanza to a few languages (Maltese, Welsh, Galician ...), and Stanza downloads its
models at run time. spaCy's multilingual rules (`xx`) split every hyphen, which for Maltese turns each
article clitic (`il-`, `tal-`) into a punctuation token and fails Gopher's alphabetic-word ratio;
FineWeb-2's Maltese thresholds and stop words (`il-`, `ta'`) assume Stanza's clitic tokens.
"""

from __future__ import annotations

import regex
from datatrove.utils.word_tokenizers import WhitespaceTokenizer, strip_strings

# A word, with a trailing apostrophe or a hyphen that joins it to the next word kept as part of it
# (`tal-Partit` -> `tal-`, `Partit`; `ta'` stays whole); any other non-space character alone.
_WORD_OR_CLITIC = regex.compile(r"\w+(?:['’]|-(?=\w))?|[^\w\s]")


class CliticWordTokenizer(WhitespaceTokenizer):
    """Regex words that keep clitics (`il-`, `ta'`) as tokens, like Stanza's Maltese tokenizer."""

    def word_tokenize(self, text: str) -> list[str]:
        return strip_strings(_WORD_OR_CLITIC.findall(text))
