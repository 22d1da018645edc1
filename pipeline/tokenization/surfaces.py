"""What a token stands for, as bytes: the common ground between two tokenizers of different kinds.

A byte-level BPE vocabulary (GPT-2, BLOOM, Llama 3, this project's default) spells bytes with
printable stand-ins (a space is `Ġ`); a SentencePiece vocabulary (Llama 2, Mistral) writes a space
as `▁` and raw bytes as `<0x41>`. Comparing the bytes lets a byte-level tokenizer find its tokens in
a SentencePiece one and the other way round.
"""

from __future__ import annotations

import json
import re
from typing import Optional

from tokenizers import Tokenizer

METASPACE = "\u2581"
_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


def _byte_level_alphabet() -> dict[str, int]:
    """The printable character byte-level BPE uses for each byte (the GPT-2 mapping)."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[chr(byte)] = byte
        else:
            characters[chr(256 + extra)] = byte
            extra += 1
    return characters


_BYTE_LEVEL = _byte_level_alphabet()


def spelling(tokenizer: Tokenizer) -> str:
    """`byte_level`, `metaspace` or `plain`: how the vocabulary writes its tokens."""
    config = json.loads(tokenizer.to_str())
    decoder = json.dumps(config.get("decoder"))
    if "ByteLevel" in decoder:
        return "byte_level"
    around = json.dumps(
        [config.get("decoder"), config.get("normalizer"), config.get("pre_tokenizer")],
        ensure_ascii=False,
    )
    return "metaspace" if METASPACE in around or "Metaspace" in around else "plain"


def token_bytes(token: str, kind: str) -> Optional[bytes]:
    """The bytes a vocabulary entry stands for; None when it cannot be told (not a spelling of
    bytes)."""
    if kind == "byte_level":
        if not all(character in _BYTE_LEVEL for character in token):
            return None
        return bytes(_BYTE_LEVEL[character] for character in token)
    if kind == "metaspace":
        fallback = _BYTE_FALLBACK.match(token)
        if fallback:
            return bytes([int(fallback.group(1), 16)])
        return token.replace(METASPACE, " ").encode("utf-8")
    return token.encode("utf-8")


def vocabulary_bytes(tokenizer: Tokenizer, special_ids: set[int]) -> dict[int, bytes]:
    """Every ordinary token's bytes, by id (special tokens and unreadable entries left out)."""
    kind = spelling(tokenizer)
    result = {}
    for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items():
        if token_id in special_ids:
            continue
        surface = token_bytes(token, kind)
        if surface:
            result[token_id] = surface
    return result
