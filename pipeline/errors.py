"""The errors a user sees: each says what was wrong, where, and what to do; the line that stands for
an OS error; and the valid choices ordered by how close they are to what the user typed, for their
messages. The ground floor: imports nothing of the project.
"""

from __future__ import annotations

import difflib
import errno
import os
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
    """The stage stopped on request (a Slurm signal) after saving its progress; the same command
    resumes it."""

    # EX_TEMPFAIL: "try again later", what a requeued Slurm job should see.
    exit_code = 75


def os_error_message(error: OSError, folders: dict[str, str]) -> str:
    """One line for an OS error: what happened, to which path, and what to do. `folders` maps the
    keys that choose a folder (work_dir, raw_dir) to it, to name the key to change; a failed write
    names no file: the first folder stands in for it."""
    path = os.path.abspath(
        os.fsdecode(error.filename if error.filename is not None else next(iter(folders.values())))
    )
    key = next((key for key, folder in folders.items() if _within(path, folder)), None)
    elsewhere = f", or choose another {key}=" if key else ""
    if error.errno in (errno.EACCES, errno.EPERM):
        access = {"work_dir": "write ", "raw_dir": "read "}.get(key, "")
        return f"permission denied: {path}: give the pipeline {access}access to it{elsewhere}"
    if error.errno == errno.EROFS:
        return (
            f"read-only file system: {path}: the stage writes there; mount it writable{elsewhere}"
        )
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            f"disk full or quota exceeded: {path}: free space{elsewhere}; the same command "
            "continues the "
            f"stage"
        )
    if error.errno == errno.ENOENT:
        return f"no such file or folder: {path}: if it was removed while the stage ran, run the same command again"
    if error.errno == errno.ENOTDIR:
        return (
            f"not a folder: {path}: a file stands where the path needs a folder; move it{elsewhere}"
        )
    return f"{error.strerror}: {path}"


def _within(path: str, folder: str) -> bool:
    folder = os.path.abspath(folder)
    return os.path.commonpath([path, folder]) == folder


def closest_first(typed: str, choices: Iterable[str]) -> list[str]:
    """All `choices`, the most similar to `typed` first (ties keep their original order)."""
    choices = list(choices)
    typed = str(typed).lower()

    def score(choice: str) -> float:
        c = choice.lower()
        bonus = 1.0 if c.startswith(typed[:2]) or typed.startswith(c[:2]) else 0.0
        return difflib.SequenceMatcher(None, typed, c).ratio() + 0.25 * bonus

    return sorted(choices, key=score, reverse=True)
