"""Train a tokenizer with the configured backend; both give a `tokenizers.Tokenizer`
(tokenizer.json).
"""

from __future__ import annotations

import io
import logging
import math
import sys
from typing import Iterable, Iterator

import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from pipeline.tokenization.folder import TrainedTokenizer, TrainingError

log = logging.getLogger(__name__)

# Tensor-parallel embedding shards and GPU matmul tiles want the vocabulary in multiples of 128.
VOCAB_MULTIPLE = 128


def padded_vocab_size(requested: int) -> int:
    return math.ceil(requested / VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def train_tokenizer(documents: Iterable[str], options) -> TrainedTokenizer:
    """Train on `documents` (streamed once) with `options`, a TokenizerConfig."""
    vocab_size = padded_vocab_size(options.vocab_size)
    if vocab_size != options.vocab_size:
        log.info(
            "tokenizer: vocab_size %d rounded up to %d, a multiple of %d",
            options.vocab_size,
            vocab_size,
            VOCAB_MULTIPLE,
        )
    if options.backend == "bytelevel_bpe":
        return TrainedTokenizer(train_bytelevel_bpe(documents, options, vocab_size))
    model = train_sentencepiece(documents, options, vocab_size)
    return TrainedTokenizer(tokenizer_from_sentencepiece(model), model)


def bytelevel_pipeline(options) -> Tokenizer:
    """The untrained tokenizer: normaliser, pre-tokenizer and decoder around an empty BPE model.

    Byte-level BPE with Hugging Face `tokenizers`: every byte is a token, so no text is unencodable.

    The text is split into pre-tokens by `tokenizer.pretokenizer_pattern` (a GPT-4-style regex),
    each pre-token's UTF-8 bytes are mapped to printable characters (GPT-2's byte-to-unicode table)
    and BPE merges them. There is no prefix space and, by default, no normalisation, so decoding
    gives back exactly the bytes that were encoded: decode(encode(x)) == x for every string.
    """
    tokenizer = Tokenizer(models.BPE())  # no unk token: the 256 bytes cover everything
    if options.normalization == "nfkc":
        tokenizer.normalizer = normalizers.NFKC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(options.pretokenizer_pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def train_bytelevel_bpe(documents: Iterable[str], options, vocab_size: int) -> Tokenizer:
    tokenizer = bytelevel_pipeline(options)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=options.min_frequency,
        # First in the vocabulary, so at ids 0-3.
        special_tokens=[
            AddedToken(t, special=True, normalized=False)
            for t in options.special_tokens.in_id_order()
        ],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        # The trainer keeps tokens strictly shorter than its max_token_length (the off-by-one of
        # huggingface/tokenizers#1461); the option is the longest token, so it gets one more.
        max_token_length=None if options.max_token_length is None else options.max_token_length + 1,
        show_progress=sys.stderr.isatty(),
    )
    tokenizer.train_from_iterator(documents, trainer)
    return tokenizer


# SentencePiece's EM sums in one part per thread, so its model depends on their number: always its
# own default, whatever `workers`, for the same tokenizer from the same sample.
SENTENCEPIECE_THREADS = 16
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
                yield line[start : start + chars_per_chunk]


def train_sentencepiece(documents: Iterable[str], options, vocab_size: int) -> bytes:
    """SentencePiece (Unigram or BPE) trained for an exact round trip: `tokenizer.model` as bytes.

    Set up so that decode(encode(x)) == x: no normalisation (`identity`; `nfkc` folds compatibility
    characters), whitespace runs kept (`remove_extra_whitespaces=False`), no dummy prefix space
    (which decoding would strip), and byte fallback, so that a character outside the vocabulary (a
    newline, an emoji, a rare letter) becomes its UTF-8 bytes instead of `<unk>`. Digits are single
    tokens (`split_digits`), as in Llama and Gemma. One exception remains: SentencePiece writes
    spaces as U+2581 (`▁`), so a literal U+2581 in the text decodes as a space.
    """
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
            bos_id=0,
            eos_id=1,
            pad_id=2,
            unk_id=3,
            bos_piece=special.bos,
            eos_piece=special.eos,
            pad_piece=special.pad,
            unk_piece=special.unk,
            num_threads=SENTENCEPIECE_THREADS,
            minloglevel=2,
        )
    except RuntimeError as error:
        raise TrainingError(f"SentencePiece failed: {error}") from None
    return model.getvalue()


