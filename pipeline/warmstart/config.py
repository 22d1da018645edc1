"""The typed `warmup` section: how the new embedding rows start and how they are trained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from pipeline.errors import ConfigError
from pipeline.training.config import TrainConfig

# pipeline/warmstart/transfer.py describes them; `focus` and `align` learn from warmup.transfer_bytes of text.
WARMUP_INITS = ("mean", "random", "focus", "align")
# What the rows of tokens that keep the base's id learn from: every sequence, none, or the replayed text's alone.
BASE_ROWS = ("trained", "frozen", "replayed")


def _warmup_training() -> TrainConfig:
    # LTG's NorMistral-11B warm start: constant 1e-4 after a short warm-up, Adam beta2 0.95, weight decay 0.1.
    return TrainConfig(steps=100, global_batch_size=16, micro_batch_size=4, lr=1e-4, schedule="constant",
                       warmup_steps=10, beta2=0.95, weight_decay=0.1, eval_tokens=32768)


@dataclass
class WarmupConfig:
    # New embedding (and untied head) rows; shared tokens always copy theirs. The other new tokens: `mean` of the
    # old pieces that spell them (FVT); `focus`, a sparse mix of shared tokens' rows chosen by fastText vectors
    # learnt on the language's text (FOCUS); `align`, the row of the old token whose co-occurrence embedding on
    # the same text tokenized both ways is nearest (TokAlign); `random`, the baseline they are measured against.
    init: str = "mean"
    # The text `focus` and `align` learn from: this many bytes from the start of the clean stage's training text.
    transfer_bytes: int = 16_000_000
    # What trains besides the input embeddings (pipeline/warmstart/initialise.py): the untied LM head; BLOOM's
    # LayerNorm after the embedding.
    train_head: bool = True
    train_embedding_norm: bool = False
    # The rows of tokens that keep the base's id (an extended base tokenizer's: every base token, special tokens
    # included): `trained` like the added ones; `frozen`, as the base trained them, so that only the added tokens
    # learn; `replayed`, trained only by the sequences of the plan's sources other than the language and the base's
    # own samples (the base's language replayed, fillers), so that the language cannot move them.
    base_rows: str = "trained"
    # The learning rate of the base's rows where they learn (`trained`, `replayed`): their steps are this over
    # warmup.train.lr times the schedule's; null: warmup.train.lr's. With model.base, `trained` at 1e-4 against the
    # added rows' 1e-3 (conf/pretrained_base.yaml says what it measured).
    base_rows_lr: Optional[float] = None
    # warmup.train.steps null: this share of the tokens the mix planned (pretrain then trains the whole plan).
    plan_share: float = 0.1
    train: TrainConfig = field(default_factory=_warmup_training)


def validate_warmup(warmup: WarmupConfig) -> None:
    if warmup.init not in WARMUP_INITS:
        raise ConfigError("warmup.init", warmup.init, WARMUP_INITS)
    if warmup.base_rows not in BASE_ROWS:
        raise ConfigError("warmup.base_rows", warmup.base_rows, BASE_ROWS)
    if warmup.base_rows_lr is not None and not warmup.base_rows_lr > 0:
        raise ConfigError("warmup.base_rows_lr", warmup.base_rows_lr,
                          ["null (warmup.train.lr's)", "a learning rate > 0, e.g. 1e-4"])
    if not 0 < warmup.plan_share <= 1:
        raise ConfigError("warmup.plan_share", warmup.plan_share, ["a share of the mix plan's tokens in (0, 1]"])
    if warmup.transfer_bytes < 1:
        raise ConfigError("warmup.transfer_bytes", warmup.transfer_bytes, ["a number of bytes >= 1, e.g. 16000000"])
