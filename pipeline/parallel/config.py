"""The typed `parallel` section: tensor x pipeline x data parallelism (torch-free)."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError


@dataclass
class ParallelConfig:
    # Tensor x pipeline x data parallelism; the ranks started are tp * pp * dp.
    tp: int = 1
    pp: int = 1
    dp: int = 1

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def validate_parallel(parallel: ParallelConfig) -> None:
    for key in ("tp", "pp", "dp"):
        if getattr(parallel, key) < 1:
            raise ConfigError(f"parallel.{key}", getattr(parallel, key), ["an integer >= 1"])
