"""A run that continues another (init=continue:<run>): its step budget counts on from the other
run's last step and may go beyond one pass of the plan; its schedule starts where it starts; the
settings its optimizer state and data position need must stay the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ConfigError
from pipeline.training.continuation import ContinuedRun, carry_over_problems
from pipeline.training.job import planned
from pipeline.training.train_config import TrainConfig


def test_a_continued_run_ends_past_its_start_beyond_one_pass_without_a_warm_up():
    # 100,000 planned tokens: 48 steps of 16 x 128 tokens are one pass.
    with pytest.raises(ConfigError, match="at most 48"):
        planned(TrainConfig(steps=60, global_batch_size=16), 128, 100_000, "p")
    continued = planned(
        TrainConfig(steps=60, global_batch_size=16), 128, 100_000, "p", start_step=40
    )
    assert (continued.steps, continued.warmup_steps) == (100, 0)
    one_more_pass = planned(TrainConfig(global_batch_size=16), 128, 100_000, "p", start_step=40)
    assert one_more_pass.steps == 40 + 48
    rewarmed = TrainConfig(steps=8, global_batch_size=16, warmup_steps=3)
    assert planned(rewarmed, 128, 100_000, "p", start_step=40).warmup_steps == 3


def _source(config: dict, pack: str = "p1") -> ContinuedRun:
    marker = {
        "config_hash": "h",
        "config": config,
        "inputs": {"pack": {"config_hash": pack}},
        "metrics": {"steps": 8, "tokens": 4096},
    }
    return ContinuedRun("a", Path("a"), Path("a/final_state"), marker)


def test_only_the_model_the_data_stream_and_the_pack_must_stay():
    before = {
        "model": {"hidden_size": 64},
        "train": {"lr": 1e-3, "seed": 1, "steps": 8},
        "init": "scratch",
    }
    source = _source(before)
    assert source.lineage == {"run": "a", "step": 8, "tokens": 4096, "config_hash": "h"}
    after = {
        "model": {"hidden_size": 64},
        "train": {"lr": 3e-4, "seed": 1, "steps": 20},
        "init": "continue:a",
    }
    assert carry_over_problems(source, after, "p1") == []
    changed = {**after, "model": {"hidden_size": 32}, "train": {**after["train"], "seed": 2}}
    problems = carry_over_problems(source, changed, "p2")
    assert problems[:2] == ["model.hidden_size 64 -> 32", "train.seed 1 -> 2"]
    assert "the pack" in problems[2] and "p1" in problems[2] and "p2" in problems[2]
