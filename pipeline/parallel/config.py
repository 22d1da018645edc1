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
    # With tp > 1: norms, residuals and the activations between pipeline stages on a tp-th of the sequence each,
    # all-gather and reduce-scatter instead of all-reduce (pipeline/parallel/tensor_parallel.py). The sequence
    # length must be a multiple of tp.
    sequence_parallel: bool = False
    # Seconds a collective of the training ranks may wait for the others; past it, the rank fails with an error
    # that names it and the operation (pipeline/parallel/collectives.py), instead of the job hanging.
    collective_timeout_s: int = 600

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def validate_parallel(parallel: ParallelConfig) -> None:
    for key in ("tp", "pp", "dp"):
        if getattr(parallel, key) < 1:
            raise ConfigError(f"parallel.{key}", getattr(parallel, key), ["an integer >= 1"])
    if parallel.collective_timeout_s < 1:
        raise ConfigError("parallel.collective_timeout_s", parallel.collective_timeout_s,
                          ["seconds >= 1 that a collective may wait for the other ranks (default 600; raise it "
                           "when a rank's checkpoint save or held-out scoring makes the others wait longer)"])
