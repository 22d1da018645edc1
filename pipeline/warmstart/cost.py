"""What building the new embeddings cost: wall seconds and peak memory, for the warmup report.

Memory is the process's resident set (RSS), sampled every few milliseconds from /proc while the work runs,
so that it counts what native code (fastText, tokenizers, torch) holds, not only Python objects. Where
/proc is missing (not Linux), memory is reported as null.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

STATM = Path("/proc/self/statm")
SAMPLE_SECONDS = 0.005


def resident_bytes() -> Optional[int]:
    try:
        return int(STATM.read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


@contextmanager
def measured() -> Iterator[dict]:
    """Fills the dict it yields with `seconds`, `peak_rss_mib` and `peak_added_mib` (above the start)."""
    cost: dict = {}
    start_rss = resident_bytes()
    peak = [start_rss or 0]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(SAMPLE_SECONDS):
            peak[0] = max(peak[0], resident_bytes() or 0)

    sampler = threading.Thread(target=sample, daemon=True)
    started = time.perf_counter()
    if start_rss is not None:
        sampler.start()
    try:
        yield cost
    finally:
        done.set()
        if start_rss is not None:
            sampler.join()
            peak[0] = max(peak[0], resident_bytes() or 0)
        cost["seconds"] = round(time.perf_counter() - started, 3)
        cost["peak_rss_mib"] = round(peak[0] / 2**20, 1) if start_rss is not None else None
        cost["peak_added_mib"] = round((peak[0] - start_rss) / 2**20, 1) if start_rss is not None else None
