"""The text that `focus` and `align` learn from: the start of the clean stage's training text.

Bounded by `warmup.transfer_bytes`, so that a sweep over many languages spends seconds here, not hours, and
read in file order, so that the same configuration always learns from the same documents.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.corpus.sources import clean_output, read_documents
from pipeline.errors import StageError


def read_transfer_text(clean_dir: Path, lang: str, max_bytes: int, scratch: Path) -> list[str]:
    """Whole documents of the clean stage's training split up to `max_bytes` of UTF-8 (the last one cut)."""
    source = clean_output(lang, clean_dir, split="train")
    texts, size = [], 0
    for document in read_documents(source, scratch):
        if size >= max_bytes:
            break
        data = document.text.encode("utf-8")[:max_bytes - size]
        texts.append(data.decode("utf-8", errors="ignore"))
        size += len(data)
    shutil.rmtree(scratch, ignore_errors=True)
    if not size:
        raise StageError(f"warmup: {clean_dir}/train holds no training text for the embedding transfer to learn from. "
                         f"Run the clean stage again (python -m pipeline stage=clean lang={lang}), or choose "
                         f"warmup.init=mean, which needs no text.")
    return texts


def token_sequences(tokenizer: Tokenizer, texts: list[str]) -> list[np.ndarray]:
    """Each document's token ids (no special tokens), as int64 arrays."""
    return [np.asarray(encoding.ids, dtype=np.int64)
            for encoding in tokenizer.encode_batch(texts, add_special_tokens=False)]
