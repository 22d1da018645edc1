"""The pack stage's output folder, opened for reading: `packed.json`, and per source its shards and repeats.

Layout of `<work_dir>/<lang>/pack/`:

    packed.json                      the exact plan: per source its documents, unique tokens, epochs,
                                     shares (and the mix plan's estimates), tokens per pass, its shards
    shards/<source>/NNNNN_unshuffled.ds{,.index,.metadata}   one datatrove shard per input file
    shards/<source>/repeats.npy      reads per document in one pass of the plan (uint16)
    reading/<source>/                the list of files read, and their bad records if there were any

Opening checks every shard (pipeline/packing/shards.py) and the repeats against `packed.json`, so a
truncated or mismatched file fails here, with its name, before training reads anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.packing.repetition import REPEATS_DTYPE, REPEATS_FILE
from pipeline.packing.shards import PackedDataError, Shard, open_shard, repack_hint, token_dtype

PACKED_FILE = "packed.json"


@dataclass
class PackedSource:
    name: str
    shards: list[Shard]
    # Per document, in shard order: its tokens (EOS included), shard, first token in that shard, reads per pass.
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
        return self.shards[int(self.document_shard[index])].tokens[begin:begin + int(self.document_tokens[index])]


class PackedData:
    """A pack folder, checked: its sources that the plan reads (epochs > 0), in `packed.json` order."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        path = self.folder / PACKED_FILE
        if not path.is_file():
            raise PackedDataError(f"{path} is missing: {self.folder} is not the output of the pack stage. Run "
                                  "`python -m pipeline stage=pack lang=<lang>` and pass its folder (work/<lang>/pack).")
        raw = path.read_bytes()
        # Restoring a sampler state checks this: the same seed over other data is another stream.
        self.fingerprint = hashlib.sha256(raw).hexdigest()[:16]
        try:
            self.document = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PackedDataError(f"{path} cannot be read ({error}): it is damaged or cut short. "
                                  f"{repack_hint(self.folder)}") from None
        tokenizer = self.document["tokenizer"]
        self.vocab_size, self.eos_id = tokenizer["vocab_size"], tokenizer["eos_id"]
        self.dtype = token_dtype(self.vocab_size)
        if tokenizer["dtype"] != self.dtype.name:
            raise PackedDataError(f"{path} says dtype {tokenizer['dtype']} for a vocabulary of {self.vocab_size:,} "
                                  f"ids, which packs as {self.dtype.name}. {repack_hint(self.folder)}")
        self.sources = [self._open(entry) for entry in self.document["sources"] if entry["pass_tokens"] > 0]

    def _open(self, entry: dict) -> PackedSource:
        folder = self.folder / entry["folder"]
        shards = [open_shard(folder / s["file"], self.dtype, s["documents"], s["tokens"], self.folder)
                  for s in entry["shards"]]
        lengths = [np.diff(shard.ends, prepend=0) for shard in shards]
        document_tokens = np.concatenate(lengths)
        document_shard = np.repeat(np.arange(len(shards), dtype=np.int32), [len(x) for x in lengths])
        document_begin = np.concatenate([shard.ends - length for shard, length in zip(shards, lengths)])
        repeats_path = folder / REPEATS_FILE
        try:
            repeats = np.load(repeats_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            raise PackedDataError(f"{repeats_path} cannot be read ({error}). {repack_hint(self.folder)}") from None
        if repeats.dtype != REPEATS_DTYPE or repeats.shape != document_tokens.shape:
            raise PackedDataError(f"{repeats_path} holds {repeats.shape} {repeats.dtype}, but the source has "
                                  f"{len(document_tokens):,} documents ({REPEATS_DTYPE.name}, one each). "
                                  f"{repack_hint(self.folder)}")
        source = PackedSource(entry["name"], shards, document_tokens, document_shard, document_begin, repeats)
        if source.documents != entry["documents"] or source.pass_tokens != entry["pass_tokens"]:
            raise PackedDataError(f"{folder}: {source.documents:,} documents and {source.pass_tokens:,} tokens per "
                                  f"pass, but packed.json recorded {entry['documents']:,} and "
                                  f"{entry['pass_tokens']:,}. {repack_hint(self.folder)}")
        return source
