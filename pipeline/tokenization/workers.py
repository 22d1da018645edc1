"""How the tokenizer and pack stages use `workers`: as `tokenizers`' Rust threads, which encode
batches of texts and train (`use_threads`), and as processes for the Python-bound work on text,
cutting it into pre-tokens or words (`in_order`).

Batches are cut by size alone, never by the number of workers, and their results come back in
input order, so that what the stages add up from them is the same for any `workers`; so are the
threads' (`tokenizers` encodes each text alone and its trainers count in integers).
"""

from __future__ import annotations

import multiprocessing
import os
from collections import deque
from typing import Callable, Iterable, Iterator, Optional, TypeVar

from pipeline.progress import Progress

T = TypeVar("T")

# Characters of text per batch: large enough that a batch's result (its distinct pre-tokens, say)
# is small beside its text, small enough that every worker gets several.
BATCH_CHARACTERS = 1_000_000
PARALLELISM, THREADS = "TOKENIZERS_PARALLELISM", "RAYON_NUM_THREADS"


def use_threads(workers: int) -> None:
    """`workers` Rust threads for `tokenizers` in this process, unless RAYON_NUM_THREADS says
    otherwise. Its thread pool reads the variable when it starts, at the process's first parallel
    call: a process that has made one keeps its count."""
    os.environ.setdefault(THREADS, str(workers))


def batches(texts: Iterable[str], characters: int = BATCH_CHARACTERS) -> Iterator[list[str]]:
    """Consecutive texts, in lists of about `characters` characters (at least one text each)."""
    batch, size = [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= characters:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


# In a worker process: what it does with each batch (set once, by _start).
_work: Optional[Callable] = None


def _start(work: Callable) -> None:
    global _work
    # One thread in each process, the processes being the parallelism (and the parent's threads,
    # if `tokenizers` started them, were not forked with it).
    os.environ[PARALLELISM] = "false"
    _work = work


def _run(batch: list[str]):
    return _work(batch)


def _size(batch: list[str]) -> int:
    return sum(len(text.encode("utf-8")) for text in batch)


def in_order(
    work: Callable[[list[str]], T],
    batches: Iterable[list[str]],
    workers: int,
    progress: Progress,
) -> Iterator[T]:
    """`work(batch)` for each batch, in order, counting each batch's UTF-8 bytes in `progress` as
    it is done: in this process with one worker, else on `workers` processes (`work` goes to each
    once, not with every batch), with at most two batches a worker in flight, so that memory holds
    those rather than the whole input."""
    if workers == 1:
        for batch in batches:
            yield work(batch)
            progress.update(_size(batch))
        return
    with multiprocessing.Pool(workers, _start, (work,)) as pool:
        waiting: deque = deque()
        for batch in batches:
            waiting.append((pool.apply_async(_run, (batch,)), _size(batch)))
            if len(waiting) == 2 * workers:
                yield _done(waiting.popleft(), progress)
        while waiting:
            yield _done(waiting.popleft(), progress)


def _done(submitted: tuple, progress: Progress):
    result, size = submitted
    value = result.get()
    progress.update(size)
    return value
