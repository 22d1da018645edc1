"""How sure the evaluate stage's numbers are: percentile bootstrap intervals over documents (bits
per byte) and over test items (accuracy), and paired comparisons of a trained model with the base.

Bits per byte is a ratio of sums, sum(nats) / sum(bytes) / ln 2, over documents of very different
lengths, so the documents are resampled whole (with replacement) and the ratio taken again: the
spread says how much the number would move with other documents of the same kind. A comparison of
two models on the same documents (or test items) is paired: each resample draws the same documents
for both, so that what the documents share (a hard text is hard for every model) cancels out, and
the interval of the difference is much narrower than the two intervals side by side suggest.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

# With 1000 resamples the 2.5% and 97.5% percentiles move by about 2% of the interval's width from
# one seed to another (a normal spread); the fixed seed makes a report the same on every run.
RESAMPLES = 1000
SEED = 20261128
# Resampled indices drawn this many at a time (resamples x documents), so that a set of a hundred
# thousand documents does not hold a billion indices at once.
CHUNK_ELEMENTS = 4_000_000
BETTER, WORSE, NOT_TOLD_APART = "better", "worse", "not told apart"


def resampled_sums(
    columns: Sequence[np.ndarray], resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """(columns, resamples): each column's sum over the same bootstrap resamples of its rows (all
    columns have one value per document or item, in the same order)."""
    values = np.stack([np.asarray(column, dtype=np.float64) for column in columns])
    count = values.shape[1]
    if count == 0:
        raise ValueError("a bootstrap of nothing: there are no documents or items to resample")
    generator = np.random.default_rng(seed)
    sums = np.empty((len(values), resamples))
    step = max(1, CHUNK_ELEMENTS // count)
    for start in range(0, resamples, step):
        chunk = min(step, resamples - start)
        chosen = generator.integers(0, count, size=(chunk, count))
        sums[:, start : start + chunk] = values[:, chosen].sum(axis=-1)
    return sums


def _bits_per_byte(nats: np.ndarray, utf8_bytes: np.ndarray) -> float:
    """Bits per byte of the documents together, in the very operations of bits_per_byte.py's
    (which brings torch; this module stays light: report.py imports it, and every stage imports
    report.py through stage_outputs.py), so that it is the number the report shows."""
    return float(np.sum(nats)) / math.log(2) / int(np.sum(utf8_bytes))


def percentile_interval(samples: np.ndarray) -> tuple[float, float]:
    """The central 95% of the resampled values."""
    low, high = np.percentile(samples, [2.5, 97.5])
    return float(low), float(high)


def bits_per_byte_interval(
    document_nats: np.ndarray, document_bytes: np.ndarray
) -> tuple[float, float]:
    """The 95% bootstrap interval of bits per byte over documents."""
    nats, size = resampled_sums([document_nats, document_bytes])
    return percentile_interval(nats / size / math.log(2))


def verdict(low: float, high: float, lower_is_better: bool) -> str:
    """`better` or `worse` where the change's interval leaves out zero, else `not told apart`."""
    if low > 0 or high < 0:
        return BETTER if (high < 0) == lower_is_better else WORSE
    return NOT_TOLD_APART


@dataclass(frozen=True)
class Change:
    """A trained model against the base on the same documents or items: `final - base` and the 95%
    interval of that difference from a paired bootstrap."""

    base: float
    final: float
    interval_95: tuple[float, float]
    verdict: str

    @property
    def change(self) -> float:
        return self.final - self.base

    def as_dict(self) -> dict:
        return {
            "base": self.base,
            "final": self.final,
            "change": self.change,
            "interval_95": list(self.interval_95),
            "verdict": self.verdict,
        }


def bits_per_byte_change(
    base_nats: np.ndarray, base_bytes: np.ndarray, final_nats: np.ndarray, final_bytes: np.ndarray
) -> Change:
    """The final model's bits per byte minus the base's on the same documents (paired: the same
    resampled documents for both); lower is better."""
    if len(base_nats) != len(final_nats):
        raise ValueError(
            f"a paired comparison needs the same documents: {len(base_nats)} against "
            f"{len(final_nats)}"
        )
    sums = resampled_sums([base_nats, base_bytes, final_nats, final_bytes])
    differences = (sums[2] / sums[3] - sums[0] / sums[1]) / math.log(2)
    low, high = percentile_interval(differences)
    return Change(
        _bits_per_byte(base_nats, base_bytes),
        _bits_per_byte(final_nats, final_bytes),
        (low, high),
        verdict(low, high, lower_is_better=True),
    )


def accuracy_change(base_outcomes: Sequence[bool], final_outcomes: Sequence[bool]) -> Change:
    """The final model's accuracy minus the base's on the same test items (paired: the same
    resampled items for both); higher is better."""
    if len(base_outcomes) != len(final_outcomes):
        raise ValueError(
            f"a paired comparison needs the same test items: {len(base_outcomes)} against "
            f"{len(final_outcomes)}"
        )
    base, final = resampled_sums([base_outcomes, final_outcomes]) / len(base_outcomes)
    low, high = percentile_interval(final - base)
    return Change(
        float(np.mean(base_outcomes)),
        float(np.mean(final_outcomes)),
        (low, high),
        verdict(low, high, lower_is_better=False),
    )
