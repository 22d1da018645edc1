"""Whether a model can be cut into `parallel.tp` tensor-parallel shards; torch-free, so that a config check can
use it before any rank starts."""

from __future__ import annotations

from pipeline.errors import ConfigError
from pipeline.model.config import ModelConfig


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """Refuse a model whose query heads, key/value heads or feed-forward width do not split into `tp` equal parts."""
    for key in ("num_heads", "num_kv_heads", "ffn_size"):
        value = getattr(model, key)
        if value % tp:
            why = " (multi-query attention has a single key/value head)" if key == "num_kv_heads" and value == 1 else ""
            raise ConfigError(f"model.{key}", value, [
                f"a multiple of parallel.tp={tp}: tensor parallelism gives each rank an equal share of it{why}; "
                f"choose a parallel.tp that divides model.{key}={value}"])
