"""Filling a token budget from the target language and the other sources: pure functions, no I/O.

The order (issue 3): sources with a fixed ratio first (each gets ratio x budget, which must fit
within its epoch cap); then the target language, up to its cap; then the other sources by priority
(lower first, ties in the configured order), each up to its own cap. What is still missing is the
shortfall: the plan never repeats a source beyond its cap to hide it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence


FIXED_RATIO, TARGET, FILLER = "fixed ratio", "target", "filler"


class PlanError(ValueError):
    """The sources cannot give what the configuration demands; the message says what to change."""


@dataclass(frozen=True)
class Source:
    name: str
    unique_tokens: int
    max_epochs: float
    # Lower fills first; None for the target, which always comes before the fillers.
    priority: Optional[int] = None
    ratio: Optional[float] = None
    # An optional source's ratio is a ceiling: a source too small for it gives what its epoch cap
    # allows (the base language's replay when the raw folder has little of it), where a required one
    # fails the plan.
    optional: bool = False

    @property
    def capacity(self) -> int:
        """The most tokens the source gives within its epoch cap."""
        return math.floor(self.unique_tokens * self.max_epochs)


@dataclass(frozen=True)
class Allocation:
    source: Source
    role: str
    tokens: int

    @property
    def epochs(self) -> float:
        return self.tokens / self.source.unique_tokens if self.source.unique_tokens else 0.0

    @property
    def effective_tokens(self) -> float:
        return effective_tokens(self.source.unique_tokens, self.epochs)

    @property
    def at_cap(self) -> bool:
        return 0 < self.source.capacity <= self.tokens


@dataclass(frozen=True)
class Plan:
    budget: int
    # The target first, then the other sources in the order they were planned.
    allocations: tuple[Allocation, ...]

    @property
    def planned_tokens(self) -> int:
        return sum(a.tokens for a in self.allocations)

    @property
    def shortfall(self) -> int:
        return self.budget - self.planned_tokens

    @property
    def budget_met(self) -> bool:
        return self.shortfall == 0

    @property
    def effective_tokens(self) -> float:
        return sum(a.effective_tokens for a in self.allocations)

    def share(self, allocation: Allocation) -> float:
        """Share of the budget."""
        return allocation.tokens / self.budget

    def sampling_weight(self, allocation: Allocation) -> float:
        """Share of the planned tokens: the probability of drawing from this source."""
        return allocation.tokens / self.planned_tokens if self.planned_tokens else 0.0


def _fixed_share(source: Source, budget: int) -> int:
    wanted = math.floor(source.ratio * budget)
    return min(wanted, source.capacity) if source.optional else wanted


def _fixed_ratio_tokens(source: Source, budget: int) -> int:
    wanted = _fixed_share(source, budget)
    if wanted > source.capacity:
        most = source.capacity / budget
        more_epochs = (
            f", raise its max_epochs to at least {wanted / source.unique_tokens:.3g}"
            if source.unique_tokens
            else ""
        )
        raise PlanError(
            f"Source `{source.name}` cannot give its fixed ratio {source.ratio:g} of the "
            f"{budget:,}-token budget "
            f"({wanted:,} tokens): {source.unique_tokens:,} unique tokens at most "
            f"{source.max_epochs:g} epochs give "
            f"{source.capacity:,} (ratio {most:.4g}). Lower its ratio to at most "
            f"{most:.4g}{more_epochs}, give it "
            "more data, or lower mix.tokens."
        )
    return wanted


def default_budget(target: Source, others: Sequence[Source]) -> int:
    """The budget whose part left after the fixed ratios is the target at its cap: the largest such
    budget, so that each share is as large as its ratio allows."""
    fixed = [s for s in others if s.ratio is not None]

    def left_for_target(budget: int) -> int:
        return budget - sum(_fixed_share(s, budget) for s in fixed)

    # left_for_target grows with the budget (up to the floor of each share): bisect for the last
    # budget that leaves the target no more than its cap, between the target alone and past the one
    # that meets every ratio.
    low, high = (
        target.capacity,
        math.ceil(target.capacity / (1 - sum(s.ratio for s in fixed))) + len(fixed) + 1,
    )
    while low < high:
        middle = (low + high + 1) // 2
        if left_for_target(middle) <= target.capacity:
            low = middle
        else:
            high = middle - 1
    return low


def plan_mixture(budget: int, target: Source, others: Sequence[Source]) -> Plan:
    """Allocate `budget` tokens: fixed ratios, then the target up to its cap, then the rest by
    priority."""
    if budget <= 0:
        raise PlanError(f"The token budget must be positive, not {budget:,}.")
    fixed = [
        Allocation(s, FIXED_RATIO, _fixed_ratio_tokens(s, budget))
        for s in others
        if s.ratio is not None
    ]
    remaining = budget - sum(a.tokens for a in fixed)

    target_allocation = Allocation(target, TARGET, min(target.capacity, remaining))
    remaining -= target_allocation.tokens

    fillers = []
    # sorted() is stable: equal priorities keep the configured order.
    for source in sorted((s for s in others if s.ratio is None), key=lambda s: s.priority):
        fillers.append(Allocation(source, FILLER, min(source.capacity, remaining)))
        remaining -= fillers[-1].tokens
    return Plan(budget, (target_allocation, *fixed, *fillers))


# plan.json's `budget_from` when the user fixed the budget (estimate.py).
FIXED_BUDGET = "mix.tokens"


def exact_plan(plan: dict, unique_tokens: Mapping[str, int]) -> Plan:
    """The plan of `plan.json` with `unique_tokens` (by source name) replacing the estimates it has
    them for; raises the planner's PlanError when a fixed ratio no longer fits the exact counts.

    For pack: the planner is a pure function of the sources' unique tokens and the mix settings that
    `plan.json` records (budget, epoch caps, priorities, fixed ratios), so the exact plan is the
    same call with the counted tokens. A budget the mix stage derived from the target (no
    `mix.tokens`) is derived again from the target's exact tokens. Unique tokens are the tokens
    stored, EOS included: what training reads.
    """
    sources = [
        Source(
            s["name"],
            unique_tokens.get(s["name"], s["unique_tokens_est"]),
            s["max_epochs"],
            s["priority"],
            s["ratio"],
            s.get("optional", False),
        )
        for s in plan["sources"]
    ]
    target, others = sources[0], sources[1:]
    budget = (
        plan["budget_tokens"]
        if plan["budget_from"] == FIXED_BUDGET
        else default_budget(target, others)
    )
    return plan_mixture(budget, target, others)


# What repeated data is worth: the data-constrained scaling law of Muennighoff et al. 2023.
#
# "Scaling Data-Constrained Language Models" (arXiv:2305.16264, eq. 5) fits the value of U unique
# tokens seen for `epochs` passes as the effective data D' = U + U*R*(1 - exp(-R/R*)), with R =
# epochs - 1 repetitions and R* = 15.39. The second epoch is worth 97% of new data and each later
# one exp(-1/R*) ~ 94% of the one before: up to ~4 epochs repetition is nearly as good as new data,
# and however long one trains D' stays below U*(1 + R*).
#
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
