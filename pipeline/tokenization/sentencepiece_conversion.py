"""A SentencePiece model as a `tokenizers` pipeline (tokenizer.json) that encodes exactly as SentencePiece does.

SentencePiece finds the best segmentation of the whole text with spaces written as `▁`; the
conversion does the same: normaliser (the model's precompiled NFKC map, if any, then ` ` -> `▁`), no
whitespace pre-tokenizer, the same Unigram scores or BPE merges, byte fallback, and a decoder that
turns `▁` back into spaces and byte pieces back into bytes. Two differences, both for literal text
that looks like a token:

- the special tokens (`<s>` ...) written in the text are matched as special tokens, the `tokenizers`
  and `transformers` convention, where SentencePiece spells them out. Decoding gives the text back.
- `tokenizers`' Unigram would match the literal text `<0x41>` as that byte piece (and decode it as
  `A`), which SentencePiece never does; a split right after a `<` that starts such text prevents it.
  Only a piece that itself contains `<0` could span that split: the conversion warns if one exists.

For BPE, the merges are rebuilt from the pieces, ranked by the score of the piece they make, as
SentencePiece applies them; two merges that make the same piece get adjacent ranks where
SentencePiece would tie them (and take the leftmost), a difference no test text has shown.
"""

from __future__ import annotations

import logging

from sentencepiece import sentencepiece_model_pb2
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

log = logging.getLogger(__name__)

# sentencepiece_model.proto's ModelProto.SentencePiece.Type and TrainerSpec.ModelType
NORMAL, UNKNOWN, CONTROL = 1, 2, 3
UNIGRAM = 1
META_SPACE = "▁"
_BYTE_PIECE_TEXT = Regex(r"<(?=0x[0-9A-F]{2}>)")


def _bpe_merges(pieces) -> list[tuple[str, str]]:
    """Every split of a normal piece into two normal pieces, ranked by the piece they make (id order)."""
    ids = {p.piece: i for i, p in enumerate(pieces) if p.type == NORMAL}
    merges = []
    for p in pieces:
        if p.type != NORMAL:
            continue
        splits = [(p.piece[:k], p.piece[k:]) for k in range(1, len(p.piece))]
        merges += sorted(((left, right) for left, right in splits if left in ids and right in ids),
                         key=lambda pair: (ids[pair[0]], ids[pair[1]]))
    return merges


def tokenizer_from_sentencepiece(model: bytes) -> Tokenizer:
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    pieces, trainer = proto.pieces, proto.trainer_spec
    if trainer.model_type == UNIGRAM:
        tokenizer = Tokenizer(models.Unigram([(p.piece, p.score) for p in pieces], unk_id=trainer.unk_id,
                                             byte_fallback=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Split(_BYTE_PIECE_TEXT, behavior="merged_with_previous")
        spanning = [p.piece for p in pieces if p.type == NORMAL and "<0" in p.piece]
        if spanning:
            log.warning("tokenizer: pieces %s contain `<0`; where the text has `<0x..>` after them, tokenizer.json "
                        "may segment differently from tokenizer.model", spanning[:5])
    else:
        tokenizer = Tokenizer(models.BPE({p.piece: i for i, p in enumerate(pieces)}, _bpe_merges(pieces),
                                         unk_token=trainer.unk_piece, fuse_unk=True, byte_fallback=True))
    steps = [normalizers.Replace(" ", META_SPACE)]
    if proto.normalizer_spec.precompiled_charsmap:
        steps.insert(0, normalizers.Precompiled(proto.normalizer_spec.precompiled_charsmap))
    tokenizer.normalizer = normalizers.Sequence(steps)
    tokenizer.decoder = decoders.Sequence([decoders.Replace(META_SPACE, " "), decoders.ByteFallback(), decoders.Fuse()])
    # They keep their SentencePiece ids (0-3); as special tokens they are never split and decode can skip them.
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=False)
                                  for p in pieces if p.type in (CONTROL, UNKNOWN)])
    return tokenizer
