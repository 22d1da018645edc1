"""Experiment (issue 27): how much of the base's own language an extended tokenizer cuts anew, with
and without that language in the text the added merges learn from, and sparing it. A base tokenizer
(SmolLM2's) is extended by `--added` tokens on `--target-bytes` of the target's clean training text:
alone; with `--english-bytes` of the base language's clean training text; alone, leaving out the
tokens that this English uses (`--spare-ratio`, as `tokenizer.spare_ratio` does). Each extension
then cuts the base language's held-out book (`heldout_source`) and the target's held-out split. CPU
only (2 cores: under a minute per extension for 30 MB).

    python bench/extension_english.py --base <smollm2>/tokenizer.json --work <work_dir> [--lang nob --base-lang eng]
"""

from __future__ import annotations

import argparse
import gzip
import json
import logging
import sys
from pathlib import Path
from typing import Iterator

from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.progress import Progress  # noqa: E402
from pipeline.tokenization.extension import Spared, base_cuts, extend_bpe, pieces  # noqa: E402


def texts(folder: Path, limit: int | None = None) -> Iterator[str]:
    """The texts of a clean split's shards, in file order, until `limit` UTF-8 bytes are passed."""
    read = 0
    for file in sorted(folder.glob("*.jsonl.gz")):
        with gzip.open(file, "rt", encoding="utf-8") as handle:
            for line in handle:
                text = json.loads(line)["text"]
                read += len(text.encode("utf-8"))
                yield text
                if limit is not None and read > limit:
                    return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the base's tokenizer.json")
    parser.add_argument(
        "--work", required=True, help="a work folder with <lang>/clean and <base-lang>/clean"
    )
    parser.add_argument("--lang", default="nob")
    parser.add_argument("--base-lang", default="eng")
    parser.add_argument("--added", type=int, default=16384)
    parser.add_argument("--target-bytes", type=int, default=30_000_000)
    parser.add_argument("--english-bytes", type=int, default=6_000_000)
    parser.add_argument("--spare-ratio", type=float, default=0.01)
    parser.add_argument("--workers", type=int, default=1, help="processes, as the stage's")
    args = parser.parse_args()

    base = Tokenizer.from_file(args.base)
    first_added = base.get_vocab_size()
    work = Path(args.work)
    book = list(texts(work / args.base_lang / "clean" / "heldout_source"))
    heldout = list(texts(work / args.lang / "clean" / "heldout"))
    heldout_bytes = sum(len(text.encode("utf-8")) for text in heldout)
    print(
        f"base: {sum(len(base.encode(t, add_special_tokens=False).ids) for t in book):,} tokens in "
        "the book"
    )
    target = list(texts(work / args.lang / "clean" / "train", args.target_bytes))
    english = list(texts(work / args.base_lang / "clean" / "train", args.english_bytes))
    english_bytes = sum(len(text.encode("utf-8")) for text in english)
    every = max(1, round(sum(len(text.encode("utf-8")) for text in target) / english_bytes))

    def base_cut(documents: list[str], what: str):
        with Progress(what, None, "B", logging.getLogger(__name__)) as progress:
            return base_cuts(base, documents, args.workers, progress)

    def counted(documents: list[str], what: str):
        with Progress(what, None, "B", logging.getLogger(__name__)) as progress:
            return pieces(base, documents, args.workers, progress)

    # as the stage counts the target: every k-th
    spared = Spared(
        counted(english, "english"), counted(target[::every], "target"), args.spare_ratio
    )
    for name, documents, spare in (
        (f"{args.lang} only", target, None),
        (f"{args.lang} + {args.base_lang}", target + english, None),
        (f"{args.lang} only, sparing {args.base_lang}", target, spared),
    ):
        extended, added = extend_bpe(base, base_cut(documents, name), args.added, 2, spare)
        cut = [extended.encode(text, add_special_tokens=False).ids for text in book]
        per_byte = (
            sum(len(extended.encode(t, add_special_tokens=False).ids) for t in heldout)
            / heldout_bytes
        )
        used = sum(1 for ids in cut for token in ids if token >= first_added)
        print(
            f"{name}: {added['left_out']} left out; {sum(map(len, cut)):,} tokens in the book, "
            f"{used} of them added; "
            f"{args.lang} held-out split {per_byte:.4f} tokens per byte",
            flush=True,
        )


if __name__ == "__main__":
    main()
