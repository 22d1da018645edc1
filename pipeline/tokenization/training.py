"""Train a tokenizer with the configured backend; both give a `tokenizers.Tokenizer` (tokenizer.json)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Iterable, Optional

from tokenizers import Tokenizer

log = logging.getLogger(__name__)

# Tensor-parallel embedding shards and GPU matmul tiles want the vocabulary in multiples of 128.
VOCAB_MULTIPLE = 128


class TrainingError(RuntimeError):
    """The trainer could not build the vocabulary from this text; the message says why."""


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    # The SentencePiece model (`tokenizer.model`) the tokenizer was converted from; None for byte-level BPE.
    sentencepiece_model: Optional[bytes] = None


def padded_vocab_size(requested: int) -> int:
    return math.ceil(requested / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def train_tokenizer(documents: Iterable[str], options, threads: int = 1) -> TrainedTokenizer:
    """Train on `documents` (streamed once) with `options`, a TokenizerConfig."""
    vocab_size = padded_vocab_size(options.vocab_size)
    if vocab_size != options.vocab_size:
        log.info("tokenizer: vocab_size %d rounded up to %d, a multiple of %d", options.vocab_size, vocab_size,
                 VOCAB_MULTIPLE)
    if options.backend == "bytelevel_bpe":
        from pipeline.tokenization.bytelevel_bpe import train_bytelevel_bpe

        return TrainedTokenizer(train_bytelevel_bpe(documents, options, vocab_size))
    from pipeline.tokenization.sentencepiece_conversion import tokenizer_from_sentencepiece
    from pipeline.tokenization.sentencepiece_training import train_sentencepiece

    model = train_sentencepiece(documents, options, vocab_size, threads)
    return TrainedTokenizer(tokenizer_from_sentencepiece(model), model)
