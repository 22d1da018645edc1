"""Tokenizing one source of the mix plan into shards, with datatrove's `DocumentTokenizer`.

Each input file of the source becomes one shard (pipeline/packing/shards.py), tokenized in its own
process (`workers`) by datatrove's `DocumentTokenizer`: it loads the local `tokenizer.json`, appends
EOS to every document through the tokenizer's post-processor, picks uint16 or uint32 from the
vocabulary size and writes the `.ds` token file, its `.index` of document ends and its `.metadata`.
Documents keep the order of the input (`shuffle_documents=False`): the sampler shuffles, and the
document order must match the duplicate-cluster sizes read here for rehydration.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Iterator

import numpy as np

from pipeline.corpus.sources import FileTask, SourceInput, over_files, source_reader
from pipeline.packing.shards import INDEX_DTYPE, INDEX_SUFFIX, METADATA_SUFFIX

# datatrove's name for rank `i`'s file when documents are not shuffled.
SHARD_NAME = "{index:05d}_unshuffled.ds"


@dataclass(frozen=True)
class TokenizedShard:
    file: str
    documents: int
    tokens: int


@dataclass
class TokenizedSource:
    name: str
    shards: list[TokenizedShard]
    # Per document, in shard order: its tokens (EOS included) and its duplicate-cluster size (1 if
    # none).
    document_tokens: np.ndarray
    cluster_sizes: np.ndarray
    bad_records: int

    @property
    def documents(self) -> int:
        return len(self.document_tokens)

    @property
    def tokens(self) -> int:
        return int(self.document_tokens.sum())


def _recording_cluster_sizes(documents: Iterator, sizes: list[int]) -> Iterator:
    for document in documents:
        sizes.append(int(document.metadata.get("minhash_cluster_size") or 1))
        yield document


def _tokenize_file(task: FileTask, out_dir: Path, tokenizer_file: Path, eos: str, batch_size: int):
    """Shard `index` from file `index`; (shard or None if it is empty, document tokens, cluster
    sizes, bad records)."""
    from datatrove.pipeline.tokens import DocumentTokenizer

    source, paths_file, bad_records_dir, index = task
    reader = source_reader(source, paths_file, bad_records_dir)
    sizes: list[int] = []
    tokenizer = DocumentTokenizer(
        str(out_dir),
        tokenizer_name_or_path=str(tokenizer_file),
        eos_token=eos,
        shuffle_documents=False,
        batch_size=batch_size,
    )
    documents = _recording_cluster_sizes(
        reader.run(rank=index, world_size=len(source.files)), sizes
    )
    tokenizer.run(documents, rank=index, world_size=len(source.files))
    bad_records = int(reader.stats["bad_records"].total)
    path = out_dir / SHARD_NAME.format(index=index)
    ends = np.fromfile(f"{path}{INDEX_SUFFIX}", dtype=INDEX_DTYPE).astype(np.int64)
    if not len(ends):  # datatrove leaves empty files behind for an input without documents
        for leftover in (path, Path(f"{path}{INDEX_SUFFIX}"), Path(f"{path}{METADATA_SUFFIX}")):
            leftover.unlink(missing_ok=True)
        return None, np.zeros(0, np.int64), np.zeros(0, np.int64), bad_records
    if len(ends) != len(sizes):
        raise RuntimeError(f"{path}: {len(ends)} documents tokenized but {len(sizes)} read")
    shard = TokenizedShard(path.name, len(ends), int(ends[-1]))
    return shard, np.diff(ends, prepend=0), np.asarray(sizes, dtype=np.int64), bad_records


def tokenize_source(
    source: SourceInput,
    out_dir: Path,
    tokenizer_file: Path,
    eos: str,
    scratch: Path,
    workers: int,
    batch_size: int,
) -> TokenizedSource:
    """Tokenize every file of `source` into `out_dir` (emptied first), `workers` files at a time."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():  # an interrupted run's shards are written again
        stale.unlink()
    per_file = partial(
        _tokenize_file,
        out_dir=out_dir,
        tokenizer_file=tokenizer_file,
        eos=eos,
        batch_size=batch_size,
    )
    shards, lengths, sizes, bad_records = [], [], [], 0
    for shard, document_tokens, cluster_sizes, bad in over_files(
        source, scratch, workers, per_file, f"pack: tokenizing {source.name}"
    ):
        bad_records += bad
        if shard is not None:
            shards.append(shard)
            lengths.append(document_tokens)
            sizes.append(cluster_sizes)
    empty = np.zeros(0, np.int64)
    return TokenizedSource(
        source.name,
        shards,
        np.concatenate(lengths) if lengths else empty,
        np.concatenate(sizes) if sizes else empty,
        bad_records,
    )
