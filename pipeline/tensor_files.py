"""Safetensors files written like any other file of the project: with the mode the user's umask
gives.

safetensors' `save_file` writes a temporary file, created with mode 0600, and renames it into place,
so every checkpoint and export would be private to its owner whatever the umask: a project group
sharing a work folder could not read the models. `save_tensors` gives the file the mode a new file
gets (0644 under umask 022).

`TensorFileWriter` writes a safetensors file a tensor at a time (its names, dtypes and shapes known
first), `TensorFileReader` reads one a tensor or a slice at a time, and `join_tensor_files` writes
one file from several (a model's pipeline-stage parts) by copying the parts' bytes: writing,
converting or joining a model never holds it in memory. The reader reads with plain file reads, not
safetensors' memory map: a mapped file's pages count in the process's resident set as it is read, so
reading a whole model through one looks like holding it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import BinaryIO, Optional

import torch
from safetensors.torch import save_file


def _umask() -> int:
    # Python reads the umask only by setting it, which races with other threads; Linux shows it in
    # /proc.
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


def save_tensors(
    tensors: dict[str, torch.Tensor], path: Path, metadata: Optional[dict[str, str]] = None
) -> None:
    save_file(tensors, str(path), metadata=metadata)
    os.chmod(path, new_file_mode())


# Bytes copied at a time by join_tensor_files, and read at a time for a slice across rows.
_COPY_CHUNK = 64 * 2**20
_SLICE_CHUNK = 8 * 2**20


def _header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (without its metadata) and where its data starts."""
    with open(path, "rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    return header, 8 + size


# safetensors' names of the dtypes a model file holds.
_DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}


_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES[dtype]


