"""Train a tokenizer with the configured backend; both give a `tokenizers.Tokenizer` (tokenizer.json)."""

from __future__ import annotations

import logging
import math
from typing import Iterable

from pipeline.tokenization.bytelevel_bpe import train_bytelevel_bpe
from pipeline.tokenization.sentencepiece_conversion import tokenizer_from_sentencepiece
from pipeline.tokenization.sentencepiece_training import train_sentencepiece
from pipeline.tokenization.trained import TrainedTokenizer

log = logging.getLogger(__name__)

# Tensor-parallel embedding shards and GPU matmul tiles want the vocabulary in multiples of 128.
VOCAB_MULTIPLE = 128


def padded_vocab_size(requested: int) -> int:
    return math.ceil(requested / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def train_tokenizer(documents: Iterable[str], options, threads: int = 1) -> TrainedTokenizer:
    """Train on `documents` (streamed once) with `options`, a TokenizerConfig."""
    vocab_size = padded_vocab_size(options.vocab_size)
    if vocab_size != options.vocab_size:
        log.info("tokenizer: vocab_size %d rounded up to %d, a multiple of %d", options.vocab_size, vocab_size,
                 VOCAB_MULTIPLE)
    if options.backend == "bytelevel_bpe":
        return TrainedTokenizer(train_bytelevel_bpe(documents, options, vocab_size))
    model = train_sentencepiece(documents, options, vocab_size, threads)
    return TrainedTokenizer(tokenizer_from_sentencepiece(model), model)
