"""Progress of long work as log lines with a rate and the time left, which a Slurm log keeps
readable, beside tqdm's bar where a terminal shows one (tqdm's carriage returns turn a batch log
into one endless line, so the bar is off there and the log lines carry the progress).

    with Progress("pack nob: tokenize", total=bytes_in, unit="B", log=log) as progress:
        for chunk in chunks:
            ...
            progress.update(len(chunk))
"""

from __future__ import annotations

import logging
import time
from typing import Optional

from tqdm import tqdm

# Seconds between two log lines: often enough to see a stall, rare enough to read a day's log.
LOG_EVERY_S = 30.0


def count(value: float) -> str:
    """12,345 -> '12.3k'; 1_500_000 -> '1.50M': the size of a count at a glance."""
    for size, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= size:
            return f"{value / size:.3g}{suffix}"
    return f"{value:.3g}" if isinstance(value, float) and value != int(value) else f"{int(value)}"


def duration(seconds: float) -> str:
    """95 -> '1m 35s'; 7260 -> '2h 01m 00s'."""
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h {minutes:02d}m {rest:02d}s" if hours else f"{minutes}m {rest:02d}s"


class Progress:
    """Counts work done against `total` (None: unknown) in `unit`s; logs a line every
    `every_s` seconds and one at the end, and drives a tqdm bar on a terminal."""

    def __init__(
        self,
        what: str,
        total: Optional[float],
        unit: str,
        log: logging.Logger,
        every_s: float = LOG_EVERY_S,
    ) -> None:
        self.what, self.total, self.unit, self.log, self.every_s = what, total, unit, log, every_s
        self.done = 0.0
        self._bar = tqdm(total=total, unit=unit, unit_scale=True, desc=what, disable=None)
        self._started = self._logged = time.perf_counter()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self._bar.close()
        if kind is None:
            elapsed = time.perf_counter() - self._started
            self.log.info(
                "%s: done, %s %s in %s%s",
                self.what,
                count(self.done),
                self.unit,
                duration(elapsed),
                self._rate(elapsed),
            )

    def update(self, amount: float) -> None:
        self.done += amount
        self._bar.update(amount)
        now = time.perf_counter()
        if now - self._logged >= self.every_s:
            self._logged = now
            self.log.info("%s", self.line(now - self._started))

    def line(self, elapsed: float) -> str:
        """'pack nob: 45% (1.2G of 2.7G B), 41.2M B/s, about 36 s left'."""
        rate = self.done / elapsed if elapsed > 0 else 0.0
        if not self.total:
            return f"{self.what}: {count(self.done)} {self.unit}{self._rate(elapsed)}"
        share = min(1.0, self.done / self.total)
        left = f", about {duration((self.total - self.done) / rate)} left" if rate > 0 else ""
        return (
            f"{self.what}: {share:.0%} ({count(self.done)} of {count(self.total)} {self.unit})"
            f"{self._rate(elapsed)}{left}"
        )

    def _rate(self, elapsed: float) -> str:
        return f", {count(self.done / elapsed)} {self.unit}/s" if elapsed > 0 else ""
