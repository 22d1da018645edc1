"""Safetensors files written like any other file of the project: with the mode the user's umask gives.

safetensors' `save_file` writes a temporary file, created with mode 0600, and renames it into place, so every
checkpoint and export would be private to its owner whatever the umask: a project group sharing a work folder
could not read the models. `save_tensors` gives the file the mode a new file gets (0644 under umask 022).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import torch
from safetensors.torch import save_file


def _umask() -> int:
    # Python reads the umask only by setting it, which races with other threads; Linux shows it in /proc.
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The permission bits `open(path, "w")` gives a new file now."""
    return 0o666 & ~_umask()


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: Optional[dict[str, str]] = None) -> None:
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, new_file_mode())
