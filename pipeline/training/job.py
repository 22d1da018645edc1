"""What a training stage's ranks do: a typed job that the launching process writes and every rank
reads.

The stage (warmup, pretrain) decides what to train and where everything is; the ranks
(pipeline/training/rank.py) only read the job, so they never need the whole pipeline config nor an
import of the stage.

The files of a training stage's work folder, shared by the launching process and the ranks.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from omegaconf import OmegaConf

from pipeline.errors import ConfigError
from pipeline.parallel.parallel_config import ParallelConfig
from pipeline.training.train_config import TrainConfig

log = logging.getLogger(__name__)

JOB_FILE = "job.yaml"


# The embedding and the untied LM head: the matrices with a row per token.
VOCABULARY_MATRICES = ("embedding.tokens.weight", "head.weight")


@dataclass
class TrainingJob:
    stage: str  # for messages: warmup or pretrain
    # The stage's work folder: the starting model in init/, heldout.npz (and task_rows.npz); the
    # ranks write checkpoints/, metrics.jsonl, tensorboard/, the trained model in checkpoint/ and
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
    # A continued run (pretrain init=continue:<run>): the other run's final training state (a
    # checkpoint folder: weights, optimizer, data position) it starts from while it has no
    # checkpoint of its own. Its steps count on from that state's step, `schedule_start`, where its
    # own learning-rate schedule starts; train.steps is the step it ends at.
    continue_from: Optional[str] = None
    schedule_start: int = 0

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
    start_step: int = 0,
) -> TrainConfig:
    """The section with its step budget fixed by the mix plan: `steps` null trains `share` of one
    pass of the pack (all of it: the tokens the plan allows, every source within its epoch cap);
    more steps than one pass is refused with the figures, since it would repeat the data beyond
    mix.max_epochs. `warmup_steps` null becomes WARMUP_SHARE of the steps.

    A run continued from step `start_step` of another (init=continue:<run>) trains `steps` more
    (null: one more pass) and ends at step start_step + steps, beyond one pass if so asked: training
    longer is what continuing is for, and the data goes on into the plan's next pass, in a new
    order. Its warm-up is none unless given: the optimizer state it starts from is warm."""
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
    if start_step:
        _say_passes(start_step, steps, per_step, plan_tokens, prefix)
    elif steps > fits:
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
    if train.warmup_steps is not None:
        warmup = train.warmup_steps
    else:
        warmup = 0 if start_step else max(1, round(WARMUP_SHARE * steps))
    return dataclasses.replace(train, steps=start_step + steps, warmup_steps=warmup)


def _say_passes(start_step: int, steps: int, per_step: int, plan_tokens: int, prefix: str) -> None:
    """A continued run may go beyond one pass of the plan; it says how far."""
    passes = (start_step + steps) * per_step / plan_tokens
    log.info(
        "%s: continues from step %d for %d more steps, to %.3g passes of the mix plan%s",
        prefix,
        start_step,
        steps,
        passes,
        "; beyond one pass its sources repeat beyond their planned epochs (mix.max_epochs)"
        if passes > 1
        else "",
    )


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
    continue_from: Optional[Path] = None,
    start_step: int = 0,
) -> TrainingJob:
    """The ranks' job: the `train` section (`prefix` in messages) with the micro-batch that fits and
    the step budget the mix plan allows (`planned`); the one place the section is completed before
    the ranks read it. `continue_from`: the final training state, of step `start_step`, of the run
    it continues."""
    train = planned(
        dataclasses.replace(train, micro_batch_size=micro_batch_size),
        seq_len,
        pass_tokens,
        str(pack),
        prefix=prefix,
        share=share,
        start_step=start_step,
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
        continue_from=None if continue_from is None else str(continue_from),
        schedule_start=start_step,
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
# train.eval_tasks: the tasks' rows every rank scores, and the log-likelihood of each of their pairs
# at the end of training (pipeline/training/inloop_tasks.py).
TASK_ROWS_FILE = "task_rows.npz"
TASK_SCORES_FILE = "task_log_likelihoods.npy"
CHECKPOINTS = "checkpoints"  # resumable training states (pretrain)
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "train_result.json"
TRAINED = (
    "checkpoint"  # the trained model as a pipeline checkpoint (what pretrain's init=warmup reads)
)
EXPORT = "hf"  # the trained model as a transformers folder
# The training state of the last step (a checkpoint: weights, optimizer, data position), which a
# finished pretrain keeps for init=continue:<run> (train.keep_final_state).
FINAL_STATE = "final_state"
# What a training stage's folder holds only while it runs: removed once its marker is written
# (Stage.scratch).
WHILE_TRAINING = (CHECKPOINTS, INIT)
