"""The typed `warmup` section: how the new embedding rows start and how they are trained."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipeline.errors import ConfigError
from pipeline.training.config import TrainConfig

WARMUP_INITS = ("mean", "random")


def _warmup_training() -> TrainConfig:
    # LTG's NorMistral-11B warm start: constant 1e-4 after a short warm-up, Adam beta2 0.95, weight decay 0.1.
    return TrainConfig(steps=100, global_batch_size=16, micro_batch_size=4, lr=1e-4, schedule="constant",
                       warmup_steps=10, beta2=0.95, weight_decay=0.1, eval_tokens=32768)


@dataclass
class WarmupConfig:
    # New embedding rows: `mean` of the old pieces that spell each new token (copies for shared tokens),
    # or `random`, the baseline it is measured against.
    init: str = "mean"
    # Train BLOOM's LayerNorm after the embedding as well (it belongs to the embedding, not the body).
    train_embedding_norm: bool = False
    train: TrainConfig = field(default_factory=_warmup_training)


def validate_warmup(warmup: WarmupConfig) -> None:
    if warmup.init not in WARMUP_INITS:
        raise ConfigError("warmup.init", warmup.init, WARMUP_INITS)
