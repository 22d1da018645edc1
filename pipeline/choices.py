"""Ordering valid choices by how close they are to what the user typed, for error messages."""

from __future__ import annotations

import difflib
from typing import Iterable


def closest_first(typed: str, choices: Iterable[str]) -> list[str]:
    """All `choices`, the most similar to `typed` first (ties keep their original order)."""
    choices = list(choices)
    typed = str(typed).lower()

    def score(choice: str) -> float:
        c = choice.lower()
        bonus = 1.0 if c.startswith(typed[:2]) or typed.startswith(c[:2]) else 0.0
        return difflib.SequenceMatcher(None, typed, c).ratio() + 0.25 * bonus

    return sorted(choices, key=score, reverse=True)
