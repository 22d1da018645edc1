"""SentencePiece (Unigram or BPE) trained for an exact round trip: `tokenizer.model` as bytes.

Set up so that decode(encode(x)) == x: no normalisation (`identity`; `nfkc` folds compatibility
characters), whitespace runs kept (`remove_extra_whitespaces=False`), no dummy prefix space (which
decoding would strip), and byte fallback, so that a character outside the vocabulary (a newline, an
emoji, a rare letter) becomes its UTF-8 bytes instead of `<unk>`. Digits are single tokens
(`split_digits`), as in Llama and Gemma. One exception remains: SentencePiece writes spaces as U+2581
(`▁`), so a literal U+2581 in the text decodes as a space.
"""

from __future__ import annotations

import io
import logging
from typing import Iterable, Iterator

import sentencepiece as spm

from pipeline.tokenization.trained import TrainingError

log = logging.getLogger(__name__)

# SentencePiece trains on "sentences" and silently drops those longer than `max_sentence_length`
# bytes; documents are fed line by line and longer lines in chunks of at most this many bytes.
MAX_SENTENCE_BYTES = 16384
# SentencePiece's own default for max_sentencepiece_length.
DEFAULT_MAX_PIECE_LENGTH = 16


def sentences(documents: Iterable[str]) -> Iterator[str]:
    """The lines of the documents, long ones cut into chunks SentencePiece keeps."""
    chars_per_chunk = MAX_SENTENCE_BYTES // 4  # a character is at most 4 UTF-8 bytes
    for document in documents:
        for line in document.split("\n"):
            if not line.strip():
                continue
            for start in range(0, len(line), chars_per_chunk):
                yield line[start:start + chars_per_chunk]


def train_sentencepiece(documents: Iterable[str], options, vocab_size: int, threads: int) -> bytes:
    special = options.special_tokens
    model = io.BytesIO()
    spm.set_random_generator_seed(options.seed)
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=sentences(documents),
            model_writer=model,
            model_type=options.sentencepiece_model_type,
            vocab_size=vocab_size,
            byte_fallback=True,
            normalization_rule_name="nfkc" if options.normalization == "nfkc" else "identity",
            remove_extra_whitespaces=False,
            add_dummy_prefix=False,
            allow_whitespace_only_pieces=True,  # runs of spaces (indentation) may become one token
            split_digits=True,
            max_sentencepiece_length=options.max_token_length or DEFAULT_MAX_PIECE_LENGTH,
            max_sentence_length=MAX_SENTENCE_BYTES,
            input_sentence_size=0,  # the sample is already bounded: use all of it
            bos_id=0, eos_id=1, pad_id=2, unk_id=3,
            bos_piece=special.bos, eos_piece=special.eos, pad_piece=special.pad, unk_piece=special.unk,
            num_threads=threads,
            minloglevel=2,
        )
    except RuntimeError as error:
        raise TrainingError(f"SentencePiece failed: {error}") from None
    return model.getvalue()
