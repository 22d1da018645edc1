"""The typed `parallel` section: tensor x pipeline x data parallelism (torch-free).

Whether a model can be cut into `parallel.tp` tensor-parallel shards; torch-free, so that a config
check can use it before any rank starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.errors import ConfigError
from pipeline.model.model_config import ModelConfig, uneven_for_tensor_parallel


@dataclass
class ParallelConfig:
    # Tensor x pipeline x data parallelism; the ranks started are tp * pp * dp.
    tp: int = 1
    pp: int = 1
    dp: int = 1
    # With tp > 1: norms, residuals and the activations between pipeline stages on a tp-th of the
    # sequence each, all-gather and reduce-scatter instead of all-reduce
    # (pipeline/parallel/tensor_parallel.py). The sequence length must be a multiple of tp.
    sequence_parallel: bool = False
    # Seconds a collective of the training ranks may wait for the others; past it, the rank fails
    # with an error that names it and the operation (pipeline/parallel/ranks.py), instead of the job
    # hanging.
    collective_timeout_s: int = 600

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp


def validate_parallel(parallel: ParallelConfig) -> None:
    for key in ("tp", "pp", "dp"):
        if getattr(parallel, key) < 1:
            raise ConfigError(f"parallel.{key}", getattr(parallel, key), ["an integer >= 1"])
    if parallel.collective_timeout_s < 1:
        raise ConfigError(
            "parallel.collective_timeout_s",
            parallel.collective_timeout_s,
            [
                "seconds >= 1 that a collective may wait for the other ranks (default 600; raise "
                "it "
                "when a rank's checkpoint save or held-out scoring makes the others wait longer)"
            ],
        )


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """Refuse a model whose query heads, key/value heads or feed-forward width do not split into
    `tp` equal parts."""
    uneven = uneven_for_tensor_parallel(model, tp)
    if uneven:
        key = uneven[0]
        value = getattr(model, key)
        why = (
            " (multi-query attention has a single key/value head)"
            if key == "num_kv_heads" and value == 1
            else ""
        )
        raise ConfigError(
            f"model.{key}",
            value,
            [
                f"a multiple of parallel.tp={tp}: tensor parallelism gives each rank an equal "
                f"share of it{why}; "
                f"choose a parallel.tp that divides model.{key}={value}"
            ],
        )
