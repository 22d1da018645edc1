"""Static token vectors learnt on the target text: what `focus` compares new tokens with shared ones by.

fastText skip-gram (Bojanowski et al. 2017) on the text tokenized with the *new* tokenizer, each token a
word: a token's vector comes from its contexts and, through character n-grams, from its spelling, so rare
tokens that look like common ones still land near them. Tokens are written in the byte-level alphabet (no
whitespace, whatever the tokenizer's own spelling), one document per line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.tokenization.surfaces import byte_level_spelling, vocabulary_bytes
from pipeline.warmstart.transfer import special_ids

# FOCUS trains 100-dimensional vectors for 3 epochs with a minimum count of 10 on gigabytes; the few megabytes
# that `warmup.transfer_bytes` allows want a lower minimum count.
DIM = 100
EPOCHS = 3
MIN_COUNT = 5
# Hash buckets of the character n-grams: fastText's default of 2 million costs 800 MB of vectors, far more
# than the n-grams of a vocabulary of 10^4 to 10^5 tokens need.
BUCKETS = 1 << 18


@dataclass
class TokenVectors:
    ids: np.ndarray      # the token ids that have a vector (seen at least MIN_COUNT times)
    vectors: np.ndarray  # (len(ids), dim), unit length


def fasttext_vectors(sequences: list[np.ndarray], tokenizer: Tokenizer, scratch: Path) -> TokenVectors:
    """On one thread with fastText's fixed seed (its Python API takes none for unsupervised training), so the
    same text always gives the same vectors; Hogwild threads would not."""
    import fasttext  # optional: only warmup.init=focus needs it (datatrove's `processing` extra installs it)

    counts = np.bincount(np.concatenate(sequences), minlength=tokenizer.get_vocab_size(with_added_tokens=True)) \
        if sequences else np.zeros(0, dtype=np.int64)
    if not (counts >= MIN_COUNT).any():  # fastText refuses an empty vocabulary
        return TokenVectors(np.zeros(0, dtype=np.int64), np.zeros((0, DIM), dtype=np.float32))
    words = {token_id: byte_level_spelling(surface)
             for token_id, surface in vocabulary_bytes(tokenizer, special_ids(tokenizer)).items()}
    scratch.mkdir(parents=True, exist_ok=True)
    corpus = scratch / "tokens.txt"
    with corpus.open("w", encoding="utf-8") as handle:
        for sequence in sequences:
            handle.write(" ".join(words[token_id] for token_id in sequence.tolist() if token_id in words) + "\n")
    model = fasttext.train_unsupervised(str(corpus), model="skipgram", dim=DIM, epoch=EPOCHS, minCount=MIN_COUNT,
                                        bucket=BUCKETS, thread=1, verbose=0)
    corpus.unlink()
    by_word = {word: token_id for token_id, word in words.items()}
    ids = np.asarray(sorted(by_word[word] for word in model.words if word in by_word), dtype=np.int64)
    vectors = np.stack([model.get_word_vector(words[token_id]) for token_id in ids.tolist()]) if len(ids) else \
        np.zeros((0, DIM), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return TokenVectors(ids, vectors / np.maximum(norms, 1e-12))