class TensorFileReader:
    """A safetensors file read a tensor, or a slice of one, at a time (a context manager holding it
    open). A file whose header cannot be read, or that ends before its last tensor, raises OSError
    naming it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            header, self._data_start = _header(self.path)
        except (OSError, ValueError, UnicodeDecodeError) as error:
            raise OSError(f"{self.path} is not a readable safetensors file ({error})") from None
        self._entries = header
        end = max((entry["data_offsets"][1] for entry in header.values()), default=0)
        if self.path.stat().st_size < self._data_start + end:
            raise OSError(
                f"{self.path} is truncated: its header describes {self._data_start + end:,} bytes, "
                "the file "
                f"has {self.path.stat().st_size:,}"
            )
        self._handle: Optional[BinaryIO] = None

    def keys(self) -> list[str]:
        return list(self._entries)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def __enter__(self) -> "TensorFileReader":
        self._handle = open(self.path, "rb")
        return self

    def __exit__(self, *error) -> None:
        self._handle.close()

    def _read(self, start: int, dtype: torch.dtype, count: int) -> torch.Tensor:
        if count == 0:
            return torch.empty(0, dtype=dtype)
        buffer = bytearray(count * torch.empty(0, dtype=dtype).element_size())
        self._handle.seek(self._data_start + start)
        if self._handle.readinto(buffer) != len(buffer):
            raise OSError(f"{self.path} ends inside a tensor: the file is truncated")
        return torch.frombuffer(buffer, dtype=dtype)

    def read(self, name: str) -> torch.Tensor:
        entry = self._entries[name]
        shape = tuple(entry["shape"])
        return self._read(
            entry["data_offsets"][0], _DTYPES[entry["dtype"]], math.prod(shape)
        ).reshape(shape)

    def read_slice(self, name: str, dim: int, start: int, stop: int) -> torch.Tensor:
        """tensor.narrow(dim, start, stop - start) without reading the whole tensor at once: the
        rows before `dim` are read in chunks of at most 8 MiB."""
        entry = self._entries[name]
        shape, dtype, offset = (
            tuple(entry["shape"]),
            _DTYPES[entry["dtype"]],
            entry["data_offsets"][0],
        )
        sliced = (*shape[:dim], stop - start, *shape[dim + 1 :])
        outer, inner = math.prod(shape[:dim]), math.prod(shape[dim + 1 :])
        itemsize = torch.empty(0, dtype=dtype).element_size()
        if dim == 0:  # one contiguous run of bytes
            return self._read(
                offset + start * inner * itemsize, dtype, (stop - start) * inner
            ).reshape(sliced)
        row = shape[dim] * inner  # values per outer index
        result = torch.empty(outer, stop - start, inner, dtype=dtype)
        chunk = max(1, _SLICE_CHUNK // max(1, row * itemsize))
        for first in range(0, outer, chunk):
            count = min(chunk, outer - first)
            rows = self._read(offset + first * row * itemsize, dtype, count * row)
            result[first : first + count] = rows.reshape(count, shape[dim], inner)[:, start:stop]
        return result.reshape(sliced)


class TensorFileWriter:
    """A safetensors file written one tensor at a time, in the order of `layout` (name -> (dtype
    name, shape)), through a temporary file that replaces `path` only when every tensor is written;
    on an error it is removed.

        with TensorFileWriter(path, layout) as out:
            for name in layout:
                out.write(name, tensor_of(name))
    """

    def __init__(
        self,
        path: Path,
        layout: dict[str, tuple[str, tuple[int, ...]]],
        metadata: Optional[dict[str, str]] = None,
    ) -> None:
        self.path = Path(path)
        self._tmp = self.path.with_name(f".{self.path.name}.tmp")
        self._entries, offset = {}, 0
        itemsize = {
            name: torch.empty(0, dtype=dtype).element_size() for dtype, name in _DTYPE_NAMES.items()
        }
        for name, (dtype, shape) in layout.items():
            size = itemsize[dtype]
            for dim in shape:
                size *= dim
            self._entries[name] = {
                "dtype": dtype,
                "shape": list(shape),
                "data_offsets": [offset, offset + size],
            }
            offset += size
        self._order = list(self._entries)
        self._next = 0
        self._out: Optional[BinaryIO] = None
        self._metadata = metadata

    def __enter__(self) -> "TensorFileWriter":
        header = dict(self._entries)
        if self._metadata:
            header["__metadata__"] = self._metadata
        encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
        encoded += b" " * (
            -len(encoded) % 8
        )  # the data starts 8-byte aligned, as safetensors writes it
        self._out = open(self._tmp, "wb")
        self._out.write(len(encoded).to_bytes(8, "little"))
        self._out.write(encoded)
        return self

    def _expect(self, name: str) -> int:
        if self._next >= len(self._order) or self._order[self._next] != name:
            wanted = self._order[self._next] if self._next < len(self._order) else "none"
            raise ValueError(f"{self.path}: tensor {name} written out of order (next is {wanted})")
        self._next += 1
        begin, end = self._entries[name]["data_offsets"]
        return end - begin

    def write(self, name: str, tensor: torch.Tensor) -> None:
        entry = self._entries[name]
        if dtype_name(tensor.dtype) != entry["dtype"] or list(tensor.shape) != entry["shape"]:
            raise ValueError(
                f"{self.path}: tensor {name} is {tensor.dtype} {tuple(tensor.shape)}, the file "
                "declares "
                f"{entry['dtype']} {tuple(entry['shape'])}"
            )
        self._expect(name)
        # the tensor's own bytes, not a copy of them
        self._out.write(
            tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().data
        )

    def copy(self, name: str, source: BinaryIO, start: int, origin: Path) -> None:
        """The tensor's bytes from the open file `source` at `start` (`origin` names it in errors)."""
        left = self._expect(name)
        source.seek(start)
        while left:
            chunk = source.read(min(left, _COPY_CHUNK))
            if not chunk:
                raise OSError(f"{origin} ends inside tensor {name}: the file is truncated")
            self._out.write(chunk)
            left -= len(chunk)

    def __exit__(self, kind, error, traceback) -> None:
        self._out.close()
        if kind is not None:  # the error goes on up; the half-written file goes
            self._tmp.unlink(missing_ok=True)
            return
        if self._next != len(self._order):
            self._tmp.unlink(missing_ok=True)
            raise ValueError(
                f"{self.path}: {len(self._order) - self._next} declared tensors were not written, "
                "from "
                f"{self._order[self._next]} on"
            )
        os.chmod(self._tmp, new_file_mode())
        os.replace(self._tmp, self.path)


def join_tensor_files(parts: list[Path], path: Path) -> None:
    """One safetensors file with every tensor of `parts` (a name in several parts, such as a tied
    embedding held by the first and the last pipeline stage, is taken from the first), written
    through a temporary file."""
    sources: dict[str, tuple[Path, dict, int]] = {}
    for part in parts:
        header, data_start = _header(part)
        for name, entry in header.items():
            sources.setdefault(name, (part, entry, data_start))
    names = sorted(sources)
    layout = {}
    for name in names:
        _, entry, _ = sources[name]
        layout[name] = (entry["dtype"], tuple(entry["shape"]))
    handles = {
        part: open(part, "rb") for part in dict.fromkeys(part for part, _, _ in sources.values())
    }
    try:
        with TensorFileWriter(path, layout) as out:
            for name in names:
                part, entry, data_start = sources[name]
                out.copy(name, handles[part], data_start + entry["data_offsets"][0], part)
    finally:
        for handle in handles.values():
            handle.close()
