"""The shard format on disk, and the checks that refuse a broken shard instead of reading garbage.

A shard is what datatrove's `DocumentTokenizer` writes (the `.ds` format that nanotron reads), one
per input file:

- `<name>.ds`: the token ids of the documents, back to back, little-endian uint16 (vocabularies of
  up to 65,536 ids) or uint32, each document ending with EOS;
- `<name>.ds.index`: the end of every document, in tokens, as little-endian uint64;
- `<name>.ds.metadata`: three lines, `<tokenizer>|<bytes per token>`, the token count, the same in
  words.

`open_shard` checks a shard against itself and against what `packed.json` recorded when it was
written: the token file holds a whole number of tokens of the recorded width, the index is strictly
increasing (every document has at least its EOS) and ends at the file's last token, and the metadata
and `packed.json` agree on the counts. Reading a document checks that it ends with EOS and that its
ids are inside the vocabulary (pipeline/packing/sampler.py). Each failure raises `PackedDataError`,
naming the file, what is wrong and how to pack the data again. There is no checksum of the content:
that would mean reading every shard whole whenever training starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

INDEX_SUFFIX = ".index"
METADATA_SUFFIX = ".metadata"
INDEX_DTYPE = np.dtype("<u8")


class PackedDataError(ValueError):
    """Packed data that is missing, truncated or inconsistent; the message says which file and what
    to do."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 while every id fits (datatrove's rule), else uint32; little-endian as datatrove writes
    them."""
    return np.dtype("<u2") if vocab_size <= 2**16 else np.dtype("<u4")


def repack_hint(pack_dir: Path) -> str:
    # The contract skips a stage whose marker matches, whatever its files look like: the marker must
    # go.
    return (
        f"The packed data in {pack_dir} is broken: pack it again with `python -m pipeline "
        "stage=pack "
        f"lang=<lang>` after deleting {pack_dir / '_SUCCESS.json'} (otherwise the stage is skipped "
        "as up to date)."
    )


@dataclass(frozen=True)
class Shard:
    path: Path
    tokens: np.memmap
    # Document ends in tokens (document i is tokens[ends[i-1]:ends[i]]).
    ends: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.ends)


def open_shard(path: Path, dtype: np.dtype, documents: int, tokens: int, pack_dir: Path) -> Shard:
    """Memory-map a shard after checking its files against each other and the recorded counts."""

    def broken(what: str) -> PackedDataError:
        return PackedDataError(f"{what}. {repack_hint(pack_dir)}")

    index_path, metadata_path = Path(f"{path}{INDEX_SUFFIX}"), Path(f"{path}{METADATA_SUFFIX}")
    for required in (path, index_path, metadata_path):
        if not required.is_file():
            raise broken(f"{required} is missing")
    size = path.stat().st_size
    if size % dtype.itemsize:
        raise broken(
            f"{path} is {size:,} bytes, not a whole number of {dtype.itemsize}-byte tokens "
            "(truncated?)"
        )
    if size // dtype.itemsize != tokens:
        raise broken(
            f"{path} holds {size // dtype.itemsize:,} tokens, but packed.json recorded {tokens:,} "
            "(truncated or overwritten)"
        )
    index_size = index_path.stat().st_size
    if index_size != documents * INDEX_DTYPE.itemsize:
        raise broken(
            f"{index_path} is {index_size:,} bytes, but {documents:,} documents need "
            f"{documents * INDEX_DTYPE.itemsize:,} (8 bytes each)"
        )
    ends = np.fromfile(index_path, dtype=INDEX_DTYPE).astype(np.int64)
    if documents and (ends[0] < 1 or np.any(np.diff(ends) < 1)):
        raise broken(
            f"{index_path} is not strictly increasing: a document without even its EOS token, "
            "or a corrupt index"
        )
    if documents and ends[-1] != tokens:
        raise broken(
            f"{index_path} ends at token {int(ends[-1]):,}, but {path} holds {tokens:,} tokens"
        )
    lines = metadata_path.read_text(encoding="utf-8", errors="replace").splitlines()
    if (
        len(lines) < 2
        or not lines[0].endswith(f"|{dtype.itemsize}")
        or lines[1].strip() != str(tokens)
    ):
        raise broken(
            f"{metadata_path} does not say {tokens:,} tokens of {dtype.itemsize} bytes "
            f"(it says {lines[:2]})"
        )
    return Shard(path, np.memmap(path, dtype=dtype, mode="r"), ends)
