"""Long runs you can trust: checkpoints that prove they are whole, skipped steps that stop a run,
outputs that follow the umask, one run per stage, work folders that can move, and inputs checked on
read (the packed Norwegian sample). The pretrain-specific cases (resuming with another budget, NaN
weights) are in tests/stages/test_pretrain.py."""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from pipeline.tensor_files import save_tensors
from pipeline.training.checkpoint_files import (
    FILES_KEY,
    STATE_FILE,
    checkpoint_dir,
    checkpoints,
    checksum_problem,
    file_entry,
    size_problem,
)
from pipeline.training.train_config import TrainConfig
from pipeline.training.loop import RunState
from tests.conftest import CHAIN_OPTIONS, cli_env, marker, run_cli

PRETRAIN = (
    "stage=pretrain",
    *CHAIN_OPTIONS,
    "model.num_layers=2",
    "model.max_seq_len=128",
    "init=scratch",
    "train.steps=2",
)


def test_scattered_skipped_steps_stop_a_run_past_the_configured_fraction():
    train = TrainConfig(max_bad_steps=3, max_skipped_fraction=0.2, skipped_window=10)
    run = RunState()
    stops = []
    for step in range(1, 31):
        run.step = step
        stops.append(
            run.count_step(skipped=step % 5 == 0, train=train)
        )  # 2 of any 10: at the limit, not past it
    assert stops == [None] * 30 and run.skipped_steps == 6
    run = RunState()
    for step in range(1, 12):
        run.step = step
        stop = run.count_step(skipped=step % 3 != 0, train=train)  # two of every three skipped
        if stop is not None:
            break
    assert step == 4 and "3 of the last 10 steps" in stop
    assert (
        RunState(**json.loads(json.dumps(run.as_dict()))) == run
    )  # it travels in a checkpoint's state.json


def test_safetensors_outputs_follow_the_umask(tmp_path):
    previous = os.umask(0o022)
    try:
        save_tensors({"w": torch.zeros(2)}, tmp_path / "a.safetensors")
        os.umask(0o027)
        save_tensors({"w": torch.zeros(2)}, tmp_path / "b.safetensors")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "a.safetensors").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "b.safetensors").stat().st_mode) == 0o640


def _checkpoint(root, step: int) -> None:
    folder = checkpoint_dir(root, step)
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(4096))
    (folder / "optim.json").write_text("{}")
    files = {name: file_entry(folder / name) for name in ("model.safetensors", "optim.json")}
    (folder / STATE_FILE).write_text(json.dumps({"step": step, FILES_KEY: files}))


def test_a_checkpoint_verifies_only_with_every_file_whole(tmp_path):
    for step in (4, 8):
        _checkpoint(tmp_path, step)
    (tmp_path / "step-00000012").mkdir()  # cut short before its state.json: not a checkpoint
    assert checkpoints(tmp_path) == [checkpoint_dir(tmp_path, 8), checkpoint_dir(tmp_path, 4)]
    newest = checkpoint_dir(tmp_path, 8)
    assert (
        size_problem(newest) is None
        and checksum_problem(newest, ["model.safetensors", "optim.json"]) is None
    )
    data = (newest / "model.safetensors").read_bytes()
    (newest / "model.safetensors").write_bytes(data[:100])
    assert size_problem(newest) == "model.safetensors has 100 bytes, 4,096 were written"
    (newest / "model.safetensors").write_bytes(bytes([data[0] ^ 1]) + data[1:])
    assert size_problem(newest) is None
    assert checksum_problem(newest, ["model.safetensors"]) == (
        "model.safetensors does not match the checksum written with it"
    )
    (newest / STATE_FILE).write_text('{"step": 8, "fil')
    assert "cannot be read" in size_problem(newest)


@pytest.fixture()
def copied(nob_packed, tmp_path):
    """A copy of the packed work folder (clean, mix, tokenizer, pack), to damage freely."""
    work = tmp_path / "work"
    shutil.copytree(
        nob_packed / "work" / "nob",
        work / "nob",
        ignore=shutil.ignore_patterns("*pretrain*", "*warmup*", "*evaluate*", "logs"),
    )
    return tmp_path


def test_acceptance_a_copied_work_folder_is_up_to_date(copied, nob_packed, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    subprocess.run(["cp", "-r", str(copied / "work" / "nob"), str(elsewhere / "nob")], check=True)
    result = run_cli("stage=pack", *CHAIN_OPTIONS, f"work_dir={elsewhere}", cwd=tmp_path)
    assert "Skipping pack for nob: it is up to date" in result.stderr
    # An absolute work_dir is the same folder as the relative one: the English source's path does
    # not count.
    result = run_cli("stage=mix", *CHAIN_OPTIONS, f"work_dir={nob_packed / 'work'}", cwd=tmp_path)
    assert "Skipping mix for nob: it is up to date" in result.stderr


def test_acceptance_a_second_run_of_a_running_stage_is_refused_and_the_first_is_unharmed(
    copied, nob_packed
):
    mix = copied / "work" / "nob" / "mix"
    shutil.rmtree(mix)
    first = subprocess.Popen(
        [sys.executable, "-m", "pipeline", "stage=mix", *CHAIN_OPTIONS],
        cwd=copied,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.time() + 300
    while not list(
        mix.parent.glob(".mix.partial-*")
    ):  # the partial folder exists: the lock is held
        assert time.time() < deadline and first.poll() is None, (
            first.stderr.read() if first.poll() else "slow"
        )
        time.sleep(0.05)
    os.killpg(first.pid, signal.SIGSTOP)  # the first run holds the lock as long as it likes
    try:
        began = time.time()
        second = run_cli("stage=mix", *CHAIN_OPTIONS, cwd=copied, check=False)
        waited = time.time() - began
    finally:
        os.killpg(first.pid, signal.SIGCONT)
    assert second.returncode == 1 and "stage mix for nob is already running" in second.stderr
    assert f"pid {first.pid}" in second.stderr and waited < 120
    _, log = first.communicate(timeout=600)  # reading its log, so that a full pipe never blocks it
    assert first.returncode == 0, log[-3000:]
    lone = nob_packed / "work" / "nob" / "mix"
    assert (mix / "plan.json").read_bytes() == (lone / "plan.json").read_bytes()
    assert (
        marker(copied / "work", "nob", "mix")["metrics"]
        == marker(nob_packed / "work", "nob", "mix")["metrics"]
    )


def _other_tokenizer(path) -> None:
    """A valid tokenizer.json with another vocabulary (512 tokens instead of the pack's 2048)."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<unk>", "<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(["Det var en gang en konge som hadde tre døtre."] * 50, trainer)
    tokenizer.save(str(path))


@pytest.mark.parametrize(
    "damage, message",
    [
        ("truncate tokenizer/tokenizer.json", "written by the tokenizer stage, is damaged"),
        ("truncate pack/packed.json", "written by the pack stage, is damaged"),
        ("replace tokenizer/tokenizer.json", "is not the one the data in"),
    ],
)
def test_acceptance_damaged_or_swapped_inputs_fail_before_training_naming_the_file(
    copied, damage, message
):
    action, name = damage.split()
    path = copied / "work" / "nob" / name
    if action == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        _other_tokenizer(path)
    result = run_cli(*PRETRAIN, cwd=copied, check=False)
    assert result.returncode == 1 and message in result.stderr and str(path) in result.stderr, (
        result.stderr[-3000:]
    )
    partial = next((copied / "work" / "nob").glob(".pretrain.partial-*"))
    assert (
        not (partial / "heldout.npz").exists() and not (partial / "metrics.jsonl").exists()
    )  # no engine started
