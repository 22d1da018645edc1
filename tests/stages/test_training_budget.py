"""The training stages train what the mix planned: with `steps` unset, one pass of the pack (warmup:
its `warmup.plan_share` of it); a request beyond the plan is refused with the figures before any
work."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.errors import ConfigError
from pipeline.model.model_config import ModelConfig, training_seq_len
from pipeline.training.train_config import TrainConfig
from pipeline.training.job import planned
from tests.conftest import CHAIN_OPTIONS, marker, run_cli


def test_unset_steps_train_one_pass_of_the_plan():
    train = planned(TrainConfig(global_batch_size=16), seq_len=128, plan_tokens=100_000, pack="p")
    assert train.steps == 100_000 // (16 * 128) == 48
    assert train.warmup_steps == 1  # 2% of 48, at least 1
    warmup = planned(
        TrainConfig(global_batch_size=16), seq_len=128, plan_tokens=1_000_000, pack="p", share=0.1
    )
    assert warmup.steps == round(0.1 * (1_000_000 // 2048)) and warmup.warmup_steps == 1


def test_given_steps_within_the_plan_are_kept_and_beyond_it_refused():
    kept = planned(TrainConfig(steps=48, global_batch_size=16, warmup_steps=5), 128, 100_000, "p")
    assert (kept.steps, kept.warmup_steps) == (48, 5)
    with pytest.raises(ConfigError) as refused:
        planned(TrainConfig(steps=49, global_batch_size=16), 128, 100_000, "work/nob/pack")
    message = str(refused.value)
    assert "`train.steps`" in message and "at most 48" in message and "100,352 tokens" in message
    assert (
        "100,000 tokens the mix planned (work/nob/pack)" in message and "mix.max_epochs" in message
    )
    with pytest.raises(ConfigError, match="warmup.train.global_batch_size"):
        planned(TrainConfig(global_batch_size=1000), 128, 100_000, "p", prefix="warmup.train")


def test_unset_sequence_length_is_the_context_up_to_2048_whatever_the_window():
    assert training_seq_len(ModelConfig(max_seq_len=256), None) == 256
    assert training_seq_len(ModelConfig(max_seq_len=32768, sliding_window=4096), None) == 2048
    # the model applies the window at any length
    assert training_seq_len(ModelConfig(max_seq_len=32768, sliding_window=1024), None) == 2048
    assert training_seq_len(ModelConfig(max_seq_len=256), 512) == 512


# A plan of 40,960 tokens: the tokenizer, the pack and 10 steps of 4 x 64 tokens (pretrain) take
# seconds.
SMALL_PLAN = (*CHAIN_OPTIONS, "mix.tokens=40960", "tokenizer.vocab_size=512")
# train.steps=null: the demo scale sets a budget of its own.
TINY = (
    "train.steps=null",
    "model.num_layers=1",
    "model.max_seq_len=64",
    "train.global_batch_size=64",
    "train.micro_batch_size=32",
    "train.eval_tokens=256",
    "init=scratch",
)


@pytest.fixture(scope="module")
def small_plan(nob_eng_cleaned, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("small-plan")
    shutil.copytree(nob_eng_cleaned / "work" / "nob", cwd / "work" / "nob")
    for stage in ("mix", "tokenizer", "pack"):
        run_cli(f"stage={stage}", *SMALL_PLAN, cwd=cwd)
    return cwd


def test_pretrain_trains_the_plan_by_default_and_refuses_more(small_plan):
    pass_tokens = json.loads((small_plan / "work" / "nob" / "pack" / "packed.json").read_text())[
        "pass_tokens"
    ]
    refused = run_cli(
        "stage=pretrain", *SMALL_PLAN, *TINY, "train.steps=1000", cwd=small_plan, check=False
    )
    assert refused.returncode == 1 and "`train.steps`: 1000" in refused.stderr
    assert (
        f"{pass_tokens:,} tokens the mix planned" in refused.stderr
        and "mix.tokens=" in refused.stderr
    )
    partial = next((small_plan / "work" / "nob").glob(".pretrain.partial-*"))
    assert [path.name for path in partial.iterdir()] == [
        "_PARTIAL.json"
    ]  # refused before the model is written
    run_cli("stage=pretrain", *SMALL_PLAN, *TINY, cwd=small_plan)
    assert marker(small_plan / "work", "nob", "pretrain")["metrics"]["steps"] == pass_tokens // (
        64 * 64
    )
