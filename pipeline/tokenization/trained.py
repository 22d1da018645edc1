"""What a tokenizer trainer gives back, and how it fails."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tokenizers import Tokenizer


class TrainingError(RuntimeError):
    """The trainer could not build the vocabulary from this text; the message says why."""


@dataclass(frozen=True)
class TrainedTokenizer:
    tokenizer: Tokenizer
    # The SentencePiece model (`tokenizer.model`) the tokenizer was converted from; None for byte-level BPE.
    sentencepiece_model: Optional[bytes] = None
