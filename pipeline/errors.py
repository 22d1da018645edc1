"""The errors a user sees: each says what was wrong, where, and what to do; and the valid choices ordered by how
close they are to what the user typed, for their messages. The ground floor: imports nothing of the project.
"""

from __future__ import annotations

import difflib
from typing import Iterable


class ConfigError(ValueError):
    """A config key holds a value that cannot work; raised before any work starts."""

    def __init__(self, key: str, value, allowed) -> None:
        allowed_text = ", ".join(str(a) for a in allowed)
        super().__init__(f"Invalid value for `{key}`: {value!r}. Allowed: {allowed_text}.")
        self.key = key


class StageError(RuntimeError):
    """A problem the user must fix before the stage can run; the message says how."""


class StageInterrupted(StageError):
    """The stage stopped on request (a Slurm signal) after saving its progress; the same command resumes it."""

    # EX_TEMPFAIL: "try again later", what a requeued Slurm job should see.
    exit_code = 75


def closest_first(typed: str, choices: Iterable[str]) -> list[str]:
    """All `choices`, the most similar to `typed` first (ties keep their original order)."""
    choices = list(choices)
    typed = str(typed).lower()

    def score(choice: str) -> float:
        c = choice.lower()
        bonus = 1.0 if c.startswith(typed[:2]) or typed.startswith(c[:2]) else 0.0
        return difflib.SequenceMatcher(None, typed, c).ratio() + 0.25 * bonus

    return sorted(choices, key=score, reverse=True)
