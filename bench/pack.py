"""Benchmark of the pack stage: tokenization into shards, and the sampler reading them back.

Tokenization runs the stage's own code (`pipeline.packing.tokenize.tokenize_source`: datatrove's
reader and DocumentTokenizer, gzip JSONL in, `.ds` shards out) on every document of the embedded
`data/nob` and `data/eng`, repeated `--repeat` times over `--files` input files per source, with a
byte-level BPE tokenizer trained by the tokenizer stage's code. The anchor is `tokenizers`' plain
`encode_batch` (the same tokenizer.json) on the same texts, already in memory, in batches of the
same size: what the stage adds is reading, decompressing, EOS and writing. Both run on one core
(RAYON_NUM_THREADS=1); the stage is also run with `--workers` processes, reported per core. Each
measurement is the best of `--runs`, taken in turn.

The sampler (`pipeline.packing.sampler.PackedSampler`, seq_len 2048, global batch 256, both sources
blended, nob 4 epochs and eng 1.5) builds `--steps` global batches with segment ids. The anchor
reads the same number of 2049-token windows as contiguous slices of one memory-mapped shard into an
int64 array: what the sampler adds is the blend, the shuffled document order and the boundaries.

    python bench/pack.py                          # embedded nob + eng x 8, 32768 tokens
    python bench/pack.py --repeat 20 --workers 2
"""

from __future__ import annotations

import os

os.environ["RAYON_NUM_THREADS"] = "1"  # before `tokenizers` is imported: one core per process

import argparse  # noqa: E402
import gzip  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import orjson  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.corpus.sources import raw_folder

from pipeline.corpus.sources import read_documents  # noqa: E402
from pipeline.packing.sampler import PackedSampler  # noqa: E402

# noqa: E402
from pipeline.packing.output import source_folder, tokenizer_entry, write_packed, write_source
from pipeline.packing.tokenize import tokenize_source  # noqa: E402
from pipeline.tokenization.tokenizer_config import TokenizerConfig  # noqa: E402
from pipeline.tokenization.training import train_tokenizer  # noqa: E402

SOURCES = {"nob": 4.0, "eng": 1.5}  # epochs
BATCH_SIZE = 1000  # documents per tokenizer call, the stage's default (pack.batch_size)
SEQ_LEN, GLOBAL_BATCH = 2048, 256


def write_inputs(texts: dict[str, list[str]], folder: Path, repeat: int, files: int) -> None:
    for name, documents in texts.items():
        (folder / name).mkdir(parents=True)
        records = [
            {"id": f"{name}/{r}/{i}", "text": text}
            for r in range(repeat)
            for i, text in enumerate(documents)
        ]
        for part in range(files):
            with gzip.open(folder / name / f"{part:03d}.jsonl.gz", "wb") as f:
                f.writelines(orjson.dumps(record) + b"\n" for record in records[part::files])


def time_encode_batch(tokenizer, texts: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    tokens = sum(
        len(e.ids) + 1
        for i in range(0, len(texts), BATCH_SIZE)  # + 1: the EOS the stage appends
        for e in tokenizer.encode_batch(texts[i : i + BATCH_SIZE], add_special_tokens=False)
    )
    return time.perf_counter() - start, tokens


def time_tokenize(
    inputs: Path, out: Path, tokenizer_file: Path, workers: int
) -> tuple[float, dict]:
    start = time.perf_counter()
    tokenized = {
        name: tokenize_source(
            raw_folder(name, inputs / name),
            source_folder(out, name),
            tokenizer_file,
            "</s>",
            out / "reading" / name,
            workers,
            BATCH_SIZE,
        )
        for name in SOURCES
    }
    return time.perf_counter() - start, tokenized


def time_sampler(pack: Path, steps: int) -> float:
    sampler = PackedSampler(pack, seq_len=SEQ_LEN, global_batch_size=GLOBAL_BATCH, seed=1)
    sampler.batch(0)  # the first epoch orders, as after a restart
    start = time.perf_counter()
    for step in range(1, steps + 1):
        sampler.batch(step)
    return time.perf_counter() - start


def time_memmap_slices(shard: Path, windows: int) -> float:
    tokens = np.memmap(shard, dtype="<u2", mode="r")
    starts = np.random.default_rng(0).integers(0, len(tokens) - SEQ_LEN - 1, size=windows)
    batch = np.empty((GLOBAL_BATCH, SEQ_LEN + 1), np.int64)
    start = time.perf_counter()
    for i, offset in enumerate(starts):
        batch[i % GLOBAL_BATCH] = tokens[offset : offset + SEQ_LEN + 1]
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=8, help="copies of the embedded text per source"
    )
    parser.add_argument("--files", type=int, default=4, help="input files per source")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=20, help="global batches the sampler builds")
    parser.add_argument(
        "--runs", type=int, default=2, help="runs of each measurement; the table shows the best"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        texts = {
            name: [
                d.text
                for d in read_documents(
                    raw_folder(name, REPO / "data" / name), tmp / "scratch" / name
                )
            ]
            for name in SOURCES
        }
        trained = train_tokenizer(
            (t for docs in texts.values() for t in docs),
            TokenizerConfig(vocab_size=args.vocab_size),
        )
        tokenizer_file = tmp / "tokenizer.json"
        trained.tokenizer.save(str(tokenizer_file))
        write_inputs(texts, tmp / "inputs", args.repeat, args.files)
        all_texts = [t for docs in texts.values() for t in docs] * args.repeat
        text_bytes = sum(len(t.encode("utf-8")) for t in all_texts)
        print(
            f"input: {len(all_texts):,} documents, {text_bytes / 1e6:.1f} MB ({args.repeat} x the "
            "embedded nob + "
            f"eng, {args.files} gzip JSONL files per source); vocab_size "
            f"{trained.tokenizer.get_vocab_size():,}",
            flush=True,
        )

        # Interleaved and the best of `--runs` each: the machine's other load then costs each alike.
        anchor_s = one_s = many_s = float("inf")
        for _ in range(args.runs):
            seconds, anchor_tokens = time_encode_batch(
                Tokenizer.from_file(str(tokenizer_file)), all_texts
            )
            anchor_s = min(anchor_s, seconds)
            seconds, tokenized = time_tokenize(tmp / "inputs", tmp / "pack1", tokenizer_file, 1)
            one_s = min(one_s, seconds)
            seconds, _ = time_tokenize(tmp / "inputs", tmp / "pack", tokenizer_file, args.workers)
            many_s = min(many_s, seconds)
        tokens = sum(t.tokens for t in tokenized.values())
        assert tokens == anchor_tokens, (tokens, anchor_tokens)

        pack = tmp / "pack"
        entries = [
            write_source(pack, tokenized[name], np.full(tokenized[name].documents, epochs), seed=1)
            for name, epochs in SOURCES.items()
        ]
        write_packed(
            pack,
            tokenizer_entry(tokenizer_file, trained.tokenizer.get_vocab_size(), "</s>", 1),
            entries,
        )
        windows = args.steps * GLOBAL_BATCH
        shard = max(source_folder(pack, "nob").glob("*.ds"), key=lambda p: p.stat().st_size)
        sampler_s = min(time_sampler(pack, args.steps) for _ in range(args.runs))
        slices_s = min(time_memmap_slices(shard, windows) for _ in range(args.runs))

    rows = [
        "| run | time (s) | tokens/s | tokens/s per core | sequences/s |",
        "|---|---:|---:|---:|---:|",
    ]
    rows.append(
        f"| tokenizers encode_batch, texts in memory (anchor) | {anchor_s:.2f} | "
        f"{tokens / anchor_s:,.0f} | "
        f"{tokens / anchor_s:,.0f} | |"
    )
    rows.append(
        f"| pack tokenization, 1 worker | {one_s:.2f} | {tokens / one_s:,.0f} | "
        f"{tokens / one_s:,.0f} | |"
    )
    rows.append(
        f"| pack tokenization, {args.workers} workers | {many_s:.2f} | {tokens / many_s:,.0f} | "
        f"{tokens / many_s / args.workers:,.0f} | |"
    )
    window_tokens = windows * (SEQ_LEN + 1)
    rows.append(
        f"| memmap slices, contiguous (anchor) | {slices_s:.3f} | {window_tokens / slices_s:,.0f} "
        "| | "
        f"{windows / slices_s:,.0f} |"
    )
    rows.append(
        f"| PackedSampler, seq_len {SEQ_LEN}, global batch {GLOBAL_BATCH} | {sampler_s:.3f} | "
        f"{window_tokens / sampler_s:,.0f} | | {windows / sampler_s:,.0f} |"
    )
    rows.append(
        f"| ratio pack tokenization (1 worker) / encode_batch | | {anchor_s / one_s:.2f} | "
        f"{anchor_s / one_s:.2f} | |"
    )
    rows.append(
        f"| ratio pack tokenization ({args.workers} workers) / encode_batch | | "
        f"{anchor_s / many_s:.2f} | "
        f"{anchor_s / many_s / args.workers:.2f} | |"
    )
    ratio = slices_s / sampler_s
    rows.append(f"| ratio PackedSampler / memmap slices | | {ratio:.2f} | | {ratio:.2f} |")
    print(
        f"{tokens:,} tokens ({tokens / len(all_texts):.0f} per document, EOS included); sampler: "
        f"{args.steps} "
        f"global batches = {windows:,} sequences"
    )
    print("\n".join(rows))


if __name__ == "__main__":
    main()