# sentencepiece_model.proto's ModelProto.SentencePiece.Type and TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL = 1, 2, 3
UNIGRAM = 1
META_SPACE = "▁"
_BYTE_PIECE_TEXT = Regex(r"<(?=0x[0-9A-F]{2}>)")


def _bpe_merges(pieces) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, ranked by the piece they make (id
    order)."""
    ids = {p.piece: i for i, p in enumerate(pieces) if p.type == NORMAL}
    merges = []
    for p in pieces:
        if p.type != NORMAL:
            continue
        splits = [(p.piece[:k], p.piece[k:]) for k in range(1, len(p.piece))]
        merges += sorted(
            ((left, right) for left, right in splits if left in ids and right in ids),
            key=lambda pair: (ids[pair[0]], ids[pair[1]]),
        )
    return merges


def tokenizer_from_sentencepiece(model: bytes) -> Tokenizer:
    """A SentencePiece model as a `tokenizers` pipeline (tokenizer.json) that encodes exactly as
    SentencePiece does.

    SentencePiece finds the best segmentation of the whole text with spaces written as `▁`; the
    conversion does the same: normaliser (the model's precompiled NFKC map, if any, then ` ` ->
    `▁`), no whitespace pre-tokenizer, the same Unigram scores or BPE merges, byte fallback, and a
    decoder that turns `▁` back into spaces and byte pieces back into bytes. Two differences, both
    for literal text that looks like a token:

    - the special tokens (`<s>` ...) written in the text are matched as special tokens, the
      `tokenizers` and `transformers` convention, where SentencePiece spells them out. Decoding
      gives the text back.
    - `tokenizers`' Unigram would match the literal text `<0x41>` as that byte piece (and decode it
      as `A`), which SentencePiece never does; a split right after a `<` that starts such text
      prevents it. Only a piece that itself contains `<0` could span that split: the conversion
      warns if one exists.

    For BPE, the merges are rebuilt from the pieces, ranked by the score of the piece they make, as
    SentencePiece applies them; two merges that make the same piece get adjacent ranks where
    SentencePiece would tie them (and take the leftmost), a difference no test text has shown.
    """
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    pieces, trainer = proto.pieces, proto.trainer_spec
    if trainer.model_type == UNIGRAM:
        tokenizer = Tokenizer(
            models.Unigram(
                [(p.piece, p.score) for p in pieces], unk_id=trainer.unk_id, byte_fallback=True
            )
        )
        tokenizer.pre_tokenizer = pre_tokenizers.Split(
            _BYTE_PIECE_TEXT, behavior="merged_with_previous"
        )
        spanning = [p.piece for p in pieces if p.type == NORMAL and "<0" in p.piece]
        if spanning:
            log.warning(
                "tokenizer: pieces %s contain `<0`; where the text has `<0x..>` after them, "
                "tokenizer.json "
                "may segment differently from tokenizer.model",
                spanning[:5],
            )
    else:
        tokenizer = Tokenizer(
            models.BPE(
                {p.piece: i for i, p in enumerate(pieces)},
                _bpe_merges(pieces),
                unk_token=trainer.unk_piece,
                fuse_unk=True,
                byte_fallback=True,
            )
        )
    steps = [normalizers.Replace(" ", META_SPACE)]
    if proto.normalizer_spec.precompiled_charsmap:
        steps.insert(0, normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace(META_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    # They keep their SentencePiece ids (0-3); as special tokens they are never split and decode can
    # skip them.
    tokenizer.add_special_tokens(
        [
            AddedToken(p.piece, special=True, normalized=False)
            for p in pieces
            if p.type in (CONTROL, UNKNOWN)
        ]
    )
    return tokenizer
