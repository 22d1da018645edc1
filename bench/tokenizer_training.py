"""Benchmark: byte-level BPE and SentencePiece trained on the same sample, time and peak memory side
by side.

Each training runs in a fresh process (this script with `--train`), so that one backend's memory
never counts against another's; its peak is the process's own `ru_maxrss` read as soon as training
returns (before the encoding below). A baseline process imports the same libraries and reads the
sample without training: what is above its peak is the training's own memory. SentencePiece trains
on its fixed number of threads, as in the stage (SENTENCEPIECE_THREADS in
pipeline/tokenization/training.py: its model depends on the count), `tokenizers` on `--threads`
Rayon threads. After training, each process encodes the whole sample once with its `tokenizer.json`
(through `tokenizers`, in batches) to report the encoding speed too.

    python bench/tokenizer_training.py                      # embedded nob + eng, 32768 tokens
    python bench/tokenizer_training.py --vocab-size 8192 --input /data/nob_sample
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.corpus.sources import raw_folder

from pipeline.corpus.sources import read_documents  # noqa: E402
from pipeline.tokenization.tokenizer_config import TokenizerConfig  # noqa: E402
from pipeline.tokenization.sample import read_sample, write_document  # noqa: E402

RUNS = {  # name: TokenizerConfig options; None trains nothing
    "baseline (read the sample, no training)": None,
    "bytelevel_bpe": dict(backend="bytelevel_bpe"),
    "sentencepiece unigram": dict(backend="sentencepiece", sentencepiece_model_type="unigram"),
    "sentencepiece bpe": dict(backend="sentencepiece", sentencepiece_model_type="bpe"),
}
ANCHOR, COMPARED = "bytelevel_bpe", ("sentencepiece unigram", "sentencepiece bpe")
ENCODE_BATCH = 256


def write_sample(folders: list[Path], path: Path, scratch: Path) -> tuple[int, int]:
    """Every document of the raw folders, in the stage's sample format; (documents, UTF-8 bytes)."""
    docs = size = 0
    with open(path, "wb") as sink:
        for folder in folders:
            for document in read_documents(raw_folder(folder.name, folder), scratch / folder.name):
                write_document(sink, document.text)
                docs += 1
                size += len(document.text.encode("utf-8"))
    return docs, size


def train_once(name: str, sample: Path, vocab_size: int) -> dict:
    """In the child process: train (or only read, for the baseline) and encode the sample; the
    timings."""
    from pipeline.tokenization.training import train_tokenizer

    options = RUNS[name]
    if (
        options is None
    ):  # the baseline: the libraries the trainers load, and the sample read through
        for library in ("sentencepiece", "tokenizers"):
            importlib.import_module(library)
        sum(1 for _ in read_sample(sample))
        return {"peak_rss_mib": peak_rss_mib()}
    start = time.perf_counter()
    trained = train_tokenizer(
        read_sample(sample), TokenizerConfig(vocab_size=vocab_size, **options)
    )
    train_s = time.perf_counter() - start
    train_peak = peak_rss_mib()
    texts = list(read_sample(sample))
    start = time.perf_counter()
    tokens = sum(
        len(e.ids)
        for i in range(0, len(texts), ENCODE_BATCH)
        for e in trained.tokenizer.encode_batch(
            texts[i : i + ENCODE_BATCH], add_special_tokens=False
        )
    )
    encode_s = time.perf_counter() - start
    return {
        "train_s": train_s,
        "peak_rss_mib": train_peak,
        "encode_s": encode_s,
        "tokens": tokens,
        "vocab_size": trained.tokenizer.get_vocab_size(),
    }


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_child(name: str, sample: Path, vocab_size: int, threads: int, out: Path) -> dict:
    env = {**os.environ, "RAYON_NUM_THREADS": str(threads), "TOKENIZERS_PARALLELISM": "true"}
    command = [
        sys.executable,
        __file__,
        "--train",
        name,
        "--sample",
        str(sample),
        "--vocab-size",
        str(vocab_size),
        "--threads",
        str(threads),
        "--out",
        str(out),
    ]
    subprocess.run(command, env=env, check=True)
    return json.loads(out.read_text())


def table(results: dict, sample_bytes: int) -> str:
    baseline = results[next(iter(RUNS))]["peak_rss_mib"]
    rows = [
        "| run | train time (s) | peak RSS (MiB) | RSS above baseline (MiB) | encode (MB/s) | "
        "bytes per token "
        "| vocab |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in results.items():
        if "train_s" not in r:
            rows.append(f"| {name} | | {r['peak_rss_mib']:.0f} | 0 | | | |")
            continue
        rows.append(
            f"| {name} | {r['train_s']:.1f} | {r['peak_rss_mib']:.0f} | "
            f"{r['peak_rss_mib'] - baseline:.0f} | "
            f"{sample_bytes / r['encode_s'] / 1e6:.1f} | {sample_bytes / r['tokens']:.2f} | "
            f"{r['vocab_size']:,} |"
        )
    anchor = results[ANCHOR]
    for name in COMPARED:
        r = results[name]
        rows.append(
            f"| ratio {name} / {ANCHOR} | {r['train_s'] / anchor['train_s']:.2f} | "
            f"{r['peak_rss_mib'] / anchor['peak_rss_mib']:.2f} | "
            f"{(r['peak_rss_mib'] - baseline) / (anchor['peak_rss_mib'] - baseline):.2f} | "
            f"{anchor['encode_s'] / r['encode_s']:.2f} | | |"
        )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--input",
        nargs="+",
        type=Path,
        default=[REPO / "data" / "nob", REPO / "data" / "eng"],
        help="raw folders (JSONL/Parquet with a `text` field) whose documents form the sample",
    )
    parser.add_argument("--vocab-size", type=int, default=32768)
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--train", help=argparse.SUPPRESS)
    parser.add_argument("--sample", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.train:  # the child process
        args.out.write_text(json.dumps(train_once(args.train, args.sample, args.vocab_size)))
        return

    with tempfile.TemporaryDirectory() as tmp:
        sample = Path(tmp) / "sample.jsonl"
        docs, size = write_sample(args.input, sample, Path(tmp) / "scratch")
        print(
            f"sample: {docs:,} documents, {size / 1e6:.2f} MB from "
            f"{', '.join(str(p) for p in args.input)}; "
            f"vocab_size {args.vocab_size}; {args.threads} threads",
            flush=True,
        )
        results = {
            name: run_child(name, sample, args.vocab_size, args.threads, Path(tmp) / f"{i}.json")
            for i, name in enumerate(RUNS)
        }
    print(table(results, size))


if __name__ == "__main__":
    main()
