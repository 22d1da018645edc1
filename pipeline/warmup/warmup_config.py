"""The typed `warmup` section: how the new embedding rows start and how they are trained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.training.train_config import TrainConfig

# pipeline/warmup/transfer.py describes them.
WARMUP_INITS = ("mean", "random")
# Whether the rows of tokens that keep the base's id learn.
BASE_ROWS = ("trained", "frozen")


def _warmup_training() -> TrainConfig:
    # The new rows at a constant 1e-3 (docs/own-base-model.md, "Why these defaults"); steps null:
    # warmup.plan_share of the plan.
    return TrainConfig(lr=1e-3, schedule="constant", eval_tokens=32768)


@dataclass
class WarmupConfig:
    # New embedding (and untied head) rows; shared tokens always copy theirs. The other new tokens:
    # `mean` of the old pieces that spell them (FVT); `random`, the baseline it is measured against.
    init: str = "mean"
    # What trains besides the input embeddings (pipeline/warmup/initialise.py): the untied LM head;
    # BLOOM's LayerNorm after the embedding.
    train_head: bool = True
    train_embedding_norm: bool = False
    # The rows of tokens that keep the base's id (an extended base tokenizer's: every base token,
    # special tokens included): `trained` like the added ones; `frozen`, as the base trained them,
    # so that only the added tokens learn.
    base_rows: str = "trained"
    # The learning rate of the base's rows where they learn (`trained`): their steps are this over
    # warmup.train.lr times the schedule's; null: warmup.train.lr's. 1e-4 against the added rows'
    # 1e-3 (docs/own-base-model.md, "Why these defaults").
    base_rows_lr: Optional[float] = 1e-4
    # warmup.train.steps null: this share of the tokens the mix planned (pretrain then trains the
    # whole plan).
    plan_share: float = 0.1
    train: TrainConfig = field(default_factory=_warmup_training)


def validate_warmup(warmup: WarmupConfig) -> None:
    if warmup.init not in WARMUP_INITS:
        raise ConfigError("warmup.init", warmup.init, WARMUP_INITS)
    if warmup.base_rows not in BASE_ROWS:
        raise ConfigError("warmup.base_rows", warmup.base_rows, BASE_ROWS)
    if warmup.base_rows_lr is not None and not warmup.base_rows_lr > 0:
        raise ConfigError(
            "warmup.base_rows_lr",
            warmup.base_rows_lr,
            ["null (warmup.train.lr's)", "a learning rate > 0, e.g. 1e-4"],
        )
    if not 0 < warmup.plan_share <= 1:
        raise ConfigError(
            "warmup.plan_share", warmup.plan_share, ["a share of the mix plan's tokens in (0, 1]"]
        )
