"""A pretrain run that continues another (`init=continue:<run>`): the other run's final training
state it starts from, and what must stay the same for that state to carry over.

The continued run restores the other run's weights, optimizer state (fp32 master weights, Adam's
moments and step counts) and data position (the sampler's step), then trains on a schedule of its
own (pipeline/training/job.py: `planned`, `schedule_start`): its steps and tokens count on from the
other run's, so that the two loss curves join. The optimizer and the data stream carry over only
with the same model shape, the same data stream (the sampler's seed, sequence length and global
batch) and the same pack; everything else (learning rate, schedule, its length, weight decay ...)
may change.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipeline.config_keys import differences, matches_any

# The keys of the pretrain config that the continued run keeps: the model's shape and the data
# stream (pipeline/packing/sampler.py: what its state belongs to).
KEPT_KEYS = ("model", "train.seed", "train.global_batch_size", "train.seq_len")


@dataclass(frozen=True)
class ContinuedRun:
    """The finished pretrain output of the run that a run continues."""

    run: str
    folder: Path
    # The folder of its final training state (final_state/, which holds the checkpoint of its
    # last step).
    state: Path
    marker: dict

    @property
    def step(self) -> int:
        return self.marker["metrics"]["steps"]

    @property
    def lineage(self) -> dict:
        """What the continued run's marker records of where it started."""
        return {
            "run": self.run,
            "step": self.step,
            "tokens": self.marker["metrics"]["tokens"],
            "config_hash": self.marker["config_hash"],
        }


def carry_over_problems(source: ContinuedRun, config: dict, pack_hash: str) -> list[str]:
    """Why `source`'s final state cannot carry over to a run of the hashed pretrain `config` that
    trains on the pack of hash `pack_hash`: the kept keys that differ, and another pack."""
    changed = differences(source.marker.get("config"), config)
    problems = [
        f"{key} {old} -> {new}"
        for key, (old, new) in changed.items()
        if matches_any(key, KEPT_KEYS)
    ]
    trained_on = source.marker.get("inputs", {}).get("pack", {}).get("config_hash")
    if trained_on != pack_hash:
        problems.append(
            f"the pack: run {source.run} trained on the pack of config hash {trained_on}, this "
            f"run reads the one of hash {pack_hash} (give it run {source.run}'s mix, tokenizer "
            "and pack settings)"
        )
    return problems
