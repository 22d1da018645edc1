"""Safetensors files written like any other file of the project: with the mode the user's umask gives.

safetensors' `save_file` writes a temporary file, created with mode 0600, and renames it into place, so every
checkpoint and export would be private to its owner whatever the umask: a project group sharing a work folder
could not read the models. `save_tensors` gives the file the mode a new file gets (0644 under umask 022).

`join_tensor_files` writes one file from several (a model's pipeline-stage parts) a tensor at a time, copying the
parts' bytes, so that joining a model never holds it in memory.
"""

from __future__ import annotations

import json
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


# Bytes copied at a time by join_tensor_files.
_COPY_CHUNK = 64 * 2**20


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (without its metadata) and where its data starts."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


def join_tensor_files(parts: list[Path], path: Path) -> None:
    """One safetensors file with every tensor of `parts` (a name in several parts, such as a tied embedding held by
    the first and the last pipeline stage, is taken from the first), written through a temporary file."""
    sources: dict[str, tuple[Path, dict, int]] = {}
    for part in parts:
        header, data_start = _header(part)
        for name, entry in header.items():
            sources.setdefault(name, (part, entry, data_start))
    names = sorted(sources)
    layout, offset = {}, 0
    for name in names:
        _, entry, _ = sources[name]
        begin, end = entry["data_offsets"]
        size = end - begin
        layout[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(layout, separators=(",", ":")).encode("utf-8")
    header += b" " * (-len(header) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    tmp = path.with_name(f".{path.name}.tmp")
    handles = {part: open(part, "rb") for part in dict.fromkeys(part for part, _, _ in sources.values())}
    try:
        with open(tmp, "wb") as out:
            out.write(len(header).to_bytes(8, "little"))
            out.write(header)
            for name in names:
                part, entry, data_start = sources[name]
                begin, end = entry["data_offsets"]
                source = handles[part]
                source.seek(data_start + begin)
                left = end - begin
                while left:
                    chunk = source.read(min(left, _COPY_CHUNK))
                    if not chunk:
                        raise OSError(f"{part} ends inside tensor {name}: the file is truncated")
                    out.write(chunk)
                    left -= len(chunk)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    finally:
        for handle in handles.values():
            handle.close()
    os.chmod(tmp, new_file_mode())
    os.replace(tmp, path)
