"""Stage `pretrain` through the real CLI on the packed Norwegian sample: exact resume after SIGKILL, a clean
stop on SIGTERM, resuming with another data-parallel degree, continuing from warmup, non-finite steps."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import CHAIN_OPTIONS, REPO, marker, run_cli

TINY = ("model.num_layers=2", "model.max_seq_len=128", "train.log_every=1", "train.warmup_steps=2")
SCRATCH = ("stage=pretrain", *CHAIN_OPTIONS, *TINY, "init=scratch", "train.steps=12", "train.checkpoint_every=4")


def metrics(cwd) -> list[dict]:
    folder = cwd / "work" / "nob" / "pretrain"
    if not folder.is_dir():
        folder = next((cwd / "work" / "nob").glob(".pretrain.partial-*"))
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]


def losses_by_step(cwd) -> dict[int, float]:
    """The last loss logged for each step (a resumed run logs the steps after its checkpoint again)."""
    return {entry["step"]: entry["loss"] for entry in metrics(cwd) if "loss" in entry}


def start(cwd, *overrides) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "pipeline", *overrides], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)


def wait_for_step(cwd, step: int, process: subprocess.Popen) -> None:
    deadline = time.time() + 300
    while time.time() < deadline:
        try:
            if max(losses_by_step(cwd), default=0) >= step:
                return
        except (StopIteration, FileNotFoundError):
            pass
        assert process.poll() is None, process.stderr.read()
        time.sleep(0.05)
    raise AssertionError(f"the run did not reach step {step}")


@pytest.fixture()
def fresh(nob_packed):
    """The packed work folder with no pretrain output from an earlier test."""
    for old in (nob_packed / "work" / "nob").glob("*pretrain*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    return nob_packed


@pytest.fixture(scope="module")
def uninterrupted(nob_packed):
    for old in (nob_packed / "work" / "nob").glob("*pretrain*"):
        subprocess.run(["rm", "-rf", str(old)], check=True)
    run_cli(*SCRATCH, cwd=nob_packed)
    result = losses_by_step(nob_packed)
    assert sorted(result) == list(range(1, 13)) and result[12] < result[1]
    logged = [entry for entry in metrics(nob_packed) if "loss" in entry]
    for key in ("lr", "grad_norm", "tokens_per_s", "tflops_per_device", "memory_gib"):
        assert all(entry[key] > 0 for entry in logged), key
    assert all(entry["mfu"] is None for entry in logged)  # no peak for a CPU
    assert list((nob_packed / "work" / "nob" / "pretrain" / "tensorboard").glob("events.out.tfevents.*"))
    return result


def test_activation_checkpointing_changes_memory_not_losses(uninterrupted, fresh):
    run_cli(*SCRATCH, "train.activation_checkpoint_interval=1", cwd=fresh)
    assert losses_by_step(fresh) == pytest.approx(uninterrupted, rel=1e-6)


def test_acceptance_sigkill_then_resume_gives_the_uninterrupted_losses(uninterrupted, fresh):
    process = start(fresh, *SCRATCH)
    wait_for_step(fresh, 6, process)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    checkpoints = partial / "checkpoints"
    assert (checkpoints / "step-00000004" / "state.json").is_file()
    assert not (fresh / "work" / "nob" / "pretrain" / "_SUCCESS.json").exists()
    # What a kill during a checkpoint leaves behind is never resumed from.
    (checkpoints / ".step-00000008.tmp").mkdir(exist_ok=True)
    (checkpoints / "step-00000012").mkdir(exist_ok=True)
    refused = run_cli(*SCRATCH, "parallel.pp=2", cwd=fresh, check=False)
    assert refused.returncode == 1
    assert "parallel.pp=1" in refused.stderr and "resume=never" in refused.stderr
    result = run_cli(*SCRATCH, cwd=fresh)
    assert "Resuming from" in result.stderr and "step-00000004" in result.stderr
    resumed = losses_by_step(fresh)
    for step in range(5, 13):
        assert resumed[step] == uninterrupted[step], f"step {step}"
    assert not (fresh / "work" / "nob" / "pretrain" / "checkpoints").exists()
    assert (fresh / "work" / "nob" / "pretrain" / "hf" / "model.safetensors").is_file()


def test_acceptance_sigterm_checkpoints_and_a_resume_with_two_replicas_continues(uninterrupted, fresh):
    process = start(fresh, *SCRATCH, "train.checkpoint_every=0")
    wait_for_step(fresh, 3, process)
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=120) == 75, process.stderr.read()
    partial = next((fresh / "work" / "nob").glob(".pretrain.partial-*"))
    (saved,) = [path for path in (partial / "checkpoints").iterdir() if (path / "state.json").is_file()]
    stopped = int(saved.name.split("-")[1])
    # Another data-parallel degree, and checkpoints every 4 steps again: neither changes the run's identity.
    result = run_cli(*SCRATCH, "parallel.dp=2", cwd=fresh)
    assert "Resuming from" in result.stderr
    resumed = losses_by_step(fresh)
    for step in range(stopped + 1, 13):
        assert resumed[step] == pytest.approx(uninterrupted[step], rel=1e-5), f"step {step}"
    assert marker(fresh / "work", "nob", "pretrain")["metrics"]["steps"] == 12


def test_non_finite_steps_are_skipped_and_too_many_stop_the_run(fresh):
    # Weights of 1e200 are infinite in float32: every loss is NaN. (Short sequences: NaN arithmetic is slow.)
    result = run_cli(*SCRATCH, "model.init_std=1e200", "train.max_bad_steps=3", "train.seq_len=32",
                     "train.global_batch_size=4", "train.micro_batch_size=4", "train.eval_tokens=1", cwd=fresh,
                     check=False)
    assert result.returncode == 1
    assert "3 steps in a row had a non-finite loss or gradient" in result.stderr
    assert not (fresh / "work" / "nob" / "pretrain" / "_SUCCESS.json").exists()


def test_inside_a_slurm_allocation_the_ranks_start_with_srun(nob_packed, slurm_cluster, tmp_path):
    work = tmp_path / "work"
    shutil.copytree(nob_packed / "work", work, ignore=shutil.ignore_patterns("*pretrain*", "*warmup*"))
    command = shlex.join([sys.executable, "-m", "pipeline", *SCRATCH, "train.steps=3", f"work_dir={work}",
                          "cluster.executor=slurm", "parallel.dp=2"])
    log = tmp_path / "job.log"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--partition={slurm_cluster}", "--ntasks=2", "--cpus-per-task=1",
         f"--chdir={tmp_path}", f"--output={log}", f"--export=ALL,PYTHONPATH={REPO}", f"--wrap={command}"],
        capture_output=True, text=True, check=True)
    job = submitted.stdout.strip()
    deadline = time.time() + 300
    while subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True).stdout.strip():
        assert time.time() < deadline, f"job {job} still queued or running: {log.read_text()[-3000:]}"
        time.sleep(1)
    text = log.read_text()
    assert "Starting 2 ranks: srun --ntasks=2" in text, text[-3000:]
    assert marker(work, "nob", "pretrain")["metrics"]["steps"] == 3


def test_outside_slurm_the_slurm_executor_says_how_to_submit(fresh):
    result = run_cli(*SCRATCH, "cluster.executor=slurm", cwd=fresh, check=False)
    assert result.returncode == 1 and "not in one" in result.stderr and "sbatch --ntasks=1" in result.stderr


@pytest.mark.parametrize("override, message", [
    ("kernels=cuda", "Invalid value for `kernels`: 'cuda'. Allowed: auto, reference, triton"),
    ("train.global_batch_size=30", "a multiple of train.micro_batch_size x parallel.dp = 4 x 1 = 4"),
    ("init=pretrained", "Invalid value for `init`: 'pretrained'. Allowed: warmup, hf, scratch"),
])
def test_bad_training_options_fail_before_any_work(tmp_path, override, message):
    result = run_cli("stage=pretrain", "lang=nob", "train.micro_batch_size=4", override, cwd=tmp_path, check=False)
    assert result.returncode == 1 and message in result.stderr
    assert not list((tmp_path / "work" / "nob").glob("*pretrain*"))
