"""Writing a pack folder: each tokenized source's repeats index, and `packed.json` (layout:
packed.py).

The stage adds the exact plan's numbers to each source's entry; these are the facts the sampler
needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np

from pipeline.json_files import write_json_atomic
from pipeline.packing.packed import PACKED_FILE, REPEATS_FILE, repetitions
from pipeline.packing.shards import token_dtype
from pipeline.packing.tokenize import TokenizedSource
from pipeline.tokenization.folder import tokenizer_digest

# Where a source's shards and repeats.npy go, relative to the pack folder.
SHARDS = "shards"


def source_folder(pack_dir: Path, name: str) -> Path:
    return pack_dir / SHARDS / name


def tokenizer_entry(path: Path, vocab_size: int, eos: str, eos_id: int) -> dict:
    """The tokenizer the data was packed with; the training stages check that theirs has the same
    size and hash."""
    return {
        "path": str(path),
        "vocab_size": vocab_size,
        "eos": eos,
        "eos_id": eos_id,
        "dtype": token_dtype(vocab_size).name,
        "sha256": tokenizer_digest(path),
    }


def write_source(
    pack_dir: Path, source: TokenizedSource, document_epochs: np.ndarray, seed: int
) -> dict:
    """Write the source's repeats.npy (its shards are already in place); its packed.json entry."""
    repeats = repetitions(source.document_tokens, document_epochs, seed, source.name)
    np.save(source_folder(pack_dir, source.name) / REPEATS_FILE, repeats, allow_pickle=False)
    return {
        "name": source.name,
        "folder": f"{SHARDS}/{source.name}",
        "documents": source.documents,
        "unique_tokens": source.tokens,
        "pass_tokens": int(np.dot(source.document_tokens, repeats.astype(np.int64))),
        "repeats": {
            "min": int(repeats.min()) if len(repeats) else 0,
            "max": int(repeats.max(initial=0)),
        },
        "bad_records": source.bad_records,
        "shards": [
            {"file": s.file, "documents": s.documents, "tokens": s.tokens} for s in source.shards
        ],
    }


def packed_bytes(pack_dir: Path, names: list[str]) -> int:
    """Bytes of the sources' shards, indexes, metadata and repeats: what the packed data costs on
    disk."""
    return sum(
        path.stat().st_size for name in names for path in source_folder(pack_dir, name).iterdir()
    )


def write_packed(
    pack_dir: Path, tokenizer: dict, sources: list[dict], about: Optional[dict] = None
) -> dict:
    """packed.json: `about` (the plan's totals), the tokenizer, then the sources (entries of
    `write_source`, or `{"name", "pass_tokens": 0, ...}` for a source the plan does not read)."""
    document = {
        **(about or {}),
        "tokenizer": tokenizer,
        "pass_tokens": sum(s["pass_tokens"] for s in sources),
        "sources": sources,
    }
    write_json_atomic(pack_dir / PACKED_FILE, document)
    return document
