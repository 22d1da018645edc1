"""How well a tokenizer fits a language, measured on held-out text.

- fertility: tokens per word (Rust et al. 2021, "How Good is Your Tokenizer?"). Words come from the
  language's word tokenizer (datatrove's, as in the clean stage's filters); punctuation-only words
  (no letter or digit) are left out. A word's tokens are those whose span in the encoding of the
  whole document overlaps the word, so the space that BPE glues to a word does not make an extra
  token, and a token shared by two words counts for both.
- continued words: the share of words split into two or more tokens.
- bytes per token: UTF-8 bytes of the text / tokens; comparable across vocabularies.
- vocabulary used: distinct token ids seen / vocabulary size.
- round trip: the share of documents with decode(encode(x)) == x exactly (special tokens decoded
  too).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Iterable, Optional

import numpy as np
from tokenizers import Encoding, Tokenizer

from pipeline.progress import Progress
from pipeline.tokenization.workers import batches, in_order

# Characters of held-out text per batch: small, so that a few MB of it keep every worker busy.
BATCH_CHARACTERS = 100_000


def word_spans(text: str, words: list[str]) -> np.ndarray:
    """(start, end) character spans of the words with a letter or digit, found in `text` left to
    right.

    A word the word tokenizer rewrote (so that it is not in the text as such) is skipped.
    """
    spans, position = [], 0
    for word in words:
        start = text.find(word, position)
        if start < 0:
            continue
        position = start + len(word)
        if any(ch.isalnum() for ch in word):
            spans.append((start, position))
    return np.array(spans, dtype=np.int64).reshape(-1, 2)


def tokens_per_word(spans: np.ndarray, token_offsets: list[tuple[int, int]]) -> np.ndarray:
    """For each word span, the number of tokens whose (start, end) offsets overlap it."""
    offsets = np.array(token_offsets, dtype=np.int64).reshape(-1, 2)
    starts, ends = np.sort(offsets[:, 0]), np.sort(offsets[:, 1])
    # Overlapping tokens start before the word ends, minus those that end before it starts (which
    # all do).
    return np.searchsorted(starts, spans[:, 1], side="left") - np.searchsorted(
        ends, spans[:, 0], side="right"
    )


def _ratio(numerator: float, denominator: float) -> Optional[float]:
    return numerator / denominator if denominator else None


@dataclass
class Scores:
    vocab_size: int
    documents: int = 0
    exact_roundtrips: int = 0
    bytes: int = 0
    tokens: int = 0
    words: int = 0
    word_tokens: int = 0
    continued_words: int = 0
    ids_seen: set = field(default_factory=set)

    def add(self, text: str, encoding: Encoding, decoded: str, spans: np.ndarray) -> None:
        self.documents += 1
        self.exact_roundtrips += decoded == text
        self.bytes += len(text.encode("utf-8"))
        self.tokens += len(encoding.ids)
        self.ids_seen.update(encoding.ids)
        per_word = tokens_per_word(spans, encoding.offsets)
        self.words += len(per_word)
        self.word_tokens += int(per_word.sum())
        self.continued_words += int((per_word > 1).sum())

    def merge(self, other: "Scores") -> None:
        """Add the scores of other documents."""
        self.documents += other.documents
        self.exact_roundtrips += other.exact_roundtrips
        self.bytes += other.bytes
        self.tokens += other.tokens
        self.words += other.words
        self.word_tokens += other.word_tokens
        self.continued_words += other.continued_words
        self.ids_seen |= other.ids_seen

    def summary(self) -> dict:
        return {
            "fertility": _ratio(self.word_tokens, self.words),
            "bytes_per_token": _ratio(self.bytes, self.tokens),
            "continued_words": _ratio(self.continued_words, self.words),
            "vocab_used": _ratio(len(self.ids_seen), self.vocab_size),
            "roundtrip_rate": _ratio(self.exact_roundtrips, self.documents),
            "documents": self.documents,
            "bytes": self.bytes,
            "words": self.words,
            "tokens": self.tokens,
            "distinct_tokens": len(self.ids_seen),
            "vocab_size": self.vocab_size,
        }


def _empty_scores(tokenizers: dict[str, Tokenizer]) -> dict[str, Scores]:
    return {
        name: Scores(tok.get_vocab_size(with_added_tokens=True)) for name, tok in tokenizers.items()
    }


def _scored(
    tokenizers: dict[str, Tokenizer], word_tokenizer, batch: list[str]
) -> dict[str, Scores]:
    """Each tokenizer's scores on a batch of documents."""
    scores = _empty_scores(tokenizers)
    spans = [word_spans(text, word_tokenizer.word_tokenize(text)) for text in batch]
    for name, tokenizer in tokenizers.items():
        encodings = tokenizer.encode_batch(batch, add_special_tokens=False)
        decoded = tokenizer.decode_batch([e.ids for e in encodings], skip_special_tokens=False)
        for text, encoding, text_back, word_span in zip(batch, encodings, decoded, spans):
            scores[name].add(text, encoding, text_back, word_span)
    return scores


def evaluate(
    tokenizers: dict[str, Tokenizer],
    documents: Iterable[str],
    word_tokenizer,
    workers: int,
    progress: Progress,
) -> dict[str, Scores]:
    """Scores of each tokenizer on the same documents, split into words once by `word_tokenizer`;
    in batches on `workers` processes (the word tokenizers are Python-bound), whose sums do not
    depend on how many."""
    scores = _empty_scores(tokenizers)
    # Builds the word tokenizer's model (spaCy's, say) here, once, rather than in every worker.
    word_tokenizer.word_tokenize("")
    score_batch = partial(_scored, tokenizers, word_tokenizer)
    for scored in in_order(score_batch, batches(documents, BATCH_CHARACTERS), workers, progress):
        for name, part in scored.items():
            scores[name].merge(part)
    return scores
