"""What a training stage's ranks do: a typed job that the launching process writes and every rank
reads.

The stage (warmup, pretrain) decides what to train and where everything is; the ranks
(pipeline/training/rank.py) only read the job, so they never need the whole pipeline config nor an
import of the stage.

The files of a training stage's work folder, shared by the launching process and the ranks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from omegaconf import OmegaConf

from pipeline.errors import ConfigError
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.training.train_config import TrainConfig

JOB_FILE = "job.yaml"


# The embedding and the untied LM head: the matrices with a row per token.
VOCABULARY_MATRICES = ("embedding.tokens.weight", "head.weight")


@dataclass
class TrainingJob:
    stage: str  # for messages: warmup or pretrain
    # The stage's work folder: the starting model in init/, heldout.npz; the ranks write
    # checkpoints/, metrics.jsonl, tensorboard/, the trained model in checkpoint/ and
    # train_result.json there.
    folder: str
    # The pack stage's output, which the sampler reads.
    pack: str
    seq_len: int
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    kernels: str = "auto"
    # Name prefixes of the parameters that train (warmup: the embeddings and the head); null: all of
    # them.
    trainable: Optional[List[str]] = None
    # The vocabulary rows below this id of the trained VOCABULARY_MATRICES (warmup: the base's own
    # rows) take optimizer steps `leading_rows_step` times the ones the learning rate gives
    # (warmup.base_rows_lr / warmup.train.lr); 0: they stay as they are (warmup.base_rows=frozen).
    leading_rows: int = 0
    leading_rows_step: float = 1.0
    # `auto`: continue from the newest checkpoint in checkpoints/ and write new ones (pretrain);
    # `never`: start again; null: no checkpoints (warmup, which is short, starts again).
    resume: Optional[str] = None

    def trains(self, name: str) -> bool:
        return self.trainable is None or name.startswith(tuple(self.trainable))


WARMUP_SHARE = 0.02


def planned(
    train: TrainConfig,
    seq_len: int,
    plan_tokens: int,
    pack: str,
    prefix: str = "train",
    share: float = 1.0,
) -> TrainConfig:
    """The section with its step budget fixed by the mix plan: `steps` null trains `share` of one
    pass of the pack (all of it: the tokens the plan allows, every source within its epoch cap);
    more steps than one pass is refused with the figures, since it would repeat the data beyond
    mix.max_epochs. `warmup_steps` null becomes WARMUP_SHARE of the steps."""
    per_step = train.global_batch_size * seq_len
    fits = plan_tokens // per_step
    if fits < 1:
        raise ConfigError(
            f"{prefix}.global_batch_size",
            train.global_batch_size,
            [
                f"at most {max(1, plan_tokens // seq_len):,} sequences of {seq_len:,} tokens: the "
                f"mix plan of {pack} "
                f"holds only {plan_tokens:,} tokens (raise mix.tokens, or give the language more "
                "text)"
            ],
        )
    steps = max(1, round(share * fits)) if train.steps is None else train.steps
    if steps > fits:
        raise ConfigError(
            f"{prefix}.steps",
            train.steps,
            [
                f"at most {fits:,}: {train.steps:,} steps x {train.global_batch_size} sequences x "
                f"{seq_len:,} tokens = "
                f"{train.steps * per_step:,} tokens, more than the {plan_tokens:,} tokens the mix "
                f"planned ({pack}), so "
                f"the data would be repeated beyond mix.max_epochs",
                "null (one pass of the plan)",
                "more steps after raising the plan itself: mix.tokens=<tokens> or "
                "mix.max_epochs=<epochs>, then stage=mix "
                "and stage=pack again",
            ],
        )
    warmup = (
        train.warmup_steps
        if train.warmup_steps is not None
        else max(1, round(WARMUP_SHARE * steps))
    )
    return dataclasses.replace(train, steps=steps, warmup_steps=warmup)


def planned_job(
    stage: str,
    folder: Path,
    train: TrainConfig,
    *,
    micro_batch_size: int,
    seq_len: int,
    pack: Path,
    pass_tokens: int,
    parallel: ParallelConfig,
    kernels: str,
    prefix: str = "train",
    share: float = 1.0,
    trainable: Optional[List[str]] = None,
    resume: Optional[str] = None,
) -> TrainingJob:
    """The ranks' job: the `train` section (`prefix` in messages) with the micro-batch that fits and
    the step budget the mix plan allows (`planned`); the one place the section is completed before
    the ranks read it."""
    train = planned(
        dataclasses.replace(train, micro_batch_size=micro_batch_size),
        seq_len,
        pass_tokens,
        str(pack),
        prefix=prefix,
        share=share,
    )
    return TrainingJob(
        stage=stage,
        folder=str(folder),
        pack=str(pack),
        seq_len=seq_len,
        train=train,
        parallel=parallel,
        kernels=kernels,
        trainable=trainable,
        resume=resume,
    )


def write_job(job: TrainingJob) -> Path:
    path = Path(job.folder) / JOB_FILE
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(job)), encoding="utf-8")
    return path


def read_job(path: Path) -> TrainingJob:
    return OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(TrainingJob), OmegaConf.load(path))
    )


INIT = "init"  # the starting model (single-model names), written before the ranks start
HELDOUT_FILE = "heldout.npz"  # the held-out rows every rank scores
CHECKPOINTS = "checkpoints"  # resumable training states (pretrain)
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "train_result.json"
TRAINED = (
    "checkpoint"  # the trained model as a pipeline checkpoint (what pretrain's init=warmup reads)
)
EXPORT = "hf"  # the trained model as a transformers folder
# What a training stage's folder holds only while it runs: removed once its marker is written
# (Stage.scratch).
WHILE_TRAINING = (CHECKPOINTS, INIT)
