"""Benchmark of the pack stage: tokenization into shards, and the sampler reading them back.

Tokenization runs the stage's own code (`pipeline.packing.tokenize.tokenize_source`: datatrove's
reader, gzip JSONL in, `.ds` shards out, each batch of documents encoded on the process's Rust
threads) on every document of the embedded `data/nob` and `data/eng`, repeated `--repeat` times over
`--files` input files per source, with a byte-level BPE tokenizer trained by the tokenizer stage's
code. The anchor is `tokenizers`' plain `encode_batch` (the same tokenizer.json) on the same texts,
already in memory, in batches of the same size: what the stage adds is reading, decompressing, EOS
and writing. Both run on one thread, then on `--workers` threads (RAYON_NUM_THREADS, as the stage
sets it from `workers`), each count in a process of its own (this script with `--threads`): the
thread pool is sized once per process. Each measurement is the best of `--runs`, taken in turn.

The sampler (`pipeline.packing.sampler.PackedSampler`, seq_len 2048, global batch 256, both sources
blended, nob 4 epochs and eng 1.5) builds `--steps` global batches with segment ids. The anchor
reads the same number of 2049-token windows as contiguous slices of one memory-mapped shard into an
int64 array: what the sampler adds is the blend, the shuffled document order and the boundaries.

    python bench/pack.py                          # embedded nob + eng x 8, 32768 tokens
    python bench/pack.py --repeat 20 --workers 2
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import orjson
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.corpus.sources import raw_folder, read_documents  # noqa: E402
from pipeline.packing.output import (  # noqa: E402
    source_folder,
    tokenizer_entry,
    write_packed,
    write_source,
)
from pipeline.packing.sampler import PackedSampler  # noqa: E402
from pipeline.packing.tokenize import Encoder, tokenize_source  # noqa: E402
from pipeline.progress import Progress  # noqa: E402
from pipeline.tokenization.tokenizer_config import TokenizerConfig  # noqa: E402
from pipeline.tokenization.training import train_tokenizer  # noqa: E402

SOURCES = {"nob": 4.0, "eng": 1.5}  # epochs
BATCH_SIZE = 1000  # documents per tokenizer call, the stage's default (pack.batch_size)
SEQ_LEN, GLOBAL_BATCH = 2048, 256
EOS = "</s>"


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


def time_tokenize(inputs: Path, out: Path, tokenizer_file: Path) -> tuple[float, dict]:
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    encoder = Encoder(tokenizer, tokenizer_file, tokenizer.token_to_id(EOS), BATCH_SIZE)
    quiet = Progress("pack", None, "B", logging.getLogger(__name__))
    start = time.perf_counter()
    tokenized = {
        name: tokenize_source(
            raw_folder(name, inputs / name),
            source_folder(out, name),
            encoder,
            out / "reading" / name,
            quiet,
        )
        for name in SOURCES
    }
    return time.perf_counter() - start, tokenized


def measure(folder: Path, runs: int) -> dict:
    """In a process of its own, whose RAYON_NUM_THREADS is the thread count: the best of `runs` of
    the anchor and of the stage's tokenization, taken in turn."""
    texts = [
        document.text
        for name in SOURCES
        for document in read_documents(
            raw_folder(name, folder / "inputs" / name), folder / "scratch" / name
        )
    ]
    tokenizer_file = folder / "tokenizer.json"
    anchor_s = tokenize_s = float("inf")
    for _ in range(runs):
        seconds, anchor_tokens = time_encode_batch(Tokenizer.from_file(str(tokenizer_file)), texts)
        anchor_s = min(anchor_s, seconds)
        seconds, tokenized = time_tokenize(folder / "inputs", folder / "pack", tokenizer_file)
        tokenize_s = min(tokenize_s, seconds)
    tokens = sum(t.tokens for t in tokenized.values())
    assert tokens == anchor_tokens, (tokens, anchor_tokens)
    return {"anchor_s": anchor_s, "tokenize_s": tokenize_s, "tokens": tokens}


def measure_in_child(folder: Path, threads: int, runs: int) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, "--measure", str(folder), "--runs", str(runs)]
    output = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(output.splitlines()[-1])


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


def prepare(folder: Path, repeat: int, files: int, vocab_size: int) -> int:
    """The inputs and the tokenizer in `folder`; the number of documents."""
    texts = {
        name: [
            d.text
            for d in read_documents(
                raw_folder(name, REPO / "data" / name), folder / "scratch" / name
            )
        ]
        for name in SOURCES
    }
    trained = train_tokenizer(
        (t for docs in texts.values() for t in docs), TokenizerConfig(vocab_size=vocab_size)
    )
    trained.tokenizer.save(str(folder / "tokenizer.json"))
    write_inputs(texts, folder / "inputs", repeat, files)
    all_texts = [t for docs in texts.values() for t in docs] * repeat
    text_bytes = sum(len(t.encode("utf-8")) for t in all_texts)
    print(
        f"input: {len(all_texts):,} documents, {text_bytes / 1e6:.1f} MB ({repeat} x the "
        f"embedded nob + eng, {files} gzip JSONL files per source); vocab_size "
        f"{trained.tokenizer.get_vocab_size():,}",
        flush=True,
    )
    return len(all_texts)


