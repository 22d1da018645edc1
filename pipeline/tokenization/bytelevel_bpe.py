"""Byte-level BPE with Hugging Face `tokenizers`: every byte is a token, so no text is unencodable.

The text is split into pre-tokens by `tokenizer.pretokenizer_pattern` (a GPT-4-style regex), each
pre-token's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and BPE
merges them. There is no prefix space and, by default, no normalisation, so decoding gives back
exactly the bytes that were encoded: decode(encode(x)) == x for every string.
"""

from __future__ import annotations

import sys
from typing import Iterable

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers


def bytelevel_pipeline(options) -> Tokenizer:
    """The untrained tokenizer: normaliser, pre-tokenizer and decoder around an empty BPE model."""
    tokenizer = Tokenizer(models.BPE())  # no unk token: the 256 bytes cover everything
    if options.normalization == "nfkc":
        tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(options.pretokenizer_pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bytelevel_bpe(documents: Iterable[str], options, vocab_size: int) -> Tokenizer:
    tokenizer = bytelevel_pipeline(options)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=options.min_frequency,
        # First in the vocabulary, so at ids 0-3.
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in options.special_tokens.in_id_order()],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # The trainer keeps tokens strictly shorter than its max_token_length (the off-by-one of
        # huggingface/tokenizers#1461); the option is the longest token, so it gets one more.
        max_token_length=None if options.max_token_length is None else options.max_token_length + 1,
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer
