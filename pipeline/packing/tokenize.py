"""Tokenizing one source of the mix plan into shards, every document ending with EOS.

Each input file of the source becomes one shard (pipeline/packing/shards.py) in the format of
datatrove's `DocumentTokenizer`, whose `TokenizedFile` writes it: the `.ds` token file, its `.index`
of document ends and its `.metadata`, uint16 or uint32 by the vocabulary size. The files are read
one after another in this process, and each batch of `pack.batch_size` documents is encoded by
`tokenizers` on `workers` Rust threads (pipeline/tokenization/workers.py), so that a source of one
large file keeps every worker as busy as many small files do; reading and writing, a few percent of
the work, stay in this process. Each text is encoded alone, so the shards are the same for any
`workers` and any batch size. Documents keep the order of the input: the sampler shuffles, and the
document order must match the duplicate-cluster sizes read here for rehydration.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain, islice
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from pipeline.corpus.sources import SourceInput, paths_file, source_reader
from pipeline.packing.shards import token_dtype
from pipeline.progress import Progress

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


@dataclass(frozen=True)
class Encoder:
    """The tokenizer (loaded from `file`) that packs, the id every document ends with, and the
    documents per `encode_batch` call."""

    tokenizer: Tokenizer
    file: Path
    eos_id: int
    batch_size: int

    def encoded(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """The ids of `texts`, each followed by EOS, back to back; and each one's length."""
        encodings = self.tokenizer.encode_batch(texts, add_special_tokens=False)
        ids = [encoding.ids + [self.eos_id] for encoding in encodings]
        lengths = np.fromiter(map(len, ids), np.int64, len(ids))
        dtype = token_dtype(self.tokenizer.get_vocab_size())
        return np.fromiter(chain.from_iterable(ids), dtype, int(lengths.sum())), lengths


def _tokenize_file(
    source: SourceInput,
    index: int,
    files: Path,
    bad_records_dir: Path,
    out_dir: Path,
    encoder: Encoder,
    progress: Progress,
):
    """Shard `index` from file `index` of those the `files` list names; (shard or None if it is empty,
    document tokens, cluster sizes, bad records)."""
    from datatrove.pipeline.tokens.tokenizer import TokenizedFile

    path = out_dir / SHARD_NAME.format(index=index)
    shard = TokenizedFile(
        str(out_dir),
        path.name,
        tokenizer_name_or_path=str(encoder.file),
        save_final_metadata=True,
        token_size=token_dtype(encoder.tokenizer.get_vocab_size()).itemsize,
    )
    reader = source_reader(source, files, bad_records_dir)
    documents = reader.run(rank=index, world_size=len(source.files))
    lengths, sizes = [], []
    while batch := list(islice(documents, encoder.batch_size)):
        texts = [document.text for document in batch]
        tokens, batch_lengths = encoder.encoded(texts)
        shard.write_bytes(tokens.tobytes(), np.cumsum(batch_lengths).tolist())
        lengths.append(batch_lengths)
        sizes += [int(document.metadata.get("minhash_cluster_size") or 1) for document in batch]
        progress.update(sum(len(text.encode("utf-8")) for text in texts))
    shard.close()
    bad_records = int(reader.stats["bad_records"].total)
    if not sizes:  # no document: no shard
        shard.cleanup()
        return None, np.zeros(0, np.int64), np.zeros(0, np.int64), bad_records
    document_tokens = np.concatenate(lengths)
    tokenized = TokenizedShard(path.name, len(sizes), int(document_tokens.sum()))
    return tokenized, document_tokens, np.asarray(sizes, dtype=np.int64), bad_records


def tokenize_source(
    source: SourceInput, out_dir: Path, encoder: Encoder, scratch: Path, progress: Progress
) -> TokenizedSource:
    """Tokenize every file of `source` into `out_dir` (emptied first), counting the UTF-8 bytes
    of its text in `progress`; the list of files read and the bad records go to `scratch`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.iterdir():  # an interrupted run's shards are written again
        stale.unlink()
    files = paths_file(source, scratch)
    shards, lengths, sizes, bad_records = [], [], [], 0
    for index in range(len(source.files)):
        shard, document_tokens, cluster_sizes, bad = _tokenize_file(
            source, index, files, scratch / "bad_records", out_dir, encoder, progress
        )
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