def time_sampling(folder: Path, steps: int, runs: int) -> tuple[float, float, int]:
    """The sampler and its anchor on the inputs that `measure` left in `folder`, tokenized once
    more here (untimed) for the sources' token counts."""
    pack, tokenizer_file = folder / "pack", folder / "tokenizer.json"
    _, tokenized = time_tokenize(folder / "inputs", pack, tokenizer_file)
    entries = [
        write_source(pack, tokenized[name], np.full(tokenized[name].documents, epochs), seed=1)
        for name, epochs in SOURCES.items()
    ]
    vocab_size = Tokenizer.from_file(str(tokenizer_file)).get_vocab_size()
    write_packed(pack, tokenizer_entry(tokenizer_file, vocab_size, EOS, 1), entries)
    windows = steps * GLOBAL_BATCH
    shard = max(source_folder(pack, "nob").glob("*.ds"), key=lambda p: p.stat().st_size)
    sampler_s = min(time_sampler(pack, steps) for _ in range(runs))
    slices_s = min(time_memmap_slices(shard, windows) for _ in range(runs))
    return sampler_s, slices_s, windows


def threads_text(threads: int) -> str:
    return f"{threads} thread" + ("s" if threads > 1 else "")


def table(measured: dict[int, dict], sampling: tuple[float, float, int]) -> list[str]:
    rows = [
        "| run | time (s) | tokens/s | tokens/s per thread | sequences/s |",
        "|---|---:|---:|---:|---:|",
    ]
    for threads, m in measured.items():
        on = threads_text(threads)
        timed = (
            ("tokenizers encode_batch (anchor)", m["anchor_s"]),
            ("pack tokenization", m["tokenize_s"]),
        )
        for name, seconds in timed:
            rate = m["tokens"] / seconds
            rows.append(f"| {name}, {on} | {seconds:.2f} | {rate:,.0f} | {rate / threads:,.0f} | |")
    sampler_s, slices_s, windows = sampling
    window_tokens = windows * (SEQ_LEN + 1)
    rows.append(
        f"| memmap slices, contiguous (anchor) | {slices_s:.3f} | {window_tokens / slices_s:,.0f} "
        f"| | {windows / slices_s:,.0f} |"
    )
    rows.append(
        f"| PackedSampler, seq_len {SEQ_LEN}, global batch {GLOBAL_BATCH} | {sampler_s:.3f} | "
        f"{window_tokens / sampler_s:,.0f} | | {windows / sampler_s:,.0f} |"
    )
    for threads, m in measured.items():
        ratio = m["anchor_s"] / m["tokenize_s"]
        rows.append(
            f"| ratio pack tokenization / encode_batch, {threads_text(threads)} | | "
            f"{ratio:.2f} | | |"
        )
    one, many = measured[min(measured)], measured[max(measured)]
    rows.append(
        f"| ratio pack tokenization, {max(measured)} threads / 1 | | "
        f"{one['tokenize_s'] / many['tokenize_s']:.2f} | | |"
    )
    ratio = slices_s / sampler_s
    rows.append(f"| ratio PackedSampler / memmap slices | | {ratio:.2f} | | {ratio:.2f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=8, help="copies of the embedded text per source"
    )
    parser.add_argument("--files", type=int, default=4, help="input files per source")
    parser.add_argument("--workers", type=int, default=2, help="threads, as the stage's `workers`")
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=20, help="global batches the sampler builds")
    parser.add_argument(
        "--runs", type=int, default=2, help="runs of each measurement; the table shows the best"
    )
    parser.add_argument("--measure", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.measure:  # the child process
        print(json.dumps(measure(args.measure, args.runs)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        documents = prepare(folder, args.repeat, args.files, args.vocab_size)
        measured = {
            threads: measure_in_child(folder, threads, args.runs)
            for threads in sorted({1, args.workers})
        }
        sampling = time_sampling(folder, args.steps, args.runs)
    tokens = measured[1]["tokens"]
    print(
        f"{tokens:,} tokens ({tokens / documents:.0f} per document, EOS included); sampler: "
        f"{args.steps} global batches = {sampling[2]:,} sequences"
    )
    print("\n".join(table(measured, sampling)))


if __name__ == "__main__":
    main()
