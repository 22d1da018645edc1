"""What a training stage's ranks do: a typed job that the launching process writes and every rank reads.

The stage (warmup, pretrain) decides what to train and where everything is; the ranks (pipeline/training/rank.py)
only read the job, so they never need the whole pipeline config nor an import of the stage.

The files of a training stage's work folder, shared by the launching process and the ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional

from omegaconf import OmegaConf

from pipeline.parallel.config import ParallelConfig
from pipeline.training.config import TrainConfig

JOB_FILE = "job.yaml"


# The embedding and the untied LM head: the matrices with a row per token.
VOCABULARY_MATRICES = ("embedding.tokens.weight", "head.weight")


@dataclass
class TrainingJob:
    stage: str  # for messages: warmup or pretrain
    # The stage's work folder: the starting model in init/, heldout.npz; the ranks write checkpoints/,
    # metrics.jsonl, tensorboard/, the trained model in checkpoint/ and train_result.json there.
    folder: str
    # The pack stage's output, which the sampler reads.
    pack: str
    seq_len: int
    train: TrainConfig = field(default_factory=TrainConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    kernels: str = "auto"
    # Name prefixes of the parameters that train (warmup: the embeddings and the head); null: all of them.
    trainable: Optional[List[str]] = None
    # The vocabulary rows below this id of the trained VOCABULARY_MATRICES (warmup: the base's own rows) learn only
    # from the sequences of the pack's sources named in `gated_rows_learn_from` (with none, they stay as they are;
    # null: from every sequence, with no gate), by optimizer steps `gated_rows_step` times the ones the learning
    # rate gives (warmup.base_rows_lr / warmup.train.lr).
    gated_rows: int = 0
    gated_rows_learn_from: Optional[List[str]] = field(default_factory=list)
    gated_rows_step: float = 1.0
    # `auto`: continue from the newest checkpoint in checkpoints/ and write new ones (pretrain); `never`: start
    # again; null: no checkpoints (warmup, which is short, starts again).
    resume: Optional[str] = None

    def trains(self, name: str) -> bool:
        return self.trainable is None or name.startswith(tuple(self.trainable))


def write_job(job: TrainingJob) -> Path:
    path = Path(job.folder) / JOB_FILE
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(job)), encoding="utf-8")
    return path


def read_job(path: Path) -> TrainingJob:
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainingJob), OmegaConf.load(path)))


INIT = "init"                  # the starting model (single-model names), written before the ranks start
HELDOUT_FILE = "heldout.npz"   # the held-out rows every rank scores
CHECKPOINTS = "checkpoints"    # resumable training states (pretrain)
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "train_result.json"
TRAINED = "checkpoint"         # the trained model as a pipeline checkpoint (what pretrain's init=warmup reads)
EXPORT = "hf"                  # the trained model as a transformers folder
# What a training stage's folder holds only while it runs: removed once its marker is written (Stage.scratch).
WHILE_TRAINING = (CHECKPOINTS, INIT)
