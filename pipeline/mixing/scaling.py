"""What repeated data is worth: the data-constrained scaling law of Muennighoff et al. 2023.

"Scaling Data-Constrained Language Models" (arXiv:2305.16264, eq. 5) fits the value of U unique
tokens seen for `epochs` passes as the effective data D' = U + U*R*(1 - exp(-R/R*)), with R =
epochs - 1 repetitions and R* = 15.39. The second epoch is worth 97% of new data and each later one
exp(-1/R*) ~ 94% of the one before: up to ~4 epochs repetition is nearly as good as new data, and
however long one trains D' stays below U*(1 + R*).
"""

from __future__ import annotations

import math

# The paper's fitted decay constant for repeated data (R*_D).
R_STAR = 15.39
FORMULA = "D' = U + U*R*(1 - exp(-R/R*)), R = epochs - 1, R* = 15.39"
REFERENCE = "Muennighoff et al. 2023, Scaling Data-Constrained Language Models (arXiv:2305.16264)"


def effective_tokens(unique: float, epochs: float) -> float:
    """D' for `unique` tokens seen `epochs` times; up to one epoch nothing repeats, so D' = D."""
    if epochs <= 1:
        return unique * epochs
    repetitions = epochs - 1
    return unique + unique * R_STAR * (1 - math.exp(-repetitions / R_STAR))


def epoch_values(epochs: float) -> list[float]:
    """What each epoch adds, per token, relative to new data: 1.0 for the first, then less and less.

    A last partial epoch (epochs = 4.5) is valued per token of that part.
    """
    values, done = [], 0.0
    while epochs - done > 1e-9:
        part = min(1.0, epochs - done)
        values.append((effective_tokens(1.0, done + part) - effective_tokens(1.0, done)) / part)
        done += part
    return values
