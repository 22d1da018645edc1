"""The files of training checkpoints, and how a checkpoint proves it is whole: no DeepSpeed, no
torch.

`checkpoints/step-00001000/` holds the files every rank wrote and `state.json`, written last, which
lists each of those files with its size and SHA-256. A checkpoint verifies when `state.json` reads
and every listed file is there with that size and checksum: a file cut short by a full quota or a
file-system incident, or one changed since, is caught before a resume reads it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Optional

STATE_FILE = "state.json"
_PREFIX = "step-"
# state.json's list of the other files: name -> {"bytes", "sha256"}.
FILES_KEY = "files"


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"{_PREFIX}{step:08d}"


def checkpoint_step(folder: Path) -> int:
    return int(folder.name[len(_PREFIX) :])


def checkpoints(root: Path) -> list[Path]:
    """The checkpoint folders under `root` that have their state.json, newest first (whether they
    verify or not); a folder without it was cut short while being written (those are `.step-*.tmp`
    until complete)."""
    found = [
        path
        for path in root.glob(f"{_PREFIX}*")
        if path.name[len(_PREFIX) :].isdigit() and (path / STATE_FILE).is_file()
    ]
    return sorted(found, key=checkpoint_step, reverse=True)


def describe(root: Path) -> str:
    """`checkpoints step-4, step-8` for messages; empty if there are none."""
    steps = sorted(checkpoint_step(path) for path in checkpoints(root))
    return f"checkpoints {', '.join(f'step-{step}' for step in steps)}" if steps else ""


def file_entry(path: Path) -> dict:
    with path.open("rb") as handle:
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
    return {"bytes": path.stat().st_size, "sha256": digest}


def read_state(folder: Path) -> dict:
    return json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))


def size_problem(folder: Path) -> Optional[str]:
    """Why the checkpoint is not whole judging by its state.json and file sizes (cheap), or None."""
    try:
        listed = read_state(folder)[FILES_KEY]
    except (OSError, ValueError, KeyError, TypeError) as error:
        return (
            f"its {STATE_FILE} cannot be read or lists no files ({type(error).__name__}: {error})"
        )
    for name, entry in listed.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != entry["bytes"]:
            return f"{name} has {size:,} bytes, {entry['bytes']:,} were written"
    return None


def checksum_problem(folder: Path, names: list[str]) -> Optional[str]:
    """Why one of `names` (files of a checkpoint whose sizes are right) does not match its checksum,
    or None."""
    listed = read_state(folder)[FILES_KEY]
    for name in names:
        if file_entry(folder / name)["sha256"] != listed[name]["sha256"]:
            return f"{name} does not match the checksum written with it"
    return None
