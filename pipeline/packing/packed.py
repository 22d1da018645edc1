"""The pack stage's output folder, opened for reading: `packed.json`, and per source its shards and
repeats.

Layout of `<work_dir>/<lang>/pack/`:

    packed.json                      the exact plan: per source its documents, unique tokens, epochs,
                                     shares (and the mix plan's estimates), tokens per pass, its shards
    shards/<source>/NNNNN_unshuffled.ds{,.index,.metadata}   one datatrove shard per input file
    shards/<source>/repeats.npy      reads per document in one pass of the plan (uint16)
    reading/<source>/                the list of files read, and their bad records if there were any

Opening checks every shard (pipeline/packing/shards.py) and the repeats against `packed.json`, so a
truncated or mismatched file fails here, with its name, before training reads anything.

How many times each document is read in one pass of the plan: the index that replaces copies.

A source planned for `e` epochs reads each document floor(e) times, and a share of its documents
once more so that the extra reads add up to frac(e) of its tokens (to within one document). Which
documents get the extra read is a seeded choice (`pack.seed`) over the whole source, made by tokens
so that long and short documents are alike. With rehydration (FineWeb-2) each target document has
its own epochs, its duplicate-cluster weight x the plan's scale (pipeline/mixing/rehydration.py,
recomputed here with exact tokens); the same rule applies within each group of documents that share
a number of epochs.

The result, one uint16 per document, is stored as `repeats.npy` beside the source's shards and read
by the sampler: repetition costs two bytes per document, never a copy.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from pipeline.mixing.rehydration import Rehydration, rehydrate
from pipeline.packing.shards import PackedDataError, Shard, open_shard, repack_hint, token_dtype

PACKED_FILE = "packed.json"


@dataclass
class PackedSource:
    name: str
    shards: list[Shard]
    # Per document, in shard order: its tokens (EOS included), shard, first token in that shard,
    # reads per pass.
    document_tokens: np.ndarray
    document_shard: np.ndarray
    document_begin: np.ndarray
    repeats: np.ndarray

    @property
    def documents(self) -> int:
        return len(self.document_tokens)

    @property
    def pass_tokens(self) -> int:
        """Tokens read from this source in one pass of the plan."""
        return int(np.dot(self.document_tokens, self.repeats.astype(np.int64)))

    def document(self, index: int) -> np.ndarray:
        begin = int(self.document_begin[index])
        return self.shards[int(self.document_shard[index])].tokens[
            begin : begin + int(self.document_tokens[index])
        ]


class PackedData:
    """A pack folder, checked: its sources that the plan reads (epochs > 0), in `packed.json` order."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        path = self.folder / PACKED_FILE
        if not path.is_file():
            raise PackedDataError(
                f"{path} is missing: {self.folder} is not the output of the pack stage. Run "
                "`python -m pipeline stage=pack lang=<lang>` and pass its folder "
                "(work/<lang>/pack)."
            )
        raw = path.read_bytes()
        # Restoring a sampler state checks this: the same seed over other data is another stream.
        self.fingerprint = hashlib.sha256(raw).hexdigest()[:16]
        try:
            self.document = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PackedDataError(
                f"{path} cannot be read ({error}): it is damaged or cut short. "
                f"{repack_hint(self.folder)}"
            ) from None
        tokenizer = self.document["tokenizer"]
        self.vocab_size, self.eos_id = tokenizer["vocab_size"], tokenizer["eos_id"]
        self.dtype = token_dtype(self.vocab_size)
        if tokenizer["dtype"] != self.dtype.name:
            raise PackedDataError(
                f"{path} says dtype {tokenizer['dtype']} for a vocabulary of {self.vocab_size:,} "
                f"ids, which packs as {self.dtype.name}. {repack_hint(self.folder)}"
            )
        self.sources = [
            self._open(entry) for entry in self.document["sources"] if entry["pass_tokens"] > 0
        ]

    def _open(self, entry: dict) -> PackedSource:
        folder = self.folder / entry["folder"]
        shards = [
            open_shard(folder / s["file"], self.dtype, s["documents"], s["tokens"], self.folder)
            for s in entry["shards"]
        ]
        lengths = [np.diff(shard.ends, prepend=0) for shard in shards]
        document_tokens = np.concatenate(lengths)
        document_shard = np.repeat(
            np.arange(len(shards), dtype=np.int32), [len(x) for x in lengths]
        )
        document_begin = np.concatenate(
            [shard.ends - length for shard, length in zip(shards, lengths)]
        )
        repeats_path = folder / REPEATS_FILE
        try:
            repeats = np.load(repeats_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise PackedDataError(
                f"{repeats_path} cannot be read ({error}). {repack_hint(self.folder)}"
            ) from None
        if repeats.dtype != REPEATS_DTYPE or repeats.shape != document_tokens.shape:
            raise PackedDataError(
                f"{repeats_path} holds {repeats.shape} {repeats.dtype}, but the source has "
                f"{len(document_tokens):,} documents ({REPEATS_DTYPE.name}, one each). "
                f"{repack_hint(self.folder)}"
            )
        source = PackedSource(
            entry["name"], shards, document_tokens, document_shard, document_begin, repeats
        )
        if source.documents != entry["documents"] or source.pass_tokens != entry["pass_tokens"]:
            raise PackedDataError(
                f"{folder}: {source.documents:,} documents and {source.pass_tokens:,} tokens per "
                f"pass, but packed.json recorded {entry['documents']:,} and "
                f"{entry['pass_tokens']:,}. {repack_hint(self.folder)}"
            )
        return source


REPEATS_FILE = "repeats.npy"
REPEATS_DTYPE = np.dtype("<u2")
# Epochs within this of a whole number are that number (float rounding of tokens / unique tokens).
_WHOLE = 1e-9


def rehydrated_epochs(
    cluster_sizes: np.ndarray,
    document_tokens: np.ndarray,
    table: Sequence[tuple[int, float]],
    epochs: float,
) -> tuple[np.ndarray, Rehydration]:
    """Each document's epochs: its cluster size's weight, scaled so that the token-weighted mean is
    `epochs`."""
    by_cluster_size: dict[int, list[int]] = {}
    for size in np.unique(cluster_sizes):
        members = cluster_sizes == size
        by_cluster_size[int(size)] = [int(members.sum()), int(document_tokens[members].sum())]
    rehydration = rehydrate(by_cluster_size, table, epochs)
    min_sizes = np.array([size for size, _ in table])
    weights = np.array([weight for _, weight in table])
    rows = np.searchsorted(min_sizes, cluster_sizes, side="right") - 1
    return weights[rows] * rehydration.scale, rehydration


def repetitions(
    document_tokens: np.ndarray, document_epochs: np.ndarray, seed: int, source: str
) -> np.ndarray:
    """Reads per document: floor(epochs), plus one for a seeded share of the documents of each
    fractional group."""
    whole = np.floor(document_epochs + _WHOLE)
    if whole.max(initial=0) >= np.iinfo(REPEATS_DTYPE).max:
        raise ValueError(
            f"source `{source}`: {whole.max():g} epochs exceed the {np.iinfo(REPEATS_DTYPE).max} "
            "that the repeats index holds"
        )
    repeats = whole.astype(REPEATS_DTYPE)
    fraction = np.where(document_epochs - whole > _WHOLE, document_epochs - whole, 0.0)
    rng = np.random.default_rng([seed, zlib.crc32(source.encode("utf-8"))])
    groups, group_of = np.unique(document_epochs, return_inverse=True)
    for group in range(len(groups)):
        members = np.flatnonzero(group_of == group)
        part = fraction[members[0]]
        if part == 0:
            continue
        order = rng.permutation(members)
        reached = np.cumsum(document_tokens[order])
        wanted = part * reached[-1]
        # The prefix whose tokens come closest to the wanted share.
        count = int(np.searchsorted(reached, wanted))
        below = reached[count - 1] if count else 0
        if count < len(order) and reached[count] - wanted < wanted - below:
            count += 1
        repeats[order[:count]] += 1
    return repeats
