"""Which implementation a kernel call runs: the Triton kernel or the plain PyTorch reference.

`auto` (the default) runs Triton on a GPU tensor (CUDA or ROCm) and the reference on CPU.
`reference` forces the reference anywhere (e.g. to rule a kernel out while debugging a loss spike).
`triton` forces the Triton kernels anywhere: on CPU that works only under `TRITON_INTERPRET=1` (the
tests use it), where the first call mends the interpreter for numpy >= 2.4
(`mend_triton_interpreter`). The environment variable `PIPELINE_KERNELS` sets the starting value;
`set_backend` and the context manager `kernel_backend` change it in-process.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import os
from typing import Iterator

import torch

BACKENDS = ("auto", "reference", "triton")
ENVIRONMENT_VARIABLE = "PIPELINE_KERNELS"


def _checked(name: str, where: str) -> str:
    if name not in BACKENDS:
        raise ValueError(
            f"{where}: unknown kernel backend {name!r}; allowed: {', '.join(BACKENDS)}"
        )
    return name


_backend = _checked(
    os.environ.get(ENVIRONMENT_VARIABLE, "auto"), f"environment variable {ENVIRONMENT_VARIABLE}"
)


def set_backend(name: str) -> None:
    """Choose `auto`, `reference` or `triton` for every later kernel call in this process."""
    global _backend
    _backend = _checked(name, "set_backend")


def get_backend() -> str:
    return _backend


@contextlib.contextmanager
def kernel_backend(name: str) -> Iterator[None]:
    """`with kernel_backend("reference"): ...` runs the block with that backend, then restores the
    previous one."""
    previous = get_backend()
    set_backend(name)
    try:
        yield
    finally:
        set_backend(previous)


def use_triton(tensor: torch.Tensor) -> bool:
    """Whether a kernel called on `tensor` runs the Triton kernel under the current backend."""
    if _backend == "reference":
        return False
    if _backend == "triton":
        if importlib.util.find_spec("triton") is None:
            raise RuntimeError(
                f"kernel backend 'triton' was forced ({ENVIRONMENT_VARIABLE} or set_backend) but "
                "Triton "
                "is not installed: pip install triton (CUDA/ROCm builds of torch bring it), or "
                "use "
                f"'auto'/'reference'"
            )
        if not tensor.is_cuda and os.environ.get("TRITON_INTERPRET") == "1":
            mend_triton_interpreter()
        return True
    return tensor.is_cuda  # ROCm tensors are `cuda` tensors too


@functools.cache
def mend_triton_interpreter() -> None:
    """Triton 3.6's interpreter holds a scalar as a 1-element array and turns it into a loop bound
    with int(array), which numpy >= 2.4 refuses ("only 0-dimensional arrays can be converted to
    Python scalars"); its tensors then convert through .item(), which every numpy accepts. Once per
    process; nothing to do for a Triton without that hook."""
    from triton.runtime import interpreter

    original = getattr(interpreter, "_patch_lang_tensor", None)
    if original is None:
        return

    def patch_lang_tensor(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.item()))

    interpreter._patch_lang_tensor = patch_lang_tensor
