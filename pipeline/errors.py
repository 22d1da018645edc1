"""The errors a user sees: each says what was wrong, where, and what to do. The ground floor: imports nothing."""

from __future__ import annotations


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
